//! `mha train`: train a next-token predictor, with progress, evaluation, checkpoints and
//! `--resume`.

mod args;
mod distributed;
#[cfg(feature = "fault-injection")]
mod fault;
mod progress;
mod resume;
pub mod signals;

use std::time::Instant;

use anyhow::{bail, Result};
use candle_mha::candle::DType;
use candle_mha_train::data::{DataSource, DataSpec, PrepareJob, DEFAULT_CHUNK_BYTES};
use candle_mha_train::distributed::{rank_prefix, Communicator, GradientBuckets};
use candle_mha_train::models::lora::LoraSpec;
use candle_mha_train::models::NextTokenPredictorConfig;
use candle_mha_train::run_dir::BEST_DIR;
use candle_mha_train::{NewData, NewRun, ResumeRun, RunError, Session, TrainObserver};
use indicatif::{ProgressBar, ProgressStyle};

pub use args::TrainArgs;
use progress::Progress;

use super::prepare::Notices;

/// Passes over the training tokens above which a run says it will mostly memorise them.
const MANY_PASSES: f64 = 10.0;

/// A notice when `steps` of `per_step` tokens read the `train_tokens` many times over (a small
/// corpus: the validation loss then rises after its best), with the steps of one pass.
fn passes_notice(steps: u64, per_step: f64, train_tokens: u64) -> Option<String> {
    let passes = steps as f64 * per_step / train_tokens.max(1) as f64;
    (passes > MANY_PASSES).then(|| {
        let one = (train_tokens as f64 / per_step).ceil().max(1.0);
        format!(
            "note: {steps} steps × {per_step} tokens read the {train_tokens} training tokens about {passes:.0} times over (one pass is about {one} steps): the validation loss may rise after its best; best/ keeps that checkpoint, and --early-stop N ends the run N evaluations after it"
        )
    })
}

/// The options checked before anything is opened, in the CLI's words.
fn check_options(args: &TrainArgs) -> Result<()> {
    if let Some(f) = args.val_fraction {
        if f == 1.0 && args.is_text() {
            bail!("--val-fraction 1: text needs a training part; expected a fraction below 1")
        }
    }
    if args.autocast == Some(true) {
        crate::device::check_autocast(args.dtype, &args.device)?;
    }
    let llama = args.arch.as_deref() == Some("llama");
    if !llama && args.num_kv_heads.is_some() {
        bail!("--num-kv-heads is a llama model's: give --arch llama with it")
    }
    if llama {
        if let Some(p) = args.dropout.or(args.resid_dropout) {
            bail!("--dropout / --resid-dropout {p}: a llama model here has no dropout")
        }
        let base = match args.is_text() {
            true => NextTokenPredictorConfig::for_text(0),
            false => NextTokenPredictorConfig::new(0),
        };
        let heads = args.num_heads.unwrap_or(base.num_heads);
        let embed = args.embed_dim.unwrap_or(base.embed_dim);
        if let Some(kv) = args.num_kv_heads {
            if kv > heads || !heads.is_multiple_of(kv) {
                bail!("--num-kv-heads {kv}: expected a divisor of --num-heads {heads} (each key/value head serves num_heads / num_kv_heads query heads)")
            }
        }
        if !embed.is_multiple_of(heads) || !(embed / heads).is_multiple_of(2) {
            bail!("--embed-dim {embed} and --num-heads {heads}: a llama model needs embed_dim / num_heads a whole, even head dim (rotary embeddings)")
        }
    }
    Ok(())
}

/// What a new run trains on: `--tokens`, `--text` or `--data`, else the synthetic task.
fn new_data(args: &TrainArgs) -> Result<NewData> {
    match DataSource::from_options(args.tokens.as_deref(), &args.text, args.data.as_deref())? {
        Some(DataSource::Tokens(path)) => {
            return Ok(NewData::Spec(DataSpec::Tokens {
                path,
                val_fraction: args.val_fraction(),
                seed: args.seed(),
            }))
        }
        Some(DataSource::Prepared(dir)) => {
            return Ok(NewData::Prepared {
                dir,
                tokenizer: args.tokenizer.clone(),
                val_fraction: args.val_fraction,
                eval_windows: args.eval_windows(),
            })
        }
        Some(DataSource::Text(text)) => {
            let job = PrepareJob {
                text,
                tokens: Vec::new(),
                tokenizer: args.tokenizer.clone(),
                vocab_size: args.bpe_vocab(),
                bpe_sample_mb: args.bpe_sample_mb(),
                val_fraction: args.val_fraction(),
                chunk_bytes: DEFAULT_CHUNK_BYTES,
                skip_unknown: args.skip_unknown,
            };
            return Ok(NewData::Text {
                job,
                eval_windows: args.eval_windows(),
            });
        }
        None => {}
    }
    let (num_keys, num_values, pairs, train_examples) = args.synthetic();
    Ok(NewData::Spec(DataSpec::Synthetic {
        num_keys,
        num_values,
        pairs,
        train_examples,
        val_examples: 1000,
        seed: args.seed(),
    }))
}

/// The data a resumed run is given when it records none (an imported checkpoint): the
/// options' data (text encoded with the run's own tokenizer unless --tokenizer says:
/// [`NewData::encoded_for`]).
fn resume_data(args: &TrainArgs) -> Result<Option<NewData>> {
    if args.tokens.is_none() && args.data.is_none() && args.text.is_empty() {
        return Ok(None);
    }
    new_data(args).map(Some)
}

/// Runs `mha train`: one process, or one rank of a data-parallel run (`mpirun -n N`), which
/// ends every rank when it fails.
pub fn run(args: &TrainArgs) -> Result<()> {
    // Every argument is checked and turned into library values first; then the device is
    // opened (once) and the process group joined.
    let plan = plan(args)?;
    let (device, notice) = distributed::rank_device(&args.device)?;
    let comm = distributed::communicator(args, &device)?;
    let result = run_rank(args, plan, &*comm, device, &notice);
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
struct StopOnly;

impl TrainObserver for StopOnly {
    fn should_stop(&self) -> bool {
        signals::caught().is_some()
    }
}

/// The library's error in the command line's words where it names what to do.
fn in_flags(e: RunError) -> anyhow::Error {
    match e {
        RunError::RunExists { dir } => anyhow::anyhow!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            dir.display()
        ),
        RunError::NoRun { dir } => anyhow::anyhow!(
            "{} has no trainer_state.json to resume from: drop --resume to start a run there",
            dir.display()
        ),
        RunError::StrayFiles { dir, files } => anyhow::anyhow!(
            "{} holds files a run did not write ({}): nothing was changed; choose a new or empty --out, or remove them",
            dir.display(),
            files.join(", ")
        ),
        e => e.into(),
    }
}

/// What `mha train` was asked for, as library values.
enum Plan {
    New(Box<NewRun>),
    Resume(ResumeRun),
}

/// The run `args` ask for, every option checked; nothing is opened yet.
fn plan(args: &TrainArgs) -> Result<Plan> {
    check_options(args)?;
    if args.resume {
        // The run's dtype: a --dtype that contradicts it is listed with the other
        // contradictions once the run is read.
        return Ok(Plan::Resume(ResumeRun {
            steps: args.steps,
            dtype: None,
            verify_data: args.verify,
            memory_limit: crate::bounds::memory_limit(),
            data: resume_data(args)?,
        }));
    }
    let mut run = NewRun::new(new_data(args)?, args.train_config())
        .with_model(Box::new({
            let args = args.clone();
            move |vocab, longest| args.model_config(vocab, longest)
        }))
        .with_dtype(args.dtype.unwrap_or(DType::F32));
    run.max_len = match args.init_from {
        // The checkpoint's context unless a shorter window is asked for.
        Some(_) => args.max_len,
        None => args.max_len(),
    };
    run.init_from = args.init_from.clone();
    run.init_unverified = crate::checkpoint_dir::trust(args.unverified);
    run.lora = args.lora_rank.map(|rank| {
        let d = LoraSpec::default();
        LoraSpec {
            rank,
            alpha: args.lora_alpha.unwrap_or(d.alpha),
            dropout: args.lora_dropout.unwrap_or(d.dropout),
            use_rslora: args.lora_rslora,
            targets: args.lora_targets.clone(),
        }
    });
    run.verify_data = args.verify;
    run.memory_limit = crate::bounds::memory_limit();
    Ok(Plan::New(Box::new(run)))
}

fn run_rank(
    args: &TrainArgs,
    plan: Plan,
    comm: &dyn Communicator,
    device: candle_mha::candle::Device,
    notice: &str,
) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    // Rank 0 reports; the others are silent unless they fail.
    let lead = rank == 0;
    if lead {
        eprintln!("{notice}");
        if let Some(hint) = crate::device::build_hint(&device).filter(|_| !args.quiet) {
            eprintln!("{hint}");
        }
    }
    let mut notices = Notices::new(args.quiet, lead)?;
    let mut session = match plan {
        Plan::Resume(how) => {
            let mut session =
                Session::resume(&args.out, how, &device, comm, &mut notices).map_err(in_flags)?;
            let conflicts = resume::conflicts(
                args,
                &session.spec,
                &session.model,
                &session.trainer,
                &session.data.codec,
            )?;
            if !conflicts.is_empty() {
                bail!(
                    "--resume: {} option(s) contradict the run in {} (its data, tokenizer, model, batch, optimizer and seed are kept; --steps, --eval-every, --save-every, --early-stop and --autocast may change):\n  {}",
                    conflicts.len(),
                    args.out.display(),
                    conflicts.join("\n  ")
                )
            }
            let changes = resume::apply_cadence(args, &mut session.trainer);
            if lead {
                let state = session.trainer.state();
                eprintln!("resuming at step {} of {}", state.step, state.config.steps);
                for change in changes {
                    eprintln!("changed on resume: {change}");
                }
            }
            session
        }
        Plan::New(run) => {
            Session::start(&args.out, *run, &device, comm, &mut notices).map_err(in_flags)?
        }
    };
    if lead {
        let data = &session.data;
        eprintln!(
            "data: {} and {} validation sequences, {} ids, longest {} tokens",
            data.train.describe(),
            data.val.len(),
            data.codec.vocab_size(),
            data.longest
        );
    }
    let cfg = session.model.clone();
    let params: usize = session
        .trainer
        .varmap()
        .all_vars()
        .iter()
        .map(|v| v.elem_count())
        .sum();
    let tc = &session.trainer.state().config;
    let accum = match tc.grad_accum {
        1 => String::new(),
        k => format!(" × {k} accumulated (effective batch {})", k * tc.batch_size),
    };
    if lead {
        eprintln!(
            "model: {} blocks, embed_dim {}, {} heads, context {}, {params} parameters; {} steps of {} sequences{accum}",
            cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.max_len, tc.steps, tc.batch_size
        );
        if let DataSpec::Prepared { train_tokens, .. } = &session.spec {
            let per_step = (tc.batch_size * tc.grad_accum * cfg.max_len) as f64;
            if let Some(line) = passes_notice(tc.steps, per_step, *train_tokens) {
                eprintln!("{line}");
            }
        }
    }
    if lead && world > 1 {
        let buckets = GradientBuckets::new(
            &session.trainer.varmap().all_vars(),
            candle_mha_train::distributed::DEFAULT_BUCKET_BYTES,
        )?;
        eprintln!(
            "data parallel: {world} ranks ({}), each takes its part of every micro-batch of {} sequences (sizes differ by at most 1); {} bytes of gradients all-reduced per step in {} bucket(s)",
            comm.backend(),
            tc.batch_size,
            buckets.bytes(),
            buckets.len()
        );
    }

    // A second Ctrl-C (or SIGTERM) exits at once; the first finishes the step and saves.
    signals::install();
    let total = session.trainer.state().config.steps;
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
    bar.set_position(session.trainer.state().step);
    let mut progress = Progress {
        bar,
        start: Instant::now(),
        tokens: 0,
        quiet,
    };
    let mut silent = StopOnly;
    let observer: &mut dyn TrainObserver = match lead {
        true => &mut progress,
        false => {
            progress.bar.finish_and_clear();
            &mut silent
        }
    };
    #[cfg(feature = "fault-injection")]
    let eval = fault::run(&mut session, comm, observer)?;
    #[cfg(not(feature = "fault-injection"))]
    let eval = session.run(comm, observer)?;
    progress.bar.finish_and_clear();
    let Some(eval) = eval else {
        // Ranks other than 0: rank 0 evaluates, saves and reports.
        return Ok(());
    };
    let state = session.trainer.state();
    let step = state.step;
    if let Some(sig) = signals::caught() {
        if step < total {
            eprintln!(
                "interrupted at step {step} (signal {sig}): checkpoint saved to {}; continue with `mha train --out {} --resume`",
                args.out.display(),
                args.out.display()
            );
        }
    }
    if state.stopped_early {
        eprintln!(
            "stopped early at step {step}: {} evaluations without a new best validation loss",
            state.config.early_stop
        );
    }
    let verdict = match (&session.spec, eval.accuracy >= 0.95) {
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
