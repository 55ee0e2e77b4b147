//! What the model's ops share: the CPU check and a contiguous slice of a tensor's storage.

use candle::{CpuStorage, DType, Device, Layout, Result, Tensor, WithDType};

/// Whether the fused CPU ops take `x`: CPU, f32 or f64.
pub(super) fn fused(x: &Tensor) -> bool {
    matches!(x.device(), Device::Cpu) && matches!(x.dtype(), DType::F32 | DType::F64)
}

/// The CPU storage behind a tensor the fused ops took (they only take CPU tensors).
pub(super) fn cpu(s: &candle::Storage) -> Result<&CpuStorage> {
    match s {
        candle::Storage::Cpu(s) => Ok(s),
        _ => candle::bail!("the model's fused ops run on the CPU"),
    }
}

/// The elements of a contiguous operand.
pub(super) fn slice<'a, T: WithDType>(op: &str, s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&T::cpu_storage_as_slice(s)?[a..b]),
        None => candle::bail!(
            "{op}: expected a contiguous operand, got strides {:?}",
            l.stride()
        ),
    }
}

/// Rows per rayon task. Fixed, not derived from the thread count, so that sums over tasks
/// come out the same with any number of threads.
pub(super) const ROWS_PER_TASK: usize = 32;
