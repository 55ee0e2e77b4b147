//! The device a command runs on, with the process settings the library leaves to programs.

use candle_mha::candle::{Device, Result};

/// The device `spec` names (`auto`, `cpu`, `cuda`, `cuda:N`; see
/// [`candle_mha::device::select_device`]) and its notice, with the memory candle frees on a GPU
/// kept in CUDA's pool for the next step (as PyTorch's caching allocator keeps it).
pub fn open(spec: &str) -> Result<(Device, String)> {
    let (device, notice) = candle_mha::device::select_device(spec)?;
    // Best effort: without it a GPU run is only slower.
    let _ = candle_mha::runtime::keep_freed_gpu_memory(&device);
    Ok((device, notice))
}
