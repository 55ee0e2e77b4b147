//! The arguments of `mha train`, and the run and model configurations they make. Options
//! left out take their defaults from the configurations of the data's kind:
//! [`TrainConfig::default`] and [`NextTokenPredictorConfig::new`] for token sequences (the
//! synthetic task, token files), [`TrainConfig::for_text`] and
//! [`NextTokenPredictorConfig::for_text`] for text and prepared data; `--help` shows them.

use std::fmt::Display;
use std::path::PathBuf;

use candle_mha::candle::DType;
use candle_mha_train::data::PrepareOptions;
use candle_mha_train::models::llama::{LlamaConfig, LlamaFamily};
use candle_mha_train::models::NextTokenPredictorConfig;
use candle_mha_train::TrainConfig;
use clap::builder::{PossibleValuesParser, TypedValueParser};

use candle_mha_train::data::{DEFAULT_BPE_SAMPLE_MB, DEFAULT_BPE_VOCAB, DEFAULT_EVAL_WINDOWS};
use candle_mha_train::data::{MAX_BPE_VOCAB, MIN_BPE_VOCAB};

/// Help text of a run option: `what`, then its default from the configurations (one value,
/// or one per kind of data where they differ).
fn run_default<T: Display + PartialEq>(what: &str, field: impl Fn(&TrainConfig) -> T) -> String {
    by_kind(
        what,
        field(&TrainConfig::default()),
        field(&TrainConfig::for_text()),
    )
}

/// Help text of a model option, as [`run_default`].
fn model_default<T: Display + PartialEq>(
    what: &str,
    field: impl Fn(&NextTokenPredictorConfig) -> T,
) -> String {
    by_kind(
        what,
        field(&NextTokenPredictorConfig::new(0)),
        field(&NextTokenPredictorConfig::for_text(0)),
    )
}

fn by_kind<T: Display + PartialEq>(what: &str, sequences: T, text: T) -> String {
    if sequences == text {
        format!("{what} [default: {sequences}]")
    } else {
        format!("{what} [default: {sequences} for token sequences, {text} for text and --data]")
    }
}

/// Arguments of `mha train`. With no data option it trains on the built-in associative-recall
/// task. Options left out take the defaults of the data's kind (see the module's comment).
#[derive(clap::Args, Clone, Debug)]
pub struct TrainArgs {
    /// Train on a token file: one sequence per line, whitespace-separated symbols or ids.
    #[arg(long, conflicts_with_all = ["text", "data"])]
    pub tokens: Option<PathBuf>,
    /// Train on text (files, directories, globs): prepared into OUT/data first, as
    /// `mha prepare` would, then trained on as --data.
    #[arg(long, num_args = 1.., conflicts_with = "data")]
    pub text: Vec<PathBuf>,
    /// With --text: leave out text the tokenizer cannot encode (counted in a warning) instead
    /// of refusing it.
    #[arg(long)]
    pub skip_unknown: bool,
    /// Train on a data directory written by `mha prepare` (memory-mapped).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A tokenizers `tokenizer.json` for --text (default: train a byte-level BPE); with
    /// --data it must be the data's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Vocabulary size of the BPE trained for --text (at least 260).
    #[arg(long, value_parser = crate::bounds::count(MIN_BPE_VOCAB as u64, MAX_BPE_VOCAB as u64), visible_alias = "vocab-size", help = format!(
        "Vocabulary size of the BPE trained for --text (at least 260) [default: {DEFAULT_BPE_VOCAB}]"
    ))]
    pub bpe_vocab: Option<usize>,
    /// Megabytes of text the BPE for --text is trained on.
    #[arg(long, value_parser = crate::bounds::real(0.001, 1e5), help = format!(
        "Megabytes of text the BPE for --text is trained on [default: {DEFAULT_BPE_SAMPLE_MB}]"
    ))]
    pub bpe_sample_mb: Option<f64>,
    /// Checkpoint directory (model.safetensors, config.json, vocabulary, optimizer, state,
    /// metrics.jsonl, best/).
    #[arg(long, default_value = "runs/mha")]
    pub out: PathBuf,
    /// Continue the run in --out exactly where it stopped. Its data, tokenizer, model, batch,
    /// optimizer and seed are the run's: options that contradict them are refused; --steps,
    /// --eval-every, --save-every and --early-stop may change (each change is printed), and
    /// so may --device, --dist, --dist-timeout and --quiet.
    #[arg(long)]
    pub resume: bool,
    /// Start a new run from this checkpoint's model, weights and tokenizer (fine-tuning: a new
    /// optimizer, step 0, the data given here, encoded with the checkpoint's tokenizer;
    /// --max-len: windows shorter than its context).
    #[arg(long, value_name = "CHECKPOINT", conflicts_with_all = [
        "resume", "embed_dim", "num_heads", "num_layers", "ff_dim", "dropout",
        "resid_dropout", "bpe_vocab", "bpe_sample_mb", "arch", "num_kv_heads",
    ])]
    pub init_from: Option<PathBuf>,
    /// With --init-from: read a checkpoint directory that has no checkpoint.json (its files
    /// cannot be checked to be one save; refused without this).
    #[arg(long, requires = "init_from")]
    pub unverified: bool,
    /// With --init-from: train LoRA adapters of this rank on the checkpoint's frozen weights
    /// instead of every weight (PEFT's LoraConfig(r=...)); the run's checkpoints hold the
    /// adapter and its optimizer, and reference the checkpoint by path and hash.
    #[arg(long, requires = "init_from", value_parser = crate::bounds::count(1, candle_mha::nn::MAX_LORA_RANK as u64))]
    pub lora_rank: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / rank [default: 8, PEFT's].
    #[arg(long, requires = "lora_rank", value_parser = crate::bounds::finite)]
    pub lora_alpha: Option<f64>,
    /// Dropout on the LoRA adapters' input [default: 0, PEFT's].
    #[arg(long, requires = "lora_rank", value_parser = crate::bounds::below(0.0, 1.0))]
    pub lora_dropout: Option<f64>,
    /// The Hugging Face module names that get adapters, comma-separated (GPT-2: c_attn,
    /// c_proj, c_fc; Llama family: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    /// down_proj) [default: PEFT's for the family: c_attn; q_proj,v_proj].
    #[arg(long, requires = "lora_rank", value_delimiter = ',')]
    pub lora_targets: Vec<String>,
    /// Scale the LoRA update by alpha / √rank (PEFT's use_rslora).
    #[arg(long, requires = "lora_rank")]
    pub lora_rslora: bool,
    /// Optimizer steps (with --resume: the new total).
    #[arg(long, value_parser = crate::bounds::count_u64(0, crate::bounds::MAX_STEPS), help = run_default("Optimizer steps (with --resume: the new total)", |c| c.steps))]
    pub steps: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_COUNT), help = run_default("Sequences per micro-batch", |c| c.batch_size))]
    pub batch_size: Option<usize>,
    /// Micro-batches accumulated into one update (effective batch = batch size × this).
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_GRAD_ACCUM), help = run_default(
        "Micro-batches accumulated into one update (effective batch = batch size × this)",
        |c| c.grad_accum,
    ))]
    pub grad_accum: Option<usize>,
    /// Peak learning rate (warmup, then cosine to lr/10).
    #[arg(long, value_parser = crate::bounds::real(0.0, f64::MAX), help = run_default("Peak learning rate (warmup, then cosine to lr/10)", |c| c.lr))]
    pub lr: Option<f64>,
    /// Warmup steps.
    #[arg(long, value_parser = crate::bounds::count_u64(0, crate::bounds::MAX_STEPS), help = run_default("Warmup steps", |c| c.warmup_steps))]
    pub warmup: Option<u64>,
    /// AdamW weight decay.
    #[arg(long, value_parser = crate::bounds::real(0.0, 1e3), help = run_default("AdamW weight decay", |c| c.weight_decay))]
    pub weight_decay: Option<f64>,
    /// Gradient-norm clip (0 = off).
    #[arg(long, value_parser = crate::bounds::real(0.0, 1e9), help = run_default("Gradient-norm clip (0 = off)", |c| c.clip_norm))]
    pub clip: Option<f64>,
    /// Model width.
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_DIM), help = model_default("Model width", |c| c.embed_dim))]
    pub embed_dim: Option<usize>,
    /// Attention heads per block.
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_DIM), help = model_default("Attention heads per block", |c| c.num_heads))]
    pub num_heads: Option<usize>,
    /// Transformer blocks.
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_LAYERS), help = model_default("Transformer blocks", |c| c.num_layers))]
    pub num_layers: Option<usize>,
    /// MLP width (default 4 × embed_dim).
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_CONTEXT))]
    pub ff_dim: Option<usize>,
    /// The architecture of a new model: gpt (LayerNorm, learned positions, GELU MLP) or llama
    /// (grouped-query attention, rotary positions, RMSNorm, SwiGLU MLP, head tied to the
    /// embedding, no biases, no dropout; Hugging Face's LlamaForCausalLM, exported with
    /// `mha export --format hf`) [default: gpt].
    #[arg(long, value_parser = ["gpt", "llama"])]
    pub arch: Option<String>,
    /// Key/value heads of a llama model: a divisor of --num-heads, each shared by
    /// num_heads / num_kv_heads query heads [default: --num-heads].
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_DIM))]
    pub num_kv_heads: Option<usize>,
    /// Context length (default: the longest sequence of token data; 128 for text).
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_CONTEXT), help = format!(
        "Context length [default: the longest sequence of token data, {} for text and --data]",
        NextTokenPredictorConfig::for_text(0).max_len
    ))]
    pub max_len: Option<usize>,
    /// Attention dropout.
    #[arg(long, value_parser = crate::bounds::below(0.0, 1.0), help = model_default("Attention dropout", |c| c.dropout))]
    pub dropout: Option<f64>,
    /// Dropout on the embeddings and on each block's outputs into the residual stream.
    #[arg(long, value_parser = crate::bounds::below(0.0, 1.0), help = model_default(
        "Dropout on the embeddings and on each block's outputs into the residual stream",
        |c| c.resid_dropout,
    ))]
    pub resid_dropout: Option<f64>,
    /// Evaluate every N steps.
    #[arg(long, value_parser = crate::bounds::count_u64(0, crate::bounds::MAX_STEPS), help = run_default("Evaluate every N steps", |c| c.eval_every))]
    pub eval_every: Option<u64>,
    /// Checkpoint every N steps.
    #[arg(long, value_parser = crate::bounds::count_u64(0, crate::bounds::MAX_STEPS), help = run_default("Checkpoint every N steps", |c| c.save_every))]
    pub save_every: Option<u64>,
    /// Stop after N evaluations without a new best validation loss (0 = never).
    #[arg(long, value_parser = crate::bounds::count_u64(0, crate::bounds::MAX_STEPS), help = run_default(
        "Stop after N evaluations without a new best validation loss (0 = never)",
        |c| c.early_stop,
    ))]
    pub early_stop: Option<u64>,
    /// Validation windows evaluated at most (text and --data; evenly spread over the tail).
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_COUNT), help = format!(
        "Validation windows evaluated at most (text and --data; evenly spread over the tail) \
         [default: {DEFAULT_EVAL_WINDOWS}]"
    ))]
    pub eval_windows: Option<usize>,
    /// Fraction held out for validation: random sequences of a token file, the tail of text
    /// (with --data: the data's own split unless given).
    #[arg(long, value_parser = crate::bounds::real(0.0, 1.0), help = format!(
        "Fraction held out for validation: random sequences of a token file, the tail of text \
         [default: {}; with --data, the data's own split]",
        PrepareOptions::default().val_fraction
    ))]
    pub val_fraction: Option<f64>,
    /// Seed of initialisation, data split, batch order and dropout.
    #[arg(long, help = run_default(
        "Seed of initialisation, data split, batch order and dropout",
        |c| c.seed,
    ))]
    pub seed: Option<u64>,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = crate::choices::DeviceParser)]
    pub device: String,
    /// Parameter dtype: f32 or f64 [default: f32; with --resume, the run's].
    #[arg(long, value_parser = crate::choices::DtypeParser)]
    pub dtype: Option<DType>,
    /// The steps' matrix products in bf16 with f32 sums, weights and optimizer state f32
    /// (`torch.autocast("cpu", torch.bfloat16)`; CPU, f32): bf16 or off [default: off; with
    /// --resume, the run's, and it may change].
    #[arg(long, value_parser = PossibleValuesParser::new(["bf16", "off"]).map(|s| s == "bf16"))]
    pub autocast: Option<bool>,
    /// Synthetic task: number of keys.
    #[arg(long, value_parser = crate::bounds::count(1, 1_000_000), help = "Synthetic task: number of keys [default: 16]")]
    pub keys: Option<usize>,
    /// Synthetic task: number of values.
    #[arg(long, value_parser = crate::bounds::count(1, 1_000_000), help = "Synthetic task: number of values [default: 16]")]
    pub values: Option<usize>,
    /// Synthetic task: key–value pairs shown per example.
    #[arg(
        long,
        help = "Synthetic task: key–value pairs shown per example [default: 4]"
    )]
    pub pairs: Option<usize>,
    /// Synthetic task: training examples.
    #[arg(long, value_parser = crate::bounds::count(1, crate::bounds::MAX_COUNT), help = "Synthetic task: training examples [default: 20000]")]
    pub train_examples: Option<usize>,
    /// Check the prepared data's tokens.bin against the SHA-256 in its meta.json before
    /// training (ids are always checked against the vocabulary when the data is opened).
    #[arg(long)]
    pub verify: bool,
    /// No progress bar (log lines instead).
    #[arg(long)]
    pub quiet: bool,
    /// Data parallelism: `auto` = MPI when started by `mpirun -n N` (NCCL's all-reduce with
    /// --device cuda and the `nccl` feature), one process otherwise; `single`, `mpi`, `nccl`
    /// force one. The global batch (batch size × grad accum) is split over the ranks.
    #[arg(long, value_enum, default_value_t = Dist::Auto)]
    pub dist: Dist,
    /// Data parallelism: seconds a rank waits in a collective (a gradient all-reduce) for the
    /// others before it ends the whole run (a rank died or hangs; 0 = wait forever).
    #[arg(long, value_parser = crate::bounds::real(0.0, 1e7), default_value_t = 300.0)]
    pub dist_timeout: f64,
}

/// How `mha train` spreads over processes (`--dist`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// Under an MPI launcher: NCCL on GPUs (with the `nccl` feature), MPI otherwise; one
    /// process when not launched.
    Auto,
    /// One process.
    Single,
    /// Data parallelism over MPI.
    Mpi,
    /// Data parallelism with NCCL's all-reduce, one GPU per rank.
    Nccl,
}

impl TrainArgs {
    /// The BPE vocabulary size for --text.
    pub fn bpe_vocab(&self) -> usize {
        self.bpe_vocab.unwrap_or(DEFAULT_BPE_VOCAB)
    }

    /// Megabytes of text the BPE is trained on.
    pub fn bpe_sample_mb(&self) -> f64 {
        self.bpe_sample_mb.unwrap_or(DEFAULT_BPE_SAMPLE_MB)
    }

    /// Validation windows evaluated at most.
    pub fn eval_windows(&self) -> usize {
        self.eval_windows.unwrap_or(DEFAULT_EVAL_WINDOWS)
    }

    /// The synthetic task's keys, values, pairs per example and training examples.
    pub fn synthetic(&self) -> (usize, usize, usize, usize) {
        (
            self.keys.unwrap_or(16),
            self.values.unwrap_or(16),
            self.pairs.unwrap_or(4),
            self.train_examples.unwrap_or(20_000),
        )
    }

    /// Whether the run trains on text or prepared data (rather than token sequences).
    pub fn is_text(&self) -> bool {
        !self.text.is_empty() || self.data.is_some()
    }

    /// The run's configuration: the preset of the data's kind with the options given.
    pub fn train_config(&self) -> TrainConfig {
        let base = if self.is_text() {
            TrainConfig::for_text()
        } else {
            TrainConfig::default()
        };
        let lr = self.lr.unwrap_or(base.lr);
        TrainConfig {
            steps: self.steps.unwrap_or(base.steps),
            batch_size: self.batch_size.unwrap_or(base.batch_size),
            grad_accum: self.grad_accum.unwrap_or(base.grad_accum),
            early_stop: self.early_stop.unwrap_or(base.early_stop),
            lr,
            // The presets decay to a tenth of the peak; so does a peak given here.
            min_lr: lr / 10.0,
            warmup_steps: self.warmup.unwrap_or(base.warmup_steps),
            weight_decay: self.weight_decay.unwrap_or(base.weight_decay),
            clip_norm: self.clip.unwrap_or(base.clip_norm),
            eval_every: self.eval_every.unwrap_or(base.eval_every),
            save_every: self.save_every.unwrap_or(base.save_every),
            seed: self.seed(),
            autocast_bf16: self.autocast.unwrap_or(base.autocast_bf16),
            ..base
        }
    }

    /// The fraction held out for validation (token files, text).
    pub fn val_fraction(&self) -> f64 {
        self.val_fraction
            .unwrap_or(PrepareOptions::default().val_fraction)
    }

    /// The seed of initialisation, data split, batch order and dropout.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or(TrainConfig::default().seed)
    }

    /// The context length asked for, or the text preset's (token data: none, the longest
    /// sequence decides).
    pub fn max_len(&self) -> Option<usize> {
        self.max_len.or_else(|| {
            self.is_text()
                .then(|| NextTokenPredictorConfig::for_text(0).max_len)
        })
    }

    /// The model of a new run on `vocab_size` ids whose longest sequence has `longest`
    /// tokens: the preset of the data's kind with the options given.
    pub fn model_config(&self, vocab_size: usize, longest: usize) -> NextTokenPredictorConfig {
        let base = if self.is_text() {
            NextTokenPredictorConfig::for_text(vocab_size)
        } else {
            NextTokenPredictorConfig::new(vocab_size)
        };
        let embed_dim = self.embed_dim.unwrap_or(base.embed_dim);
        if self.arch.as_deref() == Some("llama") {
            let num_heads = self.num_heads.unwrap_or(base.num_heads);
            let llama = LlamaConfig {
                family: LlamaFamily::Llama,
                vocab_size,
                hidden_size: embed_dim,
                intermediate_size: self.ff_dim.unwrap_or(4 * embed_dim),
                num_layers: self.num_layers.unwrap_or(base.num_layers),
                num_heads,
                num_kv_heads: self.num_kv_heads.unwrap_or(num_heads),
                // Checked (with the rest) when the run starts.
                head_dim: embed_dim / num_heads.max(1),
                max_position_embeddings: self.max_len().unwrap_or(longest.saturating_sub(1).max(1)),
                rms_norm_eps: 1e-5,
                rope_theta: 10000.0,
                rope_scaling: candle_mha_train::candle_mha::nn::RopeScaling::None,
                qkv_bias: false,
                o_bias: false,
                tie_word_embeddings: true,
            };
            return NextTokenPredictorConfig::llama_mirror(&llama, None);
        }
        NextTokenPredictorConfig {
            vocab_size,
            max_len: self.max_len().unwrap_or(longest.saturating_sub(1).max(1)),
            embed_dim,
            num_heads: self.num_heads.unwrap_or(base.num_heads),
            num_layers: self.num_layers.unwrap_or(base.num_layers),
            // The presets' MLPs are 4 × their width; a width given here keeps the ratio.
            ff_dim: self.ff_dim.unwrap_or(4 * embed_dim),
            dropout: self.dropout.unwrap_or(base.dropout),
            resid_dropout: self.resid_dropout.unwrap_or(base.resid_dropout),
            // The output head without a bias, as GPT-2's, nanoGPT's and Llama's: the run
            // exports to Hugging Face (`mha export`); runs made before keep theirs.
            head_bias: Some(false),
            ..base
        }
    }
}
