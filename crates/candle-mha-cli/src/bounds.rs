//! The allowed range of each numeric option: parsers whose error names the option's range
//! (clap prints `invalid value '0' for '--batch-size <N>': 0 is not in 1..=1000000`), so that
//! no value a user can type makes the program panic, abort or allocate without bound.

use clap::builder::RangedU64ValueParser;

/// Whole numbers in `lo..=hi`.
pub fn count(lo: u64, hi: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(lo..=hi)
}

/// Whole numbers in `lo..=hi`, as `u64`.
pub fn count_u64(lo: u64, hi: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::<u64>::new().range(lo..=hi)
}

/// Whole numbers in `lo..=hi`, as `u32`.
pub fn count_u32(lo: u64, hi: u64) -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::<u32>::new().range(lo..=hi)
}

/// Finite numbers in `[lo, hi]`.
pub fn real(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s: &str| match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        _ => Err(format!("expected a number in [{lo}, {hi}]")),
    }
}

/// Finite numbers.
pub fn finite(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err("expected a finite number".into()),
    }
}

/// The largest sizes: a model dimension, a count of sequences or windows, a context.
pub const MAX_DIM: u64 = 1 << 16;
pub const MAX_COUNT: u64 = 100_000_000;
pub const MAX_CONTEXT: u64 = 1 << 20;
