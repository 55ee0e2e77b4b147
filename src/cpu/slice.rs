//! The one way the CPU kernels take the elements out of a candle storage, and the one way they
//! make a large output without a zero fill ([`filled_vec`]).

use candle::{CpuStorage, Layout, Result, Storage, WithDType};

/// A storage the kernels can read: a [`CpuStorage`] (what custom ops' `cpu_fwd` gets) or a
/// tensor's [`Storage`] (what the backward passes get), which must then be on the CPU.
pub(crate) trait AsCpu {
    /// The CPU storage, or an error naming `op`.
    fn as_cpu(&self, op: &str) -> Result<&CpuStorage>;
}

impl AsCpu for CpuStorage {
    fn as_cpu(&self, _op: &str) -> Result<&CpuStorage> {
        Ok(self)
    }
}

impl AsCpu for Storage {
    fn as_cpu(&self, op: &str) -> Result<&CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            other => candle::bail!(
                "{op}: the fused CPU kernels take CPU tensors, got one on {:?}",
                other.device().location()
            ),
        }
    }
}

/// The elements `layout` addresses, from its start offset to its last element: strided
/// operands are addressed by the caller with the layout's strides (relative to this slice).
/// Errors name `op` when the storage is not on the CPU, holds another dtype than `T`, or is
/// shorter than the layout.
pub(crate) fn slice<'a, T: WithDType, S: AsCpu + ?Sized>(
    op: &str,
    storage: &'a S,
    layout: &Layout,
) -> Result<&'a [T]> {
    let data = T::cpu_storage_as_slice(storage.as_cpu(op)?)?;
    let start = layout.start_offset();
    let end = match layout.shape().elem_count() {
        0 => start,
        _ => {
            let span: usize = layout
                .dims()
                .iter()
                .zip(layout.stride())
                .map(|(&d, &s)| (d - 1) * s)
                .sum();
            start + span + 1
        }
    };
    match data.get(start..end) {
        Some(s) => Ok(s),
        None => candle::bail!(
            "{op}: layout {:?} (strides {:?}, offset {start}) addresses past the {} elements of its storage",
            layout.dims(),
            layout.stride(),
            data.len()
        ),
    }
}

/// [`slice`] of an operand that must be contiguous (the elementwise and row ops).
pub(crate) fn contiguous<'a, T: WithDType, S: AsCpu + ?Sized>(
    op: &str,
    storage: &'a S,
    layout: &Layout,
) -> Result<&'a [T]> {
    if !layout.is_contiguous() {
        candle::bail!(
            "{op}: expected a contiguous operand, got strides {:?}",
            layout.stride()
        )
    }
    slice(op, storage, layout)
}

/// `f` on the elements of the tensor `t` as a contiguous slice (a contiguous copy first when
/// it is strided): how the backward passes read their tensor arguments.
pub(crate) fn with_slice<T: WithDType, R>(
    op: &str,
    t: &candle::Tensor,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    f(contiguous(op, &*s, l)?)
}

/// A `len`-element `Vec` filled by `fill`, with no zero fill first (a large output that is
/// about to be overwritten). An error from `fill` is returned and nothing is exposed.
///
/// # Safety
/// When `fill` returns `Ok`, it must have written every element of the slice it was given.
pub(crate) unsafe fn filled_vec<T>(
    len: usize,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<T>]) -> Result<()>,
) -> Result<Vec<T>> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v.spare_capacity_mut()[..len])?;
    // SAFETY: the caller's promise: `fill` wrote all `len` elements.
    unsafe { v.set_len(len) };
    Ok(v)
}

/// A `len`-element `Vec` handed to `fill` as a slice before any element is written, for
/// kernels that write every element of the slice they are given (the SIMD row functions):
/// no zero fill first.
///
/// # Safety
/// `fill` must write every element before reading it.
pub(crate) unsafe fn written_vec<T: Copy>(len: usize, fill: impl FnOnce(&mut [T])) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: the capacity holds `len` elements; the caller's promise: `fill` writes each
    // before any is read, so the Vec holds only written elements when its length is set.
    unsafe {
        fill(std::slice::from_raw_parts_mut(v.as_mut_ptr(), len));
        v.set_len(len);
    }
    v
}
