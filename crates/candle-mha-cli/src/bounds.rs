//! The allowed range of each numeric option: parsers whose error names the option's range
//! (clap prints `invalid value '0' for '--batch-size <N>': 0 is not in 1..=1000000`), so that
//! no value a user can type makes the program panic, abort or allocate without bound.

use candle_mha_train::limits;
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

/// Finite numbers in `[lo, hi)` (a dropout probability: `below(0.0, 1.0)`).
pub fn below(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s: &str| match s.parse::<f64>() {
        Ok(x) if x.is_finite() && lo <= x && x < hi => Ok(x),
        _ => Err(format!("expected a number in [{lo}, {hi})")),
    }
}

/// Finite numbers.
pub fn finite(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err("expected a finite number".into()),
    }
}

/// The largest sizes: a model dimension, a count of sequences or windows, a context, a stack
/// of blocks, accumulated micro-batches and steps (the library's limits, which files are
/// held to as well).
pub const MAX_DIM: u64 = limits::MAX_DIM as u64;
pub const MAX_COUNT: u64 = limits::MAX_COUNT as u64;
pub const MAX_CONTEXT: u64 = limits::MAX_CONTEXT as u64;
pub const MAX_LAYERS: u64 = limits::MAX_LAYERS as u64;
pub const MAX_GRAD_ACCUM: u64 = limits::MAX_GRAD_ACCUM as u64;
pub const MAX_STEPS: u64 = limits::MAX_STEPS;

/// The memory a command may plan for: this machine's (`MemTotal` of `/proc/meminfo`), so
/// that a model or batch far too large is an error before it is allocated; `None` where
/// the machine does not say.
pub fn memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
