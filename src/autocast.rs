//! bf16 mixed precision for the CPU's large matrix products, scoped to a closure on the
//! calling thread.
//!
//! Inside [`autocast`] with [`Precision::Bf16`], every f32 product that the crate's CPU ops
//! run on all threads — the linear layers ([`nn::Linear`](crate::nn::Linear), the attention's
//! projections, the MLP, the output head with its loss), forward and backward — rounds both
//! operands to bf16 and sums in f32. Parameters, gradients, optimizer state and every other op
//! stay f32: the weights are the master copy.
//!
//! - **Each weight rounded once per scope** (PyTorch's autocast cache, `cache_enabled=True`):
//!   a variable ([`Var`](candle::Var)) used as a layer's weight is rounded at its first
//!   product in the scope and that bf16 copy serves the scope's other products, forward and
//!   backward; the copy is dropped when the outermost scope ends. So a variable changed inside
//!   the scope (an optimizer step) is read as it was at its first product there: step outside
//!   the scope, as with PyTorch. Tensors that are not variables are rounded at each product.
//! - **Decoding** (products of up to 4 rows, one token at a time) reads the weights' bf16
//!   copies: half the bytes of f32 per token, on every CPU, with or without MKL.
//!
//! - **Where it is fast.** With the `mkl` feature the products are MKL's
//!   `cblas_gemm_bf16bf16f32`, which runs on AMX tiles (or AVX-512 BF16) on Intel CPUs that
//!   have them. Without MKL the rounded operands are multiplied by the f32 product: the same
//!   numbers up to the order of the sums, at f32's speed plus the rounding pass.
//! - **Differences from PyTorch's autocast** (deliberate): the products' outputs stay f32
//!   (PyTorch rounds them to bf16, and the ops after them run in bf16), so the result is
//!   closer to f32; the attention kernel's own score and value products (tiles of one head)
//!   stay f32, where PyTorch's `scaled_dot_product_attention` runs in bf16. candle's own ops
//!   (`matmul` on a tensor, the reference attention path) and other devices are not affected.
//! - **Scope.** The precision is the calling thread's, set for the closure and restored after
//!   it (also on a panic); the ops read it where they start their products, so a forward and
//!   its `backward()` both belong inside. Nothing else changes: no global setting, and
//!   threads outside the closure keep f32.
//!
//! ```
//! use candle_mha::autocast::{autocast, Precision};
//! use candle_mha::candle::{Device, Module, Tensor};
//! # fn main() -> candle_mha::candle::Result<()> {
//! let x = Tensor::randn(0f32, 1., (64, 256), &Device::Cpu)?;
//! let w = Tensor::randn(0f32, 1., (512, 256), &Device::Cpu)?;
//! let layer = candle_mha::nn::Linear::from_weights(w, None);
//! let y = autocast(Precision::Bf16, || layer.forward(&x))?;
//! let exact = layer.forward(&x)?;
//! let gap = (y - exact)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(gap > 0.0 && gap < 0.5); // bf16 keeps 8 bits of each operand
//! # Ok(())
//! # }
//! ```
//!
//! PyTorch equivalent: `with torch.autocast("cpu", dtype=torch.bfloat16): ...` (see above for
//! the differences).

pub use crate::cpu::bf16::Precision;

/// Runs `f` with the crate's large CPU products in `precision` on this thread, restoring the
/// previous precision after (see the [module](self)). Nests: the innermost call decides.
///
/// PyTorch equivalent: `with torch.autocast("cpu", dtype=torch.bfloat16, enabled=...):`.
pub fn autocast<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    crate::cpu::bf16::with_precision(precision, f)
}

/// This thread's product precision: [`Precision::F32`] outside [`autocast`].
///
/// PyTorch equivalent: `torch.is_autocast_enabled("cpu")`.
pub fn precision() -> Precision {
    crate::cpu::bf16::precision()
}

/// How many products this thread has run in bf16 so far: a check that a model's products
/// took the bf16 path (products of other threads, tiles and candle's own ops not counted).
///
/// PyTorch equivalent: none (the profiler's per-op dtypes come closest).
pub fn bf16_products() -> u64 {
    crate::cpu::bf16::bf16_products()
}
