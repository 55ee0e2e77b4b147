//! The CPU kernel layer every fused op shares: the one element trait ([`Elem`]: f32 and
//! f64), the one way of reading a storage ([`slice`], [`contiguous`]), the one matrix product
//! ([`gemm`]), the SIMD math (`exp`, row reductions, the exact GELU, SwiGLU's gate), the
//! fused linear op, the dtype rule ([`fused`], [`unsupported_dtype`]) and the one side
//! channel ([`Stash`]).
//!
//! The lowest layer besides `rng` and `init`: it imports nothing else of the crate, and the
//! attention core, the `nn` layers and the training loops build on it.

pub(crate) mod bf16;
mod custom_op;
mod dot_bf16;
mod dtype;
mod elem;
mod gelu;
mod gelu_tanh;
mod gemm;
mod gemm_bf16;
pub(crate) mod lanes;
mod linear;
#[cfg(feature = "mkl")]
pub(crate) mod mkl;
pub(crate) mod par;
mod silu;
pub(crate) mod simd;
mod slice;
mod stash;
pub(crate) mod workspace;

pub(crate) use bf16::keep as keep_weights;
pub(crate) use custom_op::{custom_op, op_with_optional_bias, CpuArg, Grads, Grads3, NeedsGrad};
pub(crate) use dtype::{fused, unsupported_dtype};
pub(crate) use elem::Elem;
pub use gelu::GeluApproximate;
pub(crate) use gelu::{gelu, gelu_grad, gelu_grad_into, gelu_into};
pub(crate) use gemm::{gemm, gemm_from, Operand, Start, Threads};
pub(crate) use linear::{
    input_grad_into, linear, linear_backward_kept, linear_backward_slice, linear_forward,
    linear_forward_into, linear_forward_kept, linear_forward_slice, linear_out_len, weight_grad,
};
pub(crate) use silu::{silu_mul, silu_mul_grad};
pub(crate) use slice::{contiguous, filled_vec, slice, with_slice, written_vec, AsCpu};
pub(crate) use stash::Stash;

/// Rows per rayon task of the row ops. Fixed, not derived from the thread count, so that sums
/// over tasks come out the same with any number of threads.
pub(crate) const ROWS_PER_TASK: usize = 32;
