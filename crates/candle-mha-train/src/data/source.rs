//! [`TrainSource`]: where a training run's batches come from, and [`EvalSet`]: what it is
//! evaluated on.

use std::borrow::Cow;

use candle::Result;

use super::dataset::Dataset;
use super::example::Example;
use super::token_data::TokenData;
use super::windows::TokenWindows;

/// The examples of each training step, as a function of (seed, step) alone, so that a run
/// resumes exactly.
///
/// PyTorch equivalent: a `DataLoader` with a seeded sampler, or nanoGPT's `get_batch`.
pub trait TrainSource {
    /// The `count` examples of step `step` (`batch_size × grad_accum`; fewer at the end of
    /// an epoch of a finite dataset).
    fn examples(&self, seed: u64, step: u64, count: usize) -> Result<Vec<Example>>;

    /// Whether there is nothing to train on.
    fn is_empty(&self) -> bool;

    /// What to evaluate on when there is no validation set: the whole dataset, or a fixed
    /// sample of training windows.
    fn fallback_eval(&self, seed: u64) -> Result<Cow<'_, Dataset>>;

    /// A line for the log: how much there is to train on.
    fn describe(&self) -> String;

    /// The sequences themselves, when the source is a finite [`Dataset`] (`None` for a
    /// stream).
    fn into_sequences(self: Box<Self>) -> Option<Dataset> {
        None
    }
}

impl TrainSource for Dataset {
    /// Epoch `step / batches_per_epoch` of a seeded permutation, batch `step %
    /// batches_per_epoch` (as [`Dataset::batch`] with `batch_size = count`).
    fn examples(&self, seed: u64, step: u64, count: usize) -> Result<Vec<Example>> {
        let per_epoch = self.num_batches(count).max(1) as u64;
        let order = self.epoch_order(step / per_epoch, seed);
        let start = (step % per_epoch) as usize * count;
        let end = start.saturating_add(count).min(order.len());
        Ok(order[start.min(end)..end]
            .iter()
            .map(|&i| self.examples[i].clone())
            .collect())
    }

    fn is_empty(&self) -> bool {
        Dataset::is_empty(self)
    }

    fn fallback_eval(&self, _seed: u64) -> Result<Cow<'_, Dataset>> {
        Ok(Cow::Borrowed(self))
    }

    fn describe(&self) -> String {
        format!("{} training", self.len())
    }

    fn into_sequences(self: Box<Self>) -> Option<Dataset> {
        Some(*self)
    }
}

/// Random windows of a prepared token stream (see [`TokenWindows::train_offsets`]).
///
/// PyTorch equivalent: nanoGPT's `get_batch("train")`.
#[derive(Debug)]
pub struct WindowSource {
    /// The token stream.
    pub data: TokenData,
    /// The window length and the stream's split.
    pub windows: TokenWindows,
}

impl TrainSource for WindowSource {
    fn examples(&self, seed: u64, step: u64, count: usize) -> Result<Vec<Example>> {
        self.windows.train_examples(&self.data, seed, step, count)
    }

    fn is_empty(&self) -> bool {
        false
    }

    /// 64 training windows drawn as for a step numbered `u64::MAX`.
    fn fallback_eval(&self, seed: u64) -> Result<Cow<'_, Dataset>> {
        let examples = self
            .windows
            .train_examples(&self.data, seed, u64::MAX, 64)?;
        Ok(Cow::Owned(Dataset { examples }))
    }

    fn describe(&self) -> String {
        format!(
            "{} training tokens (random windows of {}: {} offsets)",
            self.windows.train.end - self.windows.train.start,
            self.windows.len,
            self.windows.num_train_offsets()
        )
    }
}

/// A validation set: its examples, and the bytes of text its predicted tokens stand for
/// (for bits per byte; `None` when the data is not text).
///
/// PyTorch equivalent: a validation `DataLoader`.
#[derive(Clone, Copy, Debug)]
pub struct EvalSet<'a> {
    /// The examples (every position counted as each example's loss mask says).
    pub data: &'a Dataset,
    /// UTF-8 bytes of the text of the predicted tokens.
    pub text_bytes: Option<u64>,
}
