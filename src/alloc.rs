//! Keeping freed memory in the process between training steps (glibc's allocator).
//!
//! candle allocates a fresh buffer for every intermediate tensor and every gradient (its
//! `GradStore` adds each gradient into a new zero tensor). With glibc's default settings the
//! large ones are `mmap`ed or sit at the top of the heap, and are returned to the operating
//! system when freed; the next step then page-faults the same megabytes in again (before the
//! fused ops pooled their scratch buffers this cost up to a third of a small training step on
//! a 2-core machine, see `BENCHMARKS.md`; now it is candle's own buffers: 23.7k faults and
//! 80 ms of system time per step of the `train_step` bench's medium model under glibc's
//! defaults, 1.2k and 28 ms with [`retain_freed_memory`], against PyTorch's 3.3k faults).
//! [`retain_freed_memory`] tells glibc to keep such memory for reuse.
//!
//! The fused CPU ops do not depend on the setting for their own large scratch buffers (the
//! packed projection kept for the backward pass, its gradient, the packed heads): they keep
//! them in a pool between calls ([`workspace_bytes`], [`release_workspace`]).
//!
//! PyTorch equivalent: none in `torch` itself; the same process setting is
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647`
//! (see [`GLIBC_TUNABLES`]), which the CPU bench gives PyTorch's side as well.

/// Allocations at least this large (32 MiB, glibc's maximum for the setting) still get their
/// own `mmap`; smaller ones are served from the heap and reused.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free memory at the top of a heap is kept up to this many bytes (`i32::MAX`, glibc's
/// largest value): in effect, never trimmed.
pub const TRIM_THRESHOLD: usize = i32::MAX as usize;

/// The environment setting with the same effect for another glibc process (a PyTorch run in
/// a benchmark): pass it as `GLIBC_TUNABLES`.
pub const GLIBC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647";

/// Makes glibc's `malloc` keep freed memory for reuse instead of returning it to the
/// operating system: `mallopt(M_MMAP_THRESHOLD, 32 MiB)` and `mallopt(M_TRIM_THRESHOLD,
/// i32::MAX)`. Process-wide and opt-in: the library never calls it; the `mha` CLI does.
///
/// The cost: the resident memory stays at its high-water mark until the process exits.
/// Returns whether the settings were applied (`false` off Linux/glibc, where it does nothing).
///
/// PyTorch equivalent: running under [`GLIBC_TUNABLES`].
///
/// ```
/// let applied = candle_mha::alloc::retain_freed_memory();
/// assert_eq!(applied, cfg!(all(target_os = "linux", target_env = "gnu")));
/// ```
pub fn retain_freed_memory() -> bool {
    imp::retain()
}

/// Frees the scratch buffers the fused CPU ops keep between calls, returning the bytes freed.
///
/// The ops (the fused attention and the projected self-attention, forward and backward) take
/// their large buffers that candle never sees from a process-wide pool and give them back
/// after the call, so that repeated calls do not fault fresh pages in. A new buffer is made
/// only when no kept one is large enough, so the pool holds about the buffers that were in
/// use at once, of the largest sizes used (a training step of self-attention: two of
/// `N·L·3E`; a model's step: two per block), at most 32 per dtype (f32, f64). Call this after a large run to give that memory back; the next call
/// allocates anew. Safe at any time, from any thread: buffers in use are not affected and
/// return to the (then empty) pool when their call ends.
///
/// PyTorch equivalent: `torch.cuda.empty_cache()`'s role for PyTorch's caching allocators;
/// on the CPU PyTorch keeps no such pool and relies on the C allocator.
///
/// ```
/// candle_mha::alloc::release_workspace();
/// assert_eq!(candle_mha::alloc::workspace_bytes(), 0);
/// ```
pub fn release_workspace() -> usize {
    crate::cpu::workspace::release()
}

/// Bytes held by the fused CPU ops' pool of scratch buffers (see [`release_workspace`]).
///
/// PyTorch equivalent: `torch.cuda.memory_reserved() - torch.cuda.memory_allocated()` for
/// the CUDA caching allocator; none on the CPU.
pub fn workspace_bytes() -> usize {
    crate::cpu::workspace::bytes()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    // glibc's `malloc.h` values; declared here to avoid a direct `libc` dependency.
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;

    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }

    pub(super) fn retain() -> bool {
        // SAFETY: mallopt only changes allocator parameters; it returns 1 on success.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, super::MMAP_THRESHOLD as i32) == 1
                && mallopt(M_TRIM_THRESHOLD, super::TRIM_THRESHOLD as i32) == 1
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) fn retain() -> bool {
        false
    }
}
