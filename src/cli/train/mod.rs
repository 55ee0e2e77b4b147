//! `mha train`: train a next-token predictor, with progress, evaluation, checkpoints and
//! `--resume`.

mod args;
mod distributed;
mod progress;
mod resume;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_mha::candle::DType;
use candle_mha::data::{
    split_point, Codec, EvalSet, TextTokenizer, TokenData, DEFAULT_CHUNK_BYTES, META_FILE,
};
use candle_mha::device::select_device;
use candle_mha::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha::seeded_var_builder;
use candle_mha::training::distributed::{rank_prefix, Communicator, GradientBuckets};
use candle_mha::training::{Evaluation, TrainObserver, Trainer, BEST_DIR, CONFIG_FILE, STATE_FILE};
use candle_nn::VarMap;
use indicatif::{ProgressBar, ProgressStyle};

pub use args::TrainArgs;
use progress::Progress;

use super::data_source::{open_prepared, run_data_spec, DataSpec};
use super::prepare::PrepareJob;

/// Where `mha train --text` prepares its data.
const RUN_DATA_DIR: &str = "data";

/// Prepares `--text` into `OUT/data`, or reuses what an earlier attempt prepared there from
/// the same files (same paths and sizes) when no run was saved yet. In a data-parallel run
/// rank 0 prepares and the others wait, then reuse it.
fn prepare_run_text(args: &TrainArgs, comm: &dyn Communicator) -> Result<std::path::PathBuf> {
    if comm.world_size() > 1 {
        let prepared = match comm.rank() {
            0 => Some(prepare_run_text(
                args,
                &candle_mha::training::distributed::SingleProcess,
            )?),
            _ => None,
        };
        comm.barrier("barrier after rank 0 prepared --text")?;
        if let Some(dir) = prepared {
            return Ok(dir);
        }
    }
    let dir = args.out.join(RUN_DATA_DIR);
    let job = PrepareJob {
        text: &args.text,
        tokens: &[],
        tokenizer: args.tokenizer.as_deref(),
        vocab_size: args.bpe_vocab(),
        bpe_sample_mb: args.bpe_sample_mb(),
        val_fraction: args.val_fraction(),
        chunk_kb: DEFAULT_CHUNK_BYTES / 1024,
        quiet: args.quiet,
    };
    if dir.join(META_FILE).exists() {
        let data = TokenData::open(&dir)?;
        let files = candle_mha::data::expand_sources(&args.text)?;
        if !resume::same_sources(&data.meta().sources, &files) {
            bail!(
                "{} holds data prepared from other files; remove it or choose another --out",
                dir.display()
            )
        }
        if comm.rank() == 0 {
            eprintln!("reusing the data prepared in {}", dir.display());
        }
        return Ok(dir);
    }
    let meta = job.run(&dir)?;
    eprintln!("{}", super::prepare::describe(&meta, &dir));
    Ok(dir)
}

/// Passes over the training tokens above which a run says it will mostly memorise them.
const MANY_PASSES: f64 = 10.0;

/// A notice when `steps` of `per_step` tokens read the `train_tokens` many times over (a small
/// corpus: the validation loss then rises after its best), with the steps of one pass.
fn passes_notice(steps: u64, per_step: f64, train_tokens: u64) -> Option<String> {
    let passes = steps as f64 * per_step / train_tokens.max(1) as f64;
    (passes > MANY_PASSES).then(|| {
        let one = (train_tokens as f64 / per_step).ceil().max(1.0);
        format!(
            "note: {steps} steps × {per_step} tokens read the {train_tokens} training tokens about {passes:.0} times over: expect the validation loss to rise after its best (best/ keeps it); about {one} steps make one pass, a few passes (--steps {} to {}) suit this much data",
            one as u64 * 2,
            one as u64 * 5
        )
    })
}

/// Runs `mha train`: one process, or one rank of a data-parallel run (`mpirun -n N`), which
/// ends every rank when it fails.
pub fn run(args: &TrainArgs) -> Result<()> {
    let (mut device, mut notice) = select_device(&args.device)?;
    if let Some(spec) = distributed::rank_gpu(&args.device, &device) {
        (device, notice) = select_device(&spec)?;
    }
    let comm = distributed::communicator(args, &device)?;
    let result = run_rank(args, &*comm, device, &notice);
    if let Err(e) = &result {
        if comm.world_size() > 1 {
            // The others would wait for this rank in their next collective: end them all.
            eprintln!(
                "error: {}{e:#}; ending every rank",
                rank_prefix(comm.rank(), comm.world_size())
            );
            comm.abort(1);
        }
    }
    result
}

/// Only `should_stop` of a data-parallel run's ranks other than 0 (rank 0 reports).
struct StopOnly(Arc<AtomicBool>);

impl TrainObserver for StopOnly {
    fn should_stop(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

fn run_rank(
    args: &TrainArgs,
    comm: &dyn Communicator,
    device: candle_mha::candle::Device,
    notice: &str,
) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    // Rank 0 reports; the others are silent unless they fail.
    let lead = rank == 0;
    if lead {
        eprintln!("{notice}");
    }
    if !matches!(args.dtype, DType::F32 | DType::F64) {
        bail!(
            "--dtype {:?}: training runs in f32 or f64 (half precision is for inference)",
            args.dtype
        )
    }
    // One process writes a run directory at a time (rank 0 of a data-parallel run), for the
    // whole run.
    let _lock = match lead {
        true => Some(candle_mha::io::DirLock::acquire(&args.out, "mha train")?),
        false => None,
    };
    // A save a kill interrupted is finished first (or undone), so the checks below and the
    // resume see one checkpoint; temporary files of killed writes are removed.
    if lead {
        candle_mha::io::remove_stale_temps(&args.out);
        candle_mha::io::finish_interrupted_commit(&args.out)?;
        candle_mha::io::finish_interrupted_commit(&args.out.join(BEST_DIR))?;
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
    if args.grad_accum == Some(0) {
        bail!("--grad-accum 0: expected at least 1 (1 = no accumulation)")
    }
    if args.batch_size == Some(0) {
        bail!("--batch-size 0: expected at least 1")
    }
    if args.eval_windows == Some(0) {
        bail!("--eval-windows 0: expected at least 1")
    }
    if !args.resume && args.out.join(STATE_FILE).exists() {
        bail!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            args.out.display()
        )
    }
    let text_kind = args.is_text();

    let (spec, model_cfg, codec) = if resuming {
        let spec = run_data_spec(&args.out)?;
        let cfg = NextTokenPredictorConfig::load(args.out.join(CONFIG_FILE))?;
        (spec, Some(cfg), Some(Codec::load_dir(&args.out)?))
    } else {
        let spec = if let Some(p) = &args.tokens {
            DataSpec::Tokens {
                path: p.clone(),
                val_fraction: args.val_fraction(),
                seed: args.seed(),
            }
        } else if text_kind {
            if args.val_fraction == Some(1.0) {
                bail!("--val-fraction 1: text needs a training part; expected a fraction below 1")
            }
            let dir = match &args.data {
                Some(dir) => dir.clone(),
                None => prepare_run_text(args, comm)?,
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
                eval_windows: args.eval_windows(),
            }
        } else {
            let (num_keys, num_values, pairs, train_examples) = args.synthetic();
            DataSpec::Synthetic {
                num_keys,
                num_values,
                pairs,
                train_examples,
                val_examples: 1000,
                seed: args.seed(),
            }
        };
        (spec, None, None)
    };
    let max_tokens = model_cfg
        .as_ref()
        .map(|c| c.max_len + 1)
        .or(args.max_len().map(|m| m + 1));
    if let (true, DataSpec::Prepared { dir, .. }) = (args.verify && lead, &spec) {
        match TokenData::open(dir)?.verify()? {
            true => eprintln!("verified {}: tokens.bin matches its SHA-256", dir.display()),
            false => eprintln!(
                "{}: no SHA-256 recorded to verify (prepared by an older version)",
                dir.display()
            ),
        }
    }
    let data = spec.load(
        codec,
        args.tokenizer.as_deref(),
        args.bpe_vocab(),
        max_tokens,
    )?;
    if lead {
        eprintln!(
            "data: {} and {} validation sequences, {} ids, longest {} tokens",
            data.train.describe(),
            data.val.len(),
            data.codec.vocab_size(),
            data.longest
        );
    }

    let cfg = match model_cfg {
        Some(c) => c,
        None => args.model_config(data.codec.vocab_size(), data.longest),
    };
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, args.seed(), args.dtype, &device),
    )?;
    let mut trainer = if resuming {
        let mut t = Trainer::resume(model, varmap, &args.out, args.steps)?;
        let conflicts = resume::conflicts(args, &spec, &cfg, &t, &data.codec)?;
        if !conflicts.is_empty() {
            bail!(
                "--resume: {} option(s) contradict the run in {} (its data, tokenizer, model, batch, optimizer and seed are kept; --steps, --eval-every, --save-every and --early-stop may change):\n  {}",
                conflicts.len(),
                args.out.display(),
                conflicts.join("\n  ")
            )
        }
        let changes = resume::apply_cadence(args, &mut t);
        if lead {
            eprintln!(
                "resuming at step {} of {}",
                t.state().step,
                t.state().config.steps
            );
            for change in changes {
                eprintln!("changed on resume: {change}");
            }
        }
        t
    } else {
        let tc = args.train_config();
        // Checks everything before anything is written into --out.
        let t = Trainer::new(model, varmap, tc, serde_json::to_value(&spec)?)?;
        if lead {
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("creating {}", args.out.display()))?;
            data.codec.save_dir(&args.out)?;
        }
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
    if lead {
        eprintln!(
            "model: {} blocks, embed_dim {}, {} heads, context {}, {params} parameters; {} steps of {} sequences{accum}",
            cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.max_len, tc.steps, tc.batch_size
        );
        if let DataSpec::Prepared { train_tokens, .. } = &spec {
            let per_step = (tc.batch_size * tc.grad_accum * cfg.max_len) as f64;
            if let Some(line) = passes_notice(tc.steps, per_step, *train_tokens) {
                eprintln!("{line}");
            }
        }
    }
    if lead && world > 1 {
        let buckets = GradientBuckets::new(
            &trainer.varmap().all_vars(),
            candle_mha::training::distributed::DEFAULT_BUCKET_BYTES,
        )?;
        eprintln!(
            "data parallel: {world} ranks ({}), each takes its part of every micro-batch of {} sequences (sizes differ by at most 1); {} bytes of gradients all-reduced per step in {} bucket(s)",
            comm.backend(),
            tc.batch_size,
            buckets.bytes(),
            buckets.len()
        );
    }

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
    let fault = distributed::Fault::from_env(rank)?;
    let faulty;
    let source = match fault {
        Some(fault) => {
            faulty = distributed::Faulty {
                inner: data.train.source(),
                fault,
            };
            &faulty as &dyn candle_mha::data::TrainSource
        }
        None => data.train.source(),
    };
    let eval: Option<Evaluation> = if lead {
        trainer.run_distributed(comm, source, &val, Some(&args.out), &mut progress)?
    } else {
        progress.bar.finish_and_clear();
        let mut silent = StopOnly(stop.clone());
        trainer.run_distributed(comm, source, &val, Some(&args.out), &mut silent)?
    };
    progress.bar.finish_and_clear();
    let Some(eval) = eval else {
        // Ranks other than 0: rank 0 evaluates, saves and reports.
        return Ok(());
    };
    let state = trainer.state();
    let step = state.step;
    if stop.load(Ordering::Relaxed) && step < total {
        eprintln!(
            "interrupted at step {step}: checkpoint saved to {}; continue with --resume",
            args.out.display()
        );
    }
    if state.stopped_early {
        eprintln!(
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
