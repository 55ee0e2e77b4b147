//! `mha train`: train a next-token predictor, with progress, evaluation, checkpoints and
//! `--resume`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_mha::candle::DType;
use candle_mha::data::{split_point, Codec, EvalSet, TextTokenizer, TokenData, META_FILE};
use candle_mha::device::select_device;
use candle_mha::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha::seeded_var_builder;
use candle_mha::training::{
    Evaluation, StepStats, TrainConfig, TrainObserver, Trainer, BEST_DIR, CONFIG_FILE, STATE_FILE,
};
use candle_nn::VarMap;
use indicatif::{ProgressBar, ProgressStyle};

use super::data_source::{open_prepared, run_data_spec, DataSpec, DEFAULT_EVAL_WINDOWS};
use super::prepare::PrepareJob;

/// Arguments of `mha train`. With no data option it trains on the built-in associative-recall
/// task. Options left out take the defaults of the data's kind (see [`Defaults`]).
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Train on a token file: one sequence per line, whitespace-separated symbols or ids.
    #[arg(long, conflicts_with_all = ["text", "data"])]
    pub tokens: Option<PathBuf>,
    /// Train on text (files, directories, globs): prepared into OUT/data first, as
    /// `mha prepare` would, then trained on as --data.
    #[arg(long, num_args = 1.., conflicts_with = "data")]
    pub text: Vec<PathBuf>,
    /// Train on a data directory written by `mha prepare` (memory-mapped).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A tokenizers `tokenizer.json` for --text (default: train a byte-level BPE); with
    /// --data it must be the data's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Vocabulary size of the BPE trained for --text (at least 260).
    #[arg(long, visible_alias = "vocab-size", default_value_t = 512)]
    pub bpe_vocab: usize,
    /// Megabytes of text the BPE for --text is trained on.
    #[arg(long, default_value_t = 8.0)]
    pub bpe_sample_mb: f64,
    /// Checkpoint directory (model.safetensors, config.json, vocabulary, optimizer, state,
    /// metrics.jsonl, best/).
    #[arg(long, default_value = "runs/mha")]
    pub out: PathBuf,
    /// Continue the run in --out exactly where it stopped.
    #[arg(long)]
    pub resume: bool,
    /// Optimizer steps (with --resume: the new total).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Micro-batches accumulated into one update (effective batch = batch size × this).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Peak learning rate (warmup, then cosine to lr/10).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Warmup steps.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// AdamW weight decay.
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Model width.
    #[arg(long)]
    pub embed_dim: Option<usize>,
    /// Attention heads per block.
    #[arg(long)]
    pub num_heads: Option<usize>,
    /// Transformer blocks.
    #[arg(long)]
    pub num_layers: Option<usize>,
    /// MLP width (default 4 × embed_dim).
    #[arg(long)]
    pub ff_dim: Option<usize>,
    /// Context length (default: the longest sequence of token data; 128 for text).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Attention dropout.
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Dropout on the embeddings and on each block's outputs into the residual stream.
    #[arg(long)]
    pub resid_dropout: Option<f64>,
    /// Evaluate every N steps.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Checkpoint every N steps.
    #[arg(long)]
    pub save_every: Option<u64>,
    /// Stop after N evaluations without a new best validation loss (0 = never).
    #[arg(long, default_value_t = 0)]
    pub early_stop: u64,
    /// Validation windows evaluated at most (text and --data; evenly spread over the tail).
    #[arg(long, default_value_t = DEFAULT_EVAL_WINDOWS)]
    pub eval_windows: usize,
    /// Fraction held out for validation: random sequences of a token file, the tail of text
    /// (default 0.1; with --data, the data's own split).
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// Seed of initialisation, data split, batch order and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Parameter dtype: f32 or f64.
    #[arg(long, default_value = "f32", value_parser = super::parse_dtype)]
    pub dtype: DType,
    /// Synthetic task: number of keys.
    #[arg(long, default_value_t = 16)]
    pub keys: usize,
    /// Synthetic task: number of values.
    #[arg(long, default_value_t = 16)]
    pub values: usize,
    /// Synthetic task: key–value pairs shown per example.
    #[arg(long, default_value_t = 4)]
    pub pairs: usize,
    /// Synthetic task: training examples.
    #[arg(long, default_value_t = 20_000)]
    pub train_examples: usize,
    /// No progress bar (log lines instead).
    #[arg(long)]
    pub quiet: bool,
}

/// The defaults of the options left out, by kind of data: small and fast for the synthetic
/// task and token files; for text, a model and schedule that on a few hundred KB of English
/// ends well below a bigram model's validation loss in a few minutes on 2 cores (README).
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    pub steps: u64,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup: u64,
    pub weight_decay: f64,
    pub embed_dim: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub max_len: Option<usize>,
    pub dropout: f64,
    pub resid_dropout: f64,
    pub eval_every: u64,
    pub save_every: u64,
}

/// Defaults for the synthetic task and token files.
pub const SEQUENCE_DEFAULTS: Defaults = Defaults {
    steps: 1500,
    batch_size: 64,
    lr: 3e-3,
    warmup: 100,
    weight_decay: 0.01,
    embed_dim: 64,
    num_heads: 4,
    num_layers: 2,
    max_len: None,
    dropout: 0.0,
    resid_dropout: 0.0,
    eval_every: 250,
    save_every: 500,
};

/// Defaults for text and prepared data.
pub const TEXT_DEFAULTS: Defaults = Defaults {
    steps: 1200,
    batch_size: 32,
    lr: 2e-3,
    warmup: 100,
    weight_decay: 0.1,
    embed_dim: 128,
    num_heads: 4,
    num_layers: 3,
    max_len: Some(128),
    dropout: 0.1,
    resid_dropout: 0.2,
    eval_every: 100,
    save_every: 500,
};

/// Progress bar, evaluation lines and Ctrl-C.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    tokens: usize,
    stop: Arc<AtomicBool>,
    quiet: bool,
}

impl Progress {
    /// A log line above the bar, or plain when there is no bar (not a terminal, --quiet).
    fn line(&self, text: String) {
        if self.quiet {
            println!("{text}");
        } else {
            self.bar.println(text);
        }
    }
}

impl TrainObserver for Progress {
    fn on_step(&mut self, step: u64, s: &StepStats) {
        self.tokens += s.input_tokens;
        let rate = self.tokens as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_position(step);
        self.bar.set_message(format!(
            "loss {:.4} | lr {:.2e} | {rate:.0} tok/s",
            s.loss, s.lr
        ));
        if self.quiet && step.is_multiple_of(100) {
            println!(
                "step {step}: loss {:.4}, lr {:.2e}, {rate:.0} tok/s",
                s.loss, s.lr
            );
        }
    }
    fn on_eval(&mut self, step: u64, e: &Evaluation) {
        self.line(format!("step {step}: eval {e}"));
    }
    fn on_save(&mut self, step: u64, dir: &std::path::Path) {
        self.line(format!(
            "step {step}: checkpoint saved to {}",
            dir.display()
        ));
    }
    fn on_best(&mut self, step: u64, e: &Evaluation, dir: &std::path::Path) {
        self.line(format!(
            "step {step}: new best validation loss {:.4}, saved to {}",
            e.loss,
            dir.display()
        ));
    }
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Where `mha train --text` prepares its data.
const RUN_DATA_DIR: &str = "data";

/// Prepares `--text` into `OUT/data`, or reuses what an earlier attempt prepared there from
/// the same files (same paths and sizes) when no run was saved yet.
fn prepare_run_text(args: &TrainArgs) -> Result<std::path::PathBuf> {
    let dir = args.out.join(RUN_DATA_DIR);
    let job = PrepareJob {
        text: &args.text,
        tokens: &[],
        tokenizer: args.tokenizer.as_deref(),
        vocab_size: args.bpe_vocab,
        bpe_sample_mb: args.bpe_sample_mb,
        val_fraction: args.val_fraction.unwrap_or(0.1),
        chunk_kb: 1024,
        quiet: args.quiet,
    };
    if dir.join(META_FILE).exists() {
        let data = TokenData::open(&dir)?;
        let files = candle_mha::data::expand_sources(&args.text)?;
        let same = data.meta().sources.len() == files.len()
            && data.meta().sources.iter().zip(&files).all(|(s, f)| {
                s.path == f.display().to_string()
                    && std::fs::metadata(f).is_ok_and(|m| m.len() == s.bytes)
            });
        if !same {
            bail!(
                "{} holds data prepared from other files; remove it or choose another --out",
                dir.display()
            )
        }
        eprintln!("reusing the data prepared in {}", dir.display());
        return Ok(dir);
    }
    let meta = job.run(&dir)?;
    println!("{}", super::prepare::describe(&meta, &dir));
    Ok(dir)
}

/// Runs `mha train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    let (device, notice) = select_device(&args.device)?;
    println!("{notice}");
    if !matches!(args.dtype, DType::F32 | DType::F64) {
        bail!(
            "--dtype {:?}: training runs in f32 or f64 (half precision is for inference)",
            args.dtype
        )
    }
    let resuming = args.resume && args.out.join(STATE_FILE).exists();
    if args.resume && !resuming {
        bail!(
            "--resume: {} has no {STATE_FILE} to resume from",
            args.out.display()
        )
    }
    if let Some(f) = args.val_fraction {
        if !(0.0..=1.0).contains(&f) {
            bail!("--val-fraction {f}: expected a fraction in [0, 1]")
        }
    }
    if args.grad_accum == 0 {
        bail!("--grad-accum 0: expected at least 1 (1 = no accumulation)")
    }
    if args.batch_size == Some(0) {
        bail!("--batch-size 0: expected at least 1")
    }
    if args.eval_windows == 0 {
        bail!("--eval-windows 0: expected at least 1")
    }
    if !args.resume && args.out.join(STATE_FILE).exists() {
        bail!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            args.out.display()
        )
    }
    let text_kind = !args.text.is_empty() || args.data.is_some();
    let d = if text_kind {
        TEXT_DEFAULTS
    } else {
        SEQUENCE_DEFAULTS
    };

    let (spec, model_cfg, codec) = if resuming {
        let spec = run_data_spec(&args.out)?;
        let cfg = NextTokenPredictorConfig::load(args.out.join(CONFIG_FILE))?;
        (spec, Some(cfg), Some(Codec::load_dir(&args.out)?))
    } else {
        let spec = if let Some(p) = &args.tokens {
            DataSpec::Tokens {
                path: p.clone(),
                val_fraction: args.val_fraction.unwrap_or(0.1),
                seed: args.seed,
            }
        } else if text_kind {
            if args.val_fraction == Some(1.0) {
                bail!("--val-fraction 1: text needs a training part; expected a fraction below 1")
            }
            let dir = match &args.data {
                Some(dir) => dir.clone(),
                None => prepare_run_text(args)?,
            };
            let given = args
                .tokenizer
                .as_deref()
                .map(TextTokenizer::load)
                .transpose()?;
            let given = given.map(|t| Codec::Text(Box::new(t)));
            let (data, _) = open_prepared(&dir, given.as_ref(), "--tokenizer")?;
            let n = data.len();
            let train_tokens = match (args.val_fraction, &args.data) {
                (Some(f), Some(_)) => split_point(n, f)?,
                _ => data.meta().train_tokens,
            };
            DataSpec::Prepared {
                dir,
                train_tokens,
                eval_windows: args.eval_windows,
            }
        } else {
            DataSpec::Synthetic {
                num_keys: args.keys,
                num_values: args.values,
                pairs: args.pairs,
                train_examples: args.train_examples,
                val_examples: 1000,
                seed: args.seed,
            }
        };
        (spec, None, None)
    };
    let max_tokens = model_cfg
        .as_ref()
        .map(|c| c.max_len + 1)
        .or(args.max_len.or(d.max_len).map(|m| m + 1));
    let data = spec.load(codec, args.tokenizer.as_deref(), args.bpe_vocab, max_tokens)?;
    println!(
        "data: {} and {} validation sequences, {} ids, longest {} tokens",
        data.train.describe(),
        data.val.len(),
        data.codec.vocab_size(),
        data.longest
    );

    let embed_dim = args.embed_dim.unwrap_or(d.embed_dim);
    let cfg = match model_cfg {
        Some(c) => c,
        None => NextTokenPredictorConfig {
            vocab_size: data.codec.vocab_size(),
            max_len: args
                .max_len
                .or(d.max_len)
                .unwrap_or(data.longest.saturating_sub(1).max(1)),
            embed_dim,
            num_heads: args.num_heads.unwrap_or(d.num_heads),
            num_layers: args.num_layers.unwrap_or(d.num_layers),
            ff_dim: args.ff_dim.unwrap_or(4 * embed_dim),
            dropout: args.dropout.unwrap_or(d.dropout),
            resid_dropout: args.resid_dropout.unwrap_or(d.resid_dropout),
        },
    };
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, args.seed, args.dtype, &device),
    )?;
    let mut trainer = if resuming {
        let t = Trainer::resume(model, varmap, &args.out, args.steps)?;
        println!(
            "resuming at step {} of {}",
            t.state().step,
            t.state().config.steps
        );
        t
    } else {
        let lr = args.lr.unwrap_or(d.lr);
        let tc = TrainConfig {
            steps: args.steps.unwrap_or(d.steps),
            batch_size: args.batch_size.unwrap_or(d.batch_size),
            grad_accum: args.grad_accum,
            early_stop: args.early_stop,
            lr,
            min_lr: lr / 10.0,
            warmup_steps: args.warmup.unwrap_or(d.warmup),
            weight_decay: args.weight_decay.unwrap_or(d.weight_decay),
            clip_norm: args.clip,
            eval_every: args.eval_every.unwrap_or(d.eval_every),
            save_every: args.save_every.unwrap_or(d.save_every),
            seed: args.seed,
            ..TrainConfig::default()
        };
        // Checks everything before anything is written into --out.
        let t = Trainer::new(model, varmap, tc, serde_json::to_value(&spec)?)?;
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        data.codec.save_dir(&args.out)?;
        t
    }
    .with_codec(data.codec.clone());
    let params: usize = trainer
        .varmap()
        .all_vars()
        .iter()
        .map(|v| v.elem_count())
        .sum();
    let tc = &trainer.state().config;
    let accum = match tc.grad_accum {
        1 => String::new(),
        k => format!(" × {k} accumulated (effective batch {})", k * tc.batch_size),
    };
    println!(
        "model: {} blocks, embed_dim {}, {} heads, context {}, {params} parameters; {} steps of {} sequences{accum}",
        cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.max_len, tc.steps, tc.batch_size
    );

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // A second Ctrl-C exits at once; the first finishes the step and saves a checkpoint.
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
    });
    let total = trainer.state().config.steps;
    // Without a terminal (CI, pipes) the bar is hidden: log lines instead.
    let quiet = args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(ProgressStyle::with_template(
        "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
    )?);
    bar.set_position(trainer.state().step);
    let mut progress = Progress {
        bar,
        start: Instant::now(),
        tokens: 0,
        stop: stop.clone(),
        quiet,
    };
    let val = EvalSet {
        data: &data.val,
        text_bytes: data.val_bytes,
    };
    let eval = trainer.run_source(data.train.source(), &val, Some(&args.out), &mut progress)?;
    progress.bar.finish_and_clear();
    let state = trainer.state();
    let step = state.step;
    if stop.load(Ordering::Relaxed) && step < total {
        println!(
            "interrupted at step {step}: checkpoint saved to {}; continue with --resume",
            args.out.display()
        );
    }
    if state.stopped_early {
        println!(
            "stopped early at step {step}: {} evaluations without a new best validation loss",
            state.config.early_stop
        );
    }
    let verdict = match (&spec, eval.accuracy >= 0.95) {
        (DataSpec::Synthetic { .. }, true) => " — the recall task is solved",
        (DataSpec::Synthetic { .. }, false) => {
            " — not solved yet (train longer with --resume --steps N)"
        }
        _ => "",
    };
    println!("final eval (step {step}): {eval}{verdict}");
    println!("latest checkpoint: {} (step {step})", args.out.display());
    if let Some(best) = &state.best {
        println!(
            "best checkpoint: {} (step {}, validation loss {:.4}{})",
            args.out.join(BEST_DIR).display(),
            best.step,
            best.eval.loss,
            best.eval
                .bits_per_byte
                .map(|b| format!(", {b:.4} bits/byte"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
