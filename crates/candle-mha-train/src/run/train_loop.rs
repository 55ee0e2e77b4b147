//! [`Trainer::run_source`]: the loop of a whole run: steps, periodic evaluation, the best
//! checkpoint, early stop, periodic and final checkpoints, `metrics.jsonl`;
//! [`Trainer::run_distributed`]: the same loop as one rank of a data-parallel run.

use std::path::Path;
use std::time::Instant;

use candle::Result;

use super::metrics::{append_metrics, truncate_metrics, MetricsRecord};
use super::state::{EvalRecord, TrainObserver};
use super::{Evaluation, Trainer};
use crate::data::{Dataset, EvalSet, TrainSource};
use crate::distributed::{Communicator, SingleProcess};
use crate::run_dir::{BEST_DIR, METRICS_FILE};
use crate::{RunError, RunResult};

/// Copies the validation fields of `eval` into a metrics record.
fn fill_eval(record: &mut MetricsRecord, eval: &Evaluation) {
    record.val_loss = Some(eval.loss);
    record.val_perplexity = Some(eval.perplexity);
    record.val_accuracy = Some(eval.accuracy);
    record.val_bits_per_byte = eval.bits_per_byte;
}

/// An error when an evaluation just before a save gave a non-finite loss: the weights have
/// diverged (finite but huge, or NaN) and must not replace the checkpoint in `dir`.
fn diverged(step: u64, eval_loss: Option<f64>, dir: &Path) -> RunResult<()> {
    match eval_loss {
        Some(loss) if !loss.is_finite() => Err(RunError::Diverged {
            step,
            loss,
            dir: dir.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

impl Trainer {
    /// Trains until `config.steps`, evaluating on `val` and checkpointing to `dir` (when
    /// given) as configured, and at the end. Returns the final evaluation. Stops with an error,
    /// leaving the last checkpoint, at a non-finite training loss or when a save follows an
    /// evaluation with a non-finite loss (diverged weights).
    ///
    /// As [`Trainer::run_source`] with a dataset for each side and no bits per byte.
    pub fn run(
        &mut self,
        train: &Dataset,
        val: &Dataset,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> RunResult<Evaluation> {
        let val = EvalSet {
            data: val,
            text_bytes: None,
        };
        self.run_source(train, &val, dir, observer)
    }

    /// Trains on the batches of `train` until `config.steps` or an early stop.
    ///
    /// Every `eval_every` steps it evaluates on `val`; an evaluation with a new lowest loss
    /// is saved into `dir/best/` (a complete checkpoint). With `early_stop = N > 0`, N
    /// evaluations in a row without a new best end the run. Every `save_every` steps and at
    /// the end it saves into `dir`, and every step it appends to `dir/metrics.jsonl`. Returns
    /// the final evaluation (on `val`, or on the training set when `val` is empty, as
    /// [`Trainer::run`] always did). Stops with an error, leaving the last checkpoint, at a
    /// non-finite training loss or when a save follows an evaluation with a non-finite loss.
    pub fn run_source(
        &mut self,
        train: &dyn TrainSource,
        val: &EvalSet,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> RunResult<Evaluation> {
        self.run_distributed(&SingleProcess, train, val, dir, observer)?
            .ok_or_else(|| {
                candle::Error::Msg("a run of one rank ended without its final evaluation".into())
                    .into()
            })
    }

    /// [`Trainer::run_source`] as one rank of a data-parallel run: every rank of `comm` calls
    /// it with the same data, options and checkpoint. Each step trains on this rank's part of
    /// the global batch ([`Trainer::train_step_distributed`]); rank 0 alone evaluates, tracks
    /// the best checkpoint, writes `metrics.jsonl` and saves into `dir`, and the ranks agree
    /// before each step on whether to go on (an early stop decided by rank 0, a stop asked on
    /// any rank). Returns the final evaluation on rank 0, `None` on the others. First checks
    /// that every rank holds rank 0's settings and weights. With [`SingleProcess`] it is
    /// `run_source`.
    ///
    /// PyTorch equivalent: a DDP training script's loop with `if rank == 0:` around
    /// evaluation, logging and `torch.save`.
    pub fn run_distributed(
        &mut self,
        comm: &dyn Communicator,
        train: &dyn TrainSource,
        val: &EvalSet,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> RunResult<Option<Evaluation>> {
        if train.is_empty() {
            return Err(candle::Error::Msg("the training set is empty".into()).into());
        }
        let (rank, world) = (comm.rank(), comm.world_size());
        if world > 1 {
            self.check_replicas(comm)?;
        }
        // Rank 0 writes everything: the other ranks have no directory.
        let lead = rank == 0;
        let dir = dir.filter(|_| lead);
        let device = self.device();
        let cfg = self.state.config.clone();
        let metrics = dir.map(|d| d.join(METRICS_FILE));
        if let (Some(d), Some(m)) = (dir, &metrics) {
            std::fs::create_dir_all(d).map_err(|e| {
                candle::Error::Msg(format!("cannot create run directory {}: {e}", d.display()))
            })?;
            // A resumed run continues the file from its checkpoint's step.
            for warning in truncate_metrics(m, self.state.step)? {
                observer.notice(&warning);
            }
        }
        let has_val = !val.data.is_empty();
        while self.state.step < cfg.steps {
            let mut stop = [
                f64::from(u8::from(self.state.stopped_early)),
                f64::from(u8::from(observer.should_stop())),
            ];
            if world > 1 {
                let what = format!("step {}: all-reduce of the stop flags", self.state.step + 1);
                comm.all_reduce_sum_f64(&mut stop, &what)?;
            }
            if stop[0] > 0.0 {
                self.state.stopped_early = true;
                break;
            }
            if stop[1] > 0.0 {
                break;
            }
            let (stats, seconds) = if world == 1 {
                let batches = self.batches_for_step(train, self.state.step, &device)?;
                let started = Instant::now();
                let stats = self.train_step_accumulated(&batches)?;
                (stats, started.elapsed().as_secs_f64())
            } else {
                let shard = self.shard_for_step(train, self.state.step, rank, world, &device)?;
                let started = Instant::now();
                let stats = self.train_step_distributed(comm, &shard)?;
                (stats, started.elapsed().as_secs_f64())
            };
            let step = self.state.step;
            observer.on_step(step, &stats);
            let mut record = MetricsRecord {
                step,
                train_loss: Some(f64::from(stats.loss)),
                lr: Some(stats.lr),
                grad_norm: Some(stats.grad_norm),
                tokens_per_s: Some(stats.input_tokens as f64 / seconds.max(1e-9)),
                tokens: Some(stats.input_tokens),
                comm_s: (world > 1).then_some(stats.comm_seconds),
                ..Default::default()
            };
            let mut eval_loss = None;
            if lead
                && cfg.eval_every > 0
                && step.is_multiple_of(cfg.eval_every)
                && step < cfg.steps
                && has_val
            {
                let eval = self.evaluate_set(val)?;
                observer.on_eval(step, &eval);
                eval_loss = Some(eval.loss);
                fill_eval(&mut record, &eval);
                self.track_best(&eval, dir, observer)?;
            }
            if let Some(m) = &metrics {
                append_metrics(m, &record)?;
            }
            if let Some(dir) = dir {
                if cfg.save_every > 0 && step.is_multiple_of(cfg.save_every) && step < cfg.steps {
                    diverged(step, eval_loss, dir)?;
                    self.save_with(dir, &mut |p| observer.at_commit_point(dir, p))?;
                    observer.on_save(step, dir);
                }
            }
        }
        if !lead {
            return Ok(None);
        }
        let eval = if has_val {
            self.evaluate_set(val)?
        } else {
            self.evaluate(&*train.fallback_eval(cfg.seed)?)?
        };
        observer.on_eval(self.state.step, &eval);
        if has_val {
            self.track_best(&eval, dir, observer)?;
        }
        if let Some(m) = &metrics {
            let mut record = MetricsRecord {
                step: self.state.step,
                ..Default::default()
            };
            fill_eval(&mut record, &eval);
            append_metrics(m, &record)?;
        }
        if let Some(dir) = dir {
            diverged(self.state.step, Some(eval.loss), dir)?;
            self.save_with(dir, &mut |p| observer.at_commit_point(dir, p))?;
            observer.on_save(self.state.step, dir);
        }
        Ok(Some(eval))
    }

    /// Records `eval` as the best when its loss is the lowest so far (saving `dir/best/`),
    /// and sets `stopped_early` after `early_stop` evaluations without one.
    fn track_best(
        &mut self,
        eval: &Evaluation,
        dir: Option<&Path>,
        observer: &mut dyn TrainObserver,
    ) -> Result<()> {
        let step = self.state.step;
        let improved = eval.loss.is_finite()
            && self
                .state
                .best
                .as_ref()
                .is_none_or(|b| eval.loss < b.eval.loss);
        if improved {
            self.state.best = Some(EvalRecord { step, eval: *eval });
            if let Some(dir) = dir {
                let best = dir.join(BEST_DIR);
                // A link there would have the save write into whatever it points to.
                candle_mha::io::refuse_link(&best)?;
                self.save_with(&best, &mut |p| observer.at_commit_point(&best, p))?;
                observer.on_best(step, eval, &best);
            }
        } else if self.state.config.early_stop > 0 {
            let best_step = self.state.best.as_ref().map_or(0, |b| b.step);
            // Validation evaluations after the best one (the history holds only those when
            // there is a validation set).
            let since = self
                .state
                .evals
                .iter()
                .filter(|e| e.step > best_step)
                .count() as u64;
            if since >= self.state.config.early_stop {
                self.state.stopped_early = true;
            }
        }
        Ok(())
    }
}
