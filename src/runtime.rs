//! Process settings for programs built on candle-mha: the library never changes them itself
//! (no constructor touches the environment, the allocator or a GPU's memory pool); a program
//! opts in at its start, as the `mha` CLI and the examples do:
//!
//! - [`recommended_env`]: candle settings that only exist as environment variables; a
//!   program's `main` puts each pair in its environment (where the user has not) before the
//!   first candle op, as the README shows;
//! - [`retain_freed_memory`], [`keep_freed_gpu_memory`]: calls.
//!
//! ```
//! candle_mha::runtime::retain_freed_memory();
//! # let device = candle_mha::candle::Device::Cpu;
//! candle_mha::runtime::keep_freed_gpu_memory(&device)?; // nothing on the CPU
//! # Ok::<(), candle_mha::candle::Error>(())
//! ```
//!
//! # candle's element-wise threads ([`recommended_env`])
//! candle 0.11 runs its large element-wise CPU ops (gradient sums, residual adds, casts) on a
//! pool of its own, beside rayon's pool that the matrix products run on. After each op those
//! workers spin 25,000 times before parking; a training step alternates element-wise ops with
//! matrix products, so with as many threads as cores the spinning worker takes a core from the
//! next product, whose threads then wait for each other. A limit of [`SPIN_LIMIT`] spins avoids
//! that (the `train_step` bench's steps are faster with it where threads equal cores). candle
//! reads the limit only from the environment variable [`SPIN_LIMIT_ENV`].
//!
//! With the `mkl` feature, MKL's OpenMP threads (candle's MKL matmuls and vector math) spin
//! 200 ms after each parallel region by default, on the same cores; [`recommended_env`] adds
//! `KMP_BLOCKTIME=0` ([`BLOCKTIME_ENV`]) so that they sleep at once.
//!
//! # Keeping freed memory ([`retain_freed_memory`])
//! candle allocates a fresh buffer for every intermediate tensor and gradient. With glibc's
//! defaults the large ones are returned to the operating system when freed and page-faulted
//! in again at the next step; [`retain_freed_memory`] tells glibc to keep them. The fused CPU
//! ops keep their own scratch buffers in a pool regardless ([`workspace_bytes`],
//! [`release_workspace`]).
//!
//! PyTorch equivalent: none in `torch` itself; the allocator setting is
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647`
//! (see [`GLIBC_TUNABLES`]), the thread setting OpenMP's `OMP_WAIT_POLICY=passive`.

use candle::{Device, Result};

/// Keeps the memory that candle frees on a CUDA `device` in CUDA's memory pool for the next
/// allocation, instead of handing it back to the driver at every synchronisation (the pool's
/// default release threshold is 0), where every call would pay for mapping its large buffers
/// afresh, a sizeable share of a training step (`docs/benchmarks.md`). Process-wide and
/// opt-in: the library never calls it; the `mha` CLI and the examples do, right after choosing
/// the device. The memory then stays with the process, as PyTorch's does. A no-op on other
/// devices and where the GPU has no memory pools.
///
/// PyTorch equivalent: PyTorch's caching allocator, which keeps freed blocks until
/// `torch.cuda.empty_cache()`.
pub fn keep_freed_gpu_memory(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use candle::cuda_backend::cudarc::driver::sys;
        let ctx = d.cuda_stream().context().clone();
        if !ctx.has_async_alloc() {
            // No memory pools on this device: cudarc allocates with cuMemAlloc, no pool to keep.
            return Ok(());
        }
        let cu = ctx.cu_device();
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut threshold = u64::MAX;
        // SAFETY: plain driver calls on a device candle has initialised; `threshold` outlives
        // the call that reads it.
        let results = unsafe {
            [
                sys::cuDeviceGetDefaultMemPool(&mut pool, cu),
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
            ]
        };
        for r in results {
            if r != sys::CUresult::CUDA_SUCCESS {
                candle::bail!("keeping freed GPU memory in the pool of {device:?}: {r:?}")
            }
        }
    }
    let _ = device;
    Ok(())
}

/// candle's environment variable for the spin count of its element-wise worker threads.
pub const SPIN_LIMIT_ENV: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// The spin count [`recommended_env`] gives candle's element-wise workers (candle's
/// default: 25,000).
pub const SPIN_LIMIT: u32 = 1000;

/// Intel OpenMP's environment variable for how long (ms) its threads spin after a parallel
/// region before sleeping (default 200).
pub const BLOCKTIME_ENV: &str = "KMP_BLOCKTIME";

/// The environment settings candle should start with for training and decoding on the CPU:
/// `(name, value)` pairs for the program to set (where the user has not) before its first
/// candle op: the spin limit of candle's element-wise workers, and with the `mkl` feature
/// `KMP_BLOCKTIME=0`. The library reads and writes no environment variable itself.
///
/// ```
/// let env = candle_mha::runtime::recommended_env();
/// assert_eq!(env[0], ("CANDLE_BARRIER_POOL_SPIN_LIMIT", "1000".to_string()));
/// ```
pub fn recommended_env() -> Vec<(&'static str, String)> {
    let mut env = vec![(SPIN_LIMIT_ENV, SPIN_LIMIT.to_string())];
    if cfg!(feature = "mkl") {
        env.push((BLOCKTIME_ENV, "0".to_string()));
    }
    env
}

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
/// let applied = candle_mha::runtime::retain_freed_memory();
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
/// candle_mha::runtime::release_workspace();
/// assert_eq!(candle_mha::runtime::workspace_bytes(), 0);
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
