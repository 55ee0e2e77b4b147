//! [`TokenWindows`]: fixed-length windows of a token stream, at random offsets for training
//! (a function of the seed and the step, so runs resume exactly) and at fixed offsets for
//! validation.

use std::ops::Range;

use candle::Result;
use rand::Rng;

use super::dataset::Dataset;
use super::example::Example;
use super::token_data::TokenData;
use candle_mha::rng::{derive_seed, rng_from_seed};

/// Consecutive windows of at most `len` (≥ 2) tokens over `range`, each starting where the
/// previous one's inputs end (so every token after the first is predicted once), the last
/// one shorter when `range` does not divide evenly (at least 2 tokens); with more than
/// `max_windows` of them, `max_windows` evenly spaced ones.
///
/// PyTorch equivalent: `[data[i:i+len] for i in range(start, end - 1, len - 1)]`.
pub fn consecutive_windows(range: Range<u64>, len: u64, max_windows: usize) -> Vec<Range<u64>> {
    let stride = len.max(2) - 1;
    let mut all = Vec::new();
    let mut start = range.start;
    while start + 2 <= range.end {
        all.push(start..(start + len.max(2)).min(range.end));
        start += stride;
    }
    if all.len() <= max_windows {
        return all;
    }
    (0..max_windows)
        .map(|i| all[i * all.len() / max_windows].clone())
        .collect()
}

/// Windows of `len` tokens (the model's context + 1: the inputs and, shifted by one, the
/// targets) over a token stream whose training part is `train` and validation part `val`.
///
/// PyTorch equivalent: nanoGPT's `get_batch`: `ix = torch.randint(len(data) - block_size,
/// (batch_size,))`, `x = data[i:i+block_size]`, `y = data[i+1:i+1+block_size]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenWindows {
    /// Tokens per window (context + 1).
    pub len: u64,
    /// The training part of the stream.
    pub train: Range<u64>,
    /// The validation part of the stream.
    pub val: Range<u64>,
}

impl TokenWindows {
    /// Windows of `len` tokens; errors when `len < 2` or when the training part is shorter
    /// than one window (naming both lengths).
    pub fn new(len: u64, train: Range<u64>, val: Range<u64>) -> Result<Self> {
        if len < 2 {
            candle::bail!(
                "window of {len} tokens is too short; expected at least 2 (one input, one target)"
            )
        }
        let train_len = train.end.saturating_sub(train.start);
        if train_len < len {
            candle::bail!(
                "the training part has {train_len} tokens, fewer than one window of {len} (context {} + 1); use a shorter context (max_len) or more data",
                len - 1
            )
        }
        Ok(Self { len, train, val })
    }

    /// The number of distinct training offsets: `train.len() - len + 1`.
    pub fn num_train_offsets(&self) -> u64 {
        self.train.end - self.train.start - self.len + 1
    }

    /// The start offsets of step `step`'s `count` training windows: uniform over every
    /// offset whose window lies inside the training part, drawn from
    /// `derive_seed(seed, "windows/{step}")` alone, so the batch of a step never depends on
    /// the steps before it (exact resume).
    pub fn train_offsets(&self, seed: u64, step: u64, count: usize) -> Vec<u64> {
        let mut rng = rng_from_seed(derive_seed(seed, &format!("windows/{step}")));
        let n = self.num_train_offsets();
        (0..count)
            .map(|_| self.train.start + rng.random_range(0..n))
            .collect()
    }

    /// The fixed validation windows: consecutive windows from the start of the validation
    /// part, each starting where the previous one's inputs end (so every validation token
    /// after the first is predicted once), the last one shorter when the part does not
    /// divide evenly (at least 2 tokens). With more than `max_windows` of them, `max_windows`
    /// evenly spaced ones are kept. Returns the token ranges (empty when the validation part
    /// has fewer than 2 tokens).
    pub fn val_ranges(&self, max_windows: usize) -> Vec<Range<u64>> {
        consecutive_windows(self.val.clone(), self.len, max_windows)
    }

    /// The `count` training examples of step `step` from `data` (each an [`Example::full`] of
    /// `len` tokens).
    pub fn train_examples(
        &self,
        data: &TokenData,
        seed: u64,
        step: u64,
        count: usize,
    ) -> Result<Vec<Example>> {
        self.train_offsets(seed, step, count)
            .into_iter()
            .map(|o| Ok(Example::full(data.tokens(o..o + self.len)?)))
            .collect()
    }

    /// The validation windows of [`TokenWindows::val_ranges`] as a [`Dataset`].
    pub fn val_dataset(&self, data: &TokenData, max_windows: usize) -> Result<Dataset> {
        windows_dataset(data, &self.val_ranges(max_windows))
    }
}

/// The token ranges `ranges` of `data` as a [`Dataset`] of [`Example::full`]s.
pub fn windows_dataset(data: &TokenData, ranges: &[Range<u64>]) -> Result<Dataset> {
    let examples = ranges
        .iter()
        .map(|r| Ok(Example::full(data.tokens(r.clone())?)))
        .collect::<Result<_>>()?;
    Ok(Dataset { examples })
}
