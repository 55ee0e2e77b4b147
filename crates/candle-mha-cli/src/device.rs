//! The device a command runs on, with the process settings the library leaves to programs.

use candle_mha::candle::{DType, Device, Result};

/// The device `spec` names (`auto`, `cpu`, `cuda`, `cuda:N`; see
/// [`candle_mha::device::select_device`]) and its notice, with the memory candle frees on a GPU
/// kept in CUDA's pool for the next step (as PyTorch's caching allocator keeps it).
pub fn open(spec: &str) -> Result<(Device, String)> {
    let (device, notice) = candle_mha::device::select_device(spec)?;
    // Best effort: without it a GPU run is only slower.
    let _ = candle_mha::runtime::keep_freed_gpu_memory(&device);
    Ok((device, notice))
}

/// Refuses `--autocast bf16` where it has nothing to round: another dtype than f32, or a CUDA
/// device named (on a GPU the setting changes nothing).
pub fn check_autocast(dtype: Option<DType>, device: &str) -> anyhow::Result<()> {
    if let Some(d) = dtype.filter(|&d| d != DType::F32) {
        anyhow::bail!(
            "--autocast bf16 with --dtype {}: autocast rounds f32 products; expected --dtype f32",
            d.as_str()
        )
    }
    if device.starts_with("cuda") {
        anyhow::bail!("--autocast bf16 with --device {device}: autocast is for the CPU's products; expected --device cpu")
    }
    Ok(())
}

/// One line for `mha train` on an Intel CPU in a build without the `mkl` feature: there the
/// `gemm` crate's products at GPT-2 widths take up to twice MKL's time, and only MKL runs
/// `--autocast bf16` on AMX, so the user learns how to get the fast build. `None` elsewhere.
pub fn build_hint(device: &Device) -> Option<&'static str> {
    if cfg!(feature = "mkl") || !device.is_cpu() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0: the vendor, on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        if vendor == b"GenuineIntel" {
            return Some(
                "note: on this Intel CPU a build with `--features mkl` trains faster (MKL's products; bf16 on AMX with --autocast bf16): see docs/performance.md, \"Intel MKL\"",
            );
        }
    }
    None
}
