//! The largest sizes the crate accepts, from a flag or from a file (`config.json`,
//! `trainer_state.json`, `meta.json` are checked like the command line's options), and the
//! memory a model needs, checked before it is built so that a size too large for the machine
//! is an error naming the quantity, never an abort.

use candle::{DType, Result};

/// The largest model width, and the most heads.
pub const MAX_DIM: usize = 1 << 16;
/// The most sequences, windows or examples a count may name.
pub const MAX_COUNT: usize = 100_000_000;
/// The longest context, and the widest MLP.
pub const MAX_CONTEXT: usize = 1 << 20;
/// The most Transformer blocks.
pub const MAX_LAYERS: usize = 4096;
/// The most token ids a model or a data directory may have.
pub const MAX_VOCAB: usize = 1 << 24;
/// The most micro-batches accumulated into one step.
pub const MAX_GRAD_ACCUM: usize = 1_000_000;
/// The most steps of a run (and warmup, evaluation and saving periods).
pub const MAX_STEPS: u64 = 1_000_000_000_000;

/// The largest `config.json` read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The largest `trainer_state.json` read (a loss per step: ~10 bytes each).
pub const MAX_STATE_BYTES: u64 = 1 << 30;
/// The largest `meta.json`, `vocab.json` or `tokenizer.json` read.
pub const MAX_JSON_BYTES: u64 = 1 << 29;

/// Errors unless `value` is in `lo..=hi`, naming `what` and the range.
pub fn check_range<T: PartialOrd + std::fmt::Display>(
    what: &str,
    value: T,
    lo: T,
    hi: T,
) -> Result<()> {
    if value < lo || value > hi {
        candle::bail!("{what} {value}: expected a value in {lo}..={hi}")
    }
    Ok(())
}

/// Bytes per element of `dtype`.
pub fn dtype_bytes(dtype: DType) -> u64 {
    dtype.size_in_bytes() as u64
}

/// An estimate of the memory one step or one forward pass needs, in bytes, and what it is
/// made of, for [`MemoryEstimate::check`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// The parameters (and, for training, their gradients and AdamW's two moments).
    pub parameters: u128,
    /// The activations kept for one batch (a rough upper estimate).
    pub activations: u128,
}

impl MemoryEstimate {
    /// The total.
    pub fn total(&self) -> u128 {
        self.parameters + self.activations
    }

    /// Errors when the total is above `limit` bytes (a machine's memory): the message gives
    /// both parts, so that the user knows whether the model or the batch is too large.
    pub fn check(&self, limit: u64, what: &str) -> Result<()> {
        if self.total() > u128::from(limit) {
            candle::bail!(
                "{what} needs about {} of memory ({} for the parameters, {} for the activations of a batch), more than the {} allowed: choose a smaller model or batch",
                gib(self.total()),
                gib(self.parameters),
                gib(self.activations),
                gib(u128::from(limit))
            )
        }
        Ok(())
    }
}

fn gib(bytes: u128) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_estimates_name_the_quantity() {
        let e = check_range("batch_size", 0usize, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_size 0") && e.contains("1..=10"), "{e}");
        assert!(check_range("x", 10u64, 1, 10).is_ok());
        let m = MemoryEstimate {
            parameters: 3 << 30,
            activations: 1 << 30,
        };
        let e = m.check(2 << 30, "training").unwrap_err().to_string();
        assert!(e.contains("4.0 GiB") && e.contains("2.0 GiB"), "{e}");
        assert!(m.check(4 << 30, "training").is_ok());
    }
}
