//! The data-parallel step: this rank's share of a step's global batch ([`StepShard`]) and
//! one optimizer step on it with the gradients summed over the ranks
//! ([`Trainer::train_step_distributed`]).
//!
//! Every rank draws the global batch of step `t` from `(seed, t)`, exactly as one process
//! does, cuts it into the same `grad_accum` micro-batches of `batch_size`, and takes its
//! contiguous part of each micro-batch ([`shard_range`]: sizes differ by at most one). It knows
//! the global number of counted tokens, so it scales its loss by `1 / global tokens`: the sum
//! over the ranks of their gradients is the gradient of the global batch's mean loss, the one
//! a single process computes (up to float rounding). The ranks all-reduce the gradients
//! ([`GradientBuckets`]) and the loss, clip with the global norm and take the same AdamW
//! step, so the weights stay identical on every rank.

use std::time::Instant;

use candle::backprop::GradStore;
use candle::{DType, Device, Result};

use super::state::StepStats;
use super::trainer::{no_position, StepSizes};
use super::Trainer;
use crate::data::{Batch, Example, TrainSource};
use crate::distributed::{shard_range, Communicator, GradientBuckets, DEFAULT_BUCKET_BYTES};
use crate::{RunError, RunResult};

/// One rank's part of a step, and the sizes of the whole global batch (every rank's part).
///
/// PyTorch equivalent: what a `DistributedSampler` hands one DDP rank, with the global token
/// count a `all_reduce` of the local ones would give.
#[derive(Debug)]
pub struct StepShard {
    /// This rank's part of each micro-batch that gives it one example or more: the index of
    /// the micro-batch (`0..grad_accum`), the row of its first sequence in that micro-batch,
    /// and the batch, padded to the whole micro-batch's length (so that its dropout masks are
    /// the whole micro-batch's for these rows).
    pub batches: Vec<(usize, usize, Batch)>,
    /// Target positions counted in the loss in the global batch.
    pub tokens: usize,
    /// Input positions of the global batch (`N × L` summed over its micro-batches).
    pub input_tokens: usize,
    /// Sequences of the global batch.
    pub sequences: usize,
}

impl Trainer {
    /// Rank `rank` of `world`'s part of step `step`: the global batch of
    /// [`Trainer::batches_for_step`], cut into the same micro-batches, of which this rank takes
    /// [`shard_range`] of each. With one rank it holds exactly the batches of
    /// `batches_for_step`.
    pub fn shard_for_step(
        &self,
        train: &dyn TrainSource,
        step: u64,
        rank: usize,
        world: usize,
        device: &Device,
    ) -> Result<StepShard> {
        let cfg = &self.state.config;
        let examples = train.examples(cfg.seed, step, cfg.batch_size * cfg.grad_accum)?;
        let mut shard = StepShard {
            batches: Vec::new(),
            tokens: 0,
            input_tokens: 0,
            sequences: 0,
        };
        for (m, chunk) in examples.chunks(cfg.batch_size).enumerate() {
            shard.tokens += chunk
                .iter()
                .map(|e| e.loss_mask.iter().filter(|&&c| c).count())
                .sum::<usize>();
            let longest = chunk.iter().map(Example::num_predictions).max();
            shard.input_tokens += chunk.len() * longest.unwrap_or(0);
            shard.sequences += chunk.len();
            let range = shard_range(chunk.len(), rank, world)?;
            if !range.is_empty() {
                let first_row = range.start;
                let refs: Vec<&Example> = chunk[range].iter().collect();
                let len = longest.unwrap_or(0);
                let batch = Batch::from_examples_padded_to(&refs, len, device)?;
                shard.batches.push((m, first_row, batch));
            }
        }
        Ok(shard)
    }

    /// One optimizer step of a data-parallel run on this rank's `shard`; every rank of `comm`
    /// calls it with its shard of the same step. The loss and gradients are summed over the
    /// ranks, so every rank takes the step of the global batch and reports its loss. With one
    /// rank it is [`Trainer::train_step_accumulated`], bit for bit.
    ///
    /// Dropout: each rank draws the one-process run's masks for its rows (the micro-batch's
    /// seed, its first row, its padded length: [`NextTokenPredictor::forward_train_rows`]), so
    /// a run with dropout equals the one-process run too, up to float rounding. A non-finite
    /// loss or gradient norm stops every rank with the same error and leaves the weights
    /// unchanged.
    ///
    /// [`NextTokenPredictor::forward_train_rows`]: crate::models::NextTokenPredictor::forward_train_rows
    ///
    /// PyTorch equivalent: a `DistributedDataParallel` step with `no_sync()` over the
    /// micro-batches, the loss scaled by `local tokens / global tokens` instead of DDP's
    /// division by the world size, then `clip_grad_norm_` and `opt.step()`.
    pub fn train_step_distributed(
        &mut self,
        comm: &dyn Communicator,
        shard: &StepShard,
    ) -> RunResult<StepStats> {
        let world = comm.world_size();
        if world == 1 {
            let batches: Vec<Batch> = shard.batches.iter().map(|(_, _, b)| b.clone()).collect();
            return self.train_step_accumulated(&batches);
        }
        let step = self.state.step;
        let lr = self.schedule.lr(step);
        self.optimizer.set_lr(lr);
        let total = shard.tokens;
        if total == 0 {
            return Err(no_position(step));
        }
        let mut grads: Option<GradStore> = None;
        let mut loss_sum = 0f64;
        for (m, first_row, batch) in &shard.batches {
            if batch.num_tokens == 0 {
                continue;
            }
            let weight = batch.num_tokens as f64 / total as f64;
            loss_sum +=
                self.micro_batch_backward(*m, *first_row, batch, Some(weight), &mut grads)?;
        }
        // Every rank learns the global loss before any gradient moves, so a non-finite loss
        // on one rank stops all of them at the same point, with the same message.
        let comm_started = Instant::now();
        let mut loss = [loss_sum];
        comm.all_reduce_sum_f64(
            &mut loss,
            &format!("step {}: all-reduce of the loss", step + 1),
        )?;
        let loss_value = loss[0];
        if !loss_value.is_finite() {
            return Err(RunError::LossNotFinite {
                step,
                loss: loss_value,
                lr,
            });
        }
        let vars = self.optimizer.vars();
        let mut grads = match grads {
            Some(g) => g,
            // A rank without an example this step (a batch smaller than the world) adds
            // zeros: any gradient store does, the buckets fill in the missing gradients.
            None => match vars.first() {
                Some(v) => v.as_tensor().sum_all()?.affine(0.0, 0.0)?.backward()?,
                None => {
                    return Err(
                        candle::Error::Msg("the model has no trainable variable".into()).into(),
                    )
                }
            },
        };
        GradientBuckets::new(&vars, DEFAULT_BUCKET_BYTES)?.all_reduce(
            comm,
            &vars,
            &mut grads,
            step + 1,
        )?;
        let comm_seconds = comm_started.elapsed().as_secs_f64();
        let sizes = StepSizes {
            tokens: total,
            input_tokens: shard.input_tokens,
            sequences: shard.sequences,
        };
        Ok(self.finish_step(&mut grads, lr, loss_value, sizes, comm_seconds)?)
    }
}

impl Trainer {
    /// Checks, before the first step of a data-parallel run, that every rank holds rank 0's
    /// step, schedule, batch, seed and weights (a rank started with other options, or reading
    /// another checkpoint, would silently train something else); errors on the ranks that
    /// differ, naming the first difference. One broadcast of the weights.
    ///
    /// PyTorch equivalent: DDP's construction-time broadcast of rank 0's parameters, turned
    /// into a check.
    pub(super) fn check_replicas(&self, comm: &dyn Communicator) -> Result<()> {
        let cfg = &self.state.config;
        let fields = [
            ("step", self.state.step as f64),
            ("steps", cfg.steps as f64),
            ("batch_size", cfg.batch_size as f64),
            ("grad_accum", cfg.grad_accum as f64),
            ("seed", cfg.seed as f64),
            ("lr", cfg.lr),
        ];
        let mine: Vec<f64> = fields.iter().map(|(_, v)| *v).collect();
        let device = Device::Cpu;
        let root = comm.broadcast(
            &candle::Tensor::new(mine.as_slice(), &device)?,
            0,
            "broadcast of rank 0's run settings",
        )?;
        let root = root.to_vec1::<f64>()?;
        let mut error = None;
        for ((name, v), r) in fields.iter().zip(&root) {
            if v.to_bits() != r.to_bits() && error.is_none() {
                error = Some(format!("its {name} is {v}, rank 0's is {r}"));
            }
        }
        // Name order: the same on every rank (and the optimizer's).
        let mut params: Vec<(String, candle::Var)> = {
            let data = self
                .varmap()
                .data()
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            data.iter().map(|(n, v)| (n.clone(), v.clone())).collect()
        };
        params.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, v) in &params {
            let flat = v.as_tensor().flatten_all()?;
            let theirs = comm.broadcast(&flat, 0, "broadcast of rank 0's weights")?;
            let same = flat
                .to_dtype(DType::F64)?
                .to_vec1::<f64>()?
                .iter()
                .zip(theirs.to_dtype(DType::F64)?.to_vec1::<f64>()?)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same && error.is_none() {
                error = Some(format!("its parameter {name} differs from rank 0's"));
            }
        }
        // Every rank learns whether one differs, so they stop together.
        let mut bad = [f64::from(u8::from(error.is_some()))];
        comm.all_reduce_sum_f64(&mut bad, "all-reduce of the replica check")?;
        match (error, bad[0] > 0.0) {
            (Some(e), _) => candle::bail!(
                "at step {}, {e}: every rank must run with the same options and start from the same checkpoint (a run directory on a file system every rank sees)",
                self.state.step
            ),
            (None, true) => candle::bail!(
                "another rank does not hold rank 0's settings or weights (its own error says which)"
            ),
            (None, false) => Ok(()),
        }
    }
}
