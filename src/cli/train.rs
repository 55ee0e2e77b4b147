//! `mha train`: train a next-token predictor, with progress, evaluation, checkpoints and
//! `--resume`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_mha::candle::DType;
use candle_mha::data::Codec;
use candle_mha::device::select_device;
use candle_mha::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha::seeded_var_builder;
use candle_mha::training::{
    Evaluation, StepStats, TrainConfig, TrainObserver, Trainer, CONFIG_FILE, STATE_FILE,
};
use candle_nn::VarMap;
use indicatif::{ProgressBar, ProgressStyle};

use super::data_source::DataSpec;

/// Arguments of `mha train`. With no data option it trains on the built-in associative-recall
/// task.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Train on a token file: one sequence per line, whitespace-separated symbols or ids.
    #[arg(long, conflicts_with = "text")]
    pub tokens: Option<PathBuf>,
    /// Train on a text file, tokenized by --tokenizer or by a BPE trained on it.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// A tokenizers `tokenizer.json` for --text (default: train a byte-level BPE).
    #[arg(long, requires = "text")]
    pub tokenizer: Option<PathBuf>,
    /// Vocabulary size of the BPE trained for --text (at least 260).
    #[arg(long, default_value_t = 512)]
    pub bpe_vocab: usize,
    /// Checkpoint directory (model.safetensors, config.json, vocabulary, optimizer, state).
    #[arg(long, default_value = "runs/mha")]
    pub out: PathBuf,
    /// Continue the run in --out exactly where it stopped.
    #[arg(long)]
    pub resume: bool,
    /// Optimizer steps (with --resume: the new total).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Peak learning rate (warmup, then cosine to lr/10).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Warmup steps.
    #[arg(long, default_value_t = 100)]
    pub warmup: u64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub embed_dim: usize,
    /// Attention heads per block.
    #[arg(long, default_value_t = 4)]
    pub num_heads: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub num_layers: usize,
    /// MLP width (default 4 × embed_dim).
    #[arg(long)]
    pub ff_dim: Option<usize>,
    /// Context length (default: the longest sequence of the data; 64 for text).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Attention dropout.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Evaluate every N steps.
    #[arg(long, default_value_t = 250)]
    pub eval_every: u64,
    /// Checkpoint every N steps.
    #[arg(long, default_value_t = 500)]
    pub save_every: u64,
    /// Fraction of the sequences held out for validation (token and text files).
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
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
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
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
    if !(0.0..=1.0).contains(&args.val_fraction) {
        bail!(
            "--val-fraction {}: expected a fraction in [0, 1]",
            args.val_fraction
        )
    }
    if !args.resume && args.out.join(STATE_FILE).exists() {
        bail!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            args.out.display()
        )
    }

    let (spec, model_cfg, codec) = if resuming {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(args.out.join(STATE_FILE))?)?;
        let spec: DataSpec = serde_json::from_value(state["data"].clone())
            .context("the checkpoint's data description")?;
        let cfg = NextTokenPredictorConfig::load(args.out.join(CONFIG_FILE))?;
        (spec, Some(cfg), Some(Codec::load_dir(&args.out)?))
    } else {
        let spec = match (&args.tokens, &args.text) {
            (Some(p), _) => DataSpec::Tokens {
                path: p.clone(),
                val_fraction: args.val_fraction,
                seed: args.seed,
            },
            (_, Some(p)) => DataSpec::Text {
                path: p.clone(),
                val_fraction: args.val_fraction,
                seed: args.seed,
            },
            _ => DataSpec::Synthetic {
                num_keys: args.keys,
                num_values: args.values,
                pairs: args.pairs,
                train_examples: args.train_examples,
                val_examples: 1000,
                seed: args.seed,
            },
        };
        (spec, None, None)
    };
    let max_tokens = model_cfg
        .as_ref()
        .map(|c| c.max_len + 1)
        .or(args.max_len.map(|m| m + 1));
    let data = spec.load(codec, args.tokenizer.as_deref(), args.bpe_vocab, max_tokens)?;
    println!(
        "data: {} training and {} validation sequences, {} ids, longest {} tokens",
        data.train.len(),
        data.val.len(),
        data.codec.vocab_size(),
        data.longest
    );

    let cfg = match model_cfg {
        Some(c) => c,
        None => NextTokenPredictorConfig {
            vocab_size: data.codec.vocab_size(),
            max_len: args
                .max_len
                .unwrap_or(data.longest.saturating_sub(1).max(1)),
            embed_dim: args.embed_dim,
            num_heads: args.num_heads,
            num_layers: args.num_layers,
            ff_dim: args.ff_dim.unwrap_or(4 * args.embed_dim),
            dropout: args.dropout,
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
        let tc = TrainConfig {
            steps: args.steps.unwrap_or(1500),
            batch_size: args.batch_size,
            lr: args.lr,
            min_lr: args.lr / 10.0,
            warmup_steps: args.warmup,
            weight_decay: args.weight_decay,
            clip_norm: args.clip,
            eval_every: args.eval_every,
            save_every: args.save_every,
            seed: args.seed,
            ..TrainConfig::default()
        };
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        data.codec.save_dir(&args.out)?;
        Trainer::new(model, varmap, tc, serde_json::to_value(&spec)?)?
    };
    let params: usize = trainer
        .varmap()
        .all_vars()
        .iter()
        .map(|v| v.elem_count())
        .sum();
    println!(
        "model: {} blocks, embed_dim {}, {} heads, context {}, {params} parameters; {} steps of {} sequences",
        cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.max_len, trainer.state().config.steps, trainer.state().config.batch_size
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
    let eval = trainer.run(&data.train, &data.val, Some(&args.out), &mut progress)?;
    progress.bar.finish_and_clear();
    let step = trainer.state().step;
    if stop.load(Ordering::Relaxed) && step < total {
        println!(
            "interrupted at step {step}: checkpoint saved to {}; continue with --resume",
            args.out.display()
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
    println!("checkpoint: {}", args.out.display());
    Ok(())
}
