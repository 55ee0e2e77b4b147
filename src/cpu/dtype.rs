//! Which tensors the fused CPU ops take, and the one error for a dtype they do not run in.

use candle::{DType, Device, Tensor};

/// Whether the fused CPU ops take `x`: on the CPU, in f32 or f64. Other tensors go through
/// candle's generic ops.
pub(crate) fn fused(x: &Tensor) -> bool {
    matches!(x.device(), Device::Cpu) && matches!(x.dtype(), DType::F32 | DType::F64)
}

/// The error of op `op` (named as in its other errors: `"fused linear"`) given an element
/// type the CPU kernels do not run in. The public callers check [`fused`] first, so this is an
/// internal inconsistency made visible, not a panic.
pub(crate) fn unsupported_dtype(op: &str, got: DType) -> candle::Error {
    candle::Error::Msg(format!(
        "{op}: the fused CPU kernels run in f32 or f64, got dtype {got:?}"
    ))
}
