//! A list of examples with a seeded split and seeded, resumable epoch order.

use candle::{Device, Result};
use rand::seq::SliceRandom;

use super::batch::Batch;
use super::example::Example;
use candle_mha::rng::{derive_seed, rng_from_seed};

/// A list of training examples.
///
/// PyTorch equivalent: a map-style `torch.utils.data.Dataset` with a `DataLoader`
/// (`shuffle=True, generator=g, drop_last=False`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dataset {
    /// The examples, in dataset order.
    pub examples: Vec<Example>,
}

impl Dataset {
    /// The number of examples.
    ///
    /// PyTorch equivalent: `len(dataset)`.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Seeded split into `(train, validation)`: shuffles the indices with `seed`, and the first
    /// `ceil(val_fraction * n)` become validation (at least 1 when `n >= 2` and
    /// `val_fraction > 0`, at most `n - 1` so that training keeps an example; none when
    /// `n < 2`). `val_fraction` is clamped to `[0, 1]` (NaN counts as 0). Both parts keep the
    /// shuffled order.
    ///
    /// PyTorch equivalent: `torch.utils.data.random_split(dataset, [1 - f, f], generator=g)`.
    pub fn split(self, val_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let n = self.examples.len();
        let f = if val_fraction.is_nan() {
            0.0
        } else {
            val_fraction.clamp(0.0, 1.0)
        };
        let n_val = if n < 2 || f == 0.0 {
            0
        } else {
            ((f * n as f64).ceil() as usize).clamp(1, n - 1)
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng_from_seed(seed));
        let mut slots: Vec<Option<Example>> = self.examples.into_iter().map(Some).collect();
        let mut take = |idx: &[usize]| -> Vec<Example> {
            idx.iter().filter_map(|&i| slots[i].take()).collect()
        };
        let val = take(&order[..n_val]);
        let train = take(&order[n_val..]);
        (Dataset { examples: train }, Dataset { examples: val })
    }

    /// The number of batches per epoch (the last, partial batch is kept); 0 when `batch_size`
    /// is 0.
    ///
    /// PyTorch equivalent: `len(DataLoader(dataset, batch_size, drop_last=False))`.
    pub fn num_batches(&self, batch_size: usize) -> usize {
        if batch_size == 0 {
            0
        } else {
            self.examples.len().div_ceil(batch_size)
        }
    }

    /// The order of the examples in epoch `epoch`: a permutation seeded by
    /// `derive_seed(seed, &format!("epoch{epoch}"))`.
    pub fn epoch_order(&self, epoch: u64, seed: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        order.shuffle(&mut rng_from_seed(derive_seed(
            seed,
            &format!("epoch{epoch}"),
        )));
        order
    }

    /// The `index`-th batch of epoch `epoch`, in the order of [`Dataset::epoch_order`]. The
    /// order depends only on `(seed, epoch)`, so training can resume mid-epoch exactly.
    ///
    /// Errors when `batch_size` is 0 or `index >= num_batches(batch_size)`.
    ///
    /// PyTorch equivalent: the `index`-th item of `iter(DataLoader(dataset, batch_size,
    /// shuffle=True, generator=g))` after `g.manual_seed(...)` for the epoch.
    pub fn batch(
        &self,
        batch_size: usize,
        epoch: u64,
        index: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Batch> {
        self.check_batch_size(batch_size)?;
        let num = self.num_batches(batch_size);
        if index >= num {
            return Err(candle::Error::Msg(format!(
                "batch index {index} is out of range: the dataset of {} examples has {num} \
                 batch(es) of size {batch_size}; expected an index below {num}",
                self.examples.len()
            )));
        }
        let order = self.epoch_order(epoch, seed);
        let start = index * batch_size;
        let end = start.saturating_add(batch_size).min(order.len());
        let examples: Vec<&Example> = order[start..end]
            .iter()
            .map(|&i| &self.examples[i])
            .collect();
        Batch::from_examples(&examples, device)
    }

    /// All batches in dataset order, unshuffled (for evaluation); empty for an empty dataset.
    ///
    /// PyTorch equivalent: `list(DataLoader(dataset, batch_size, shuffle=False))`.
    pub fn eval_batches(&self, batch_size: usize, device: &Device) -> Result<Vec<Batch>> {
        self.check_batch_size(batch_size)?;
        self.examples
            .chunks(batch_size)
            .map(|chunk| {
                let refs: Vec<&Example> = chunk.iter().collect();
                Batch::from_examples(&refs, device)
            })
            .collect()
    }

    /// The length in tokens of the longest example (0 for an empty dataset).
    pub fn max_len(&self) -> usize {
        self.examples
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(0)
    }

    fn check_batch_size(&self, batch_size: usize) -> Result<()> {
        if batch_size == 0 {
            Err(candle::Error::Msg(
                "batch size 0 is invalid; expected at least 1".into(),
            ))
        } else {
            Ok(())
        }
    }
}
