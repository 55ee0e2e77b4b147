//! candle's CPU worker threads, tuned for the matrix products of a training step.
//!
//! candle 0.11 runs its large element-wise CPU ops (every `GradStore` gradient sum, residual
//! adds, casts) on a "barrier pool" of its own, `threads − 1` workers beside rayon's pool that
//! the matrix products run on (candle's `matmul` and the fused ops' `gemm`). After each
//! element-wise op those workers spin 25,000 times before parking. A training step alternates
//! element-wise ops with matrix products many times, and with as many threads as cores the
//! spinning worker takes a core away from the next product, whose threads then wait for each
//! other at its end.
//!
//! Measured on this project's 2-core machine (`BENCHMARKS.md`, issue 21): the
//! `NextTokenPredictor` medium training step took 276–286 ms with candle's default and 244–257
//! ms with the spin limited to 1,000 (any value up to 5,000 gave the same), and
//! `Linear(256, 768)` forward + backward over 2,048 rows 20.0 ms against 12.3 ms.
//!
//! [`tune_candle_threads`] sets that limit ([`BARRIER_SPIN_LIMIT`]) through candle's own
//! setting, the `CANDLE_BARRIER_POOL_SPIN_LIMIT` environment variable, when it is unset. The
//! crate's layers call it when they are built ([`crate::MultiheadAttention::new`],
//! [`crate::nn::Linear::new`], [`crate::nn::LayerNorm::new`], [`crate::nn::Embedding::new`]),
//! since candle reads the variable once, when its first large element-wise op starts the pool.
//! To keep candle's default, set the variable yourself (`CANDLE_BARRIER_POOL_SPIN_LIMIT=25000`);
//! a value you set is never changed.
//!
//! PyTorch equivalent: none needed (PyTorch's CPU ops share one OpenMP pool); the closest
//! setting is OpenMP's `OMP_WAIT_POLICY=passive`.

use std::sync::Once;

/// candle's environment variable for the spin count of its element-wise worker threads.
pub const BARRIER_SPIN_ENV: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// The spin count set by [`tune_candle_threads`] (candle's default: 25,000).
pub const BARRIER_SPIN_LIMIT: u32 = 1000;

/// Sets `CANDLE_BARRIER_POOL_SPIN_LIMIT` to [`BARRIER_SPIN_LIMIT`] unless it is already set;
/// does nothing after the first call. Returns whether this call set it.
///
/// Effective only before candle's first large element-wise op on the CPU (candle reads the
/// variable when it starts its worker pool); the crate's layers call it when they are built,
/// so a program that builds its model before computing with candle needs nothing more.
///
/// PyTorch equivalent: none needed (see the module documentation).
///
/// ```
/// use candle_mha::threads::{tune_candle_threads, BARRIER_SPIN_ENV};
/// tune_candle_threads();
/// assert!(std::env::var(BARRIER_SPIN_ENV).is_ok());
/// ```
pub fn tune_candle_threads() -> bool {
    static ONCE: Once = Once::new();
    let mut set = false;
    ONCE.call_once(|| {
        if std::env::var_os(BARRIER_SPIN_ENV).is_none() {
            // Rust's environment functions hold a lock, and candle reads the variable with
            // `std::env::var`; the crate itself reads nothing else at the same time.
            std::env::set_var(BARRIER_SPIN_ENV, BARRIER_SPIN_LIMIT.to_string());
            set = true;
        }
    });
    set
}
