//! Benchmarks only: run-time overrides of how the linear layers' products are computed, so
//! that one process can alternate variants call by call (`MHA_BENCH_PAIRED` in the benches).
//! On a host whose speed drifts within minutes, only such pairs with a same-variant control
//! resolve a few percent (`BENCHMARKS.md`, ninth session). Per thread, read where a product
//! is planned (on the calling thread), so concurrent callers and tests never see another's
//! setting; the library never sets it.

use std::cell::Cell;

/// Which code computes a product on all threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `par_gemm` (`src/cpu/par_gemm.rs`).
    ParGemm,
    /// The `gemm` crate's own threading.
    GemmCrate,
    /// The `gemm` crate, except where the product starts from a row (a linear layer's bias,
    /// which the crate can only take as a filled-in output): `par_gemm` there.
    GemmCrateUnlessRow,
}

/// How this thread's linear products run; `Default`: as the library chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProductTuning {
    /// Which code computes a product on all threads; `None`: the library's choice.
    pub backend: Option<Backend>,
    /// `par_gemm`'s inner block where the left operand is packed (a weight gradient `gᵀ·x`),
    /// in elements; 0: the default (a 16 KiB strip of the right operand).
    pub packed_kc: usize,
    /// `par_gemm`'s most inner-dimension slices of a weight gradient; 0: the default (4),
    /// 1: never sliced.
    pub max_slices: usize,
}

thread_local! {
    static TUNING: Cell<ProductTuning> = const {
        Cell::new(ProductTuning { backend: None, packed_kc: 0, max_slices: 0 })
    };
}

/// Sets this thread's [`ProductTuning`] (until set again).
pub fn set(tuning: ProductTuning) {
    TUNING.with(|t| t.set(tuning));
}

/// This thread's [`ProductTuning`].
pub(crate) fn get() -> ProductTuning {
    TUNING.with(|t| t.get())
}
