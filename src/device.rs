//! Choosing a device from a string: `auto`, `cpu`, `cuda`, `cuda:N`.

use candle::{Device, Result};

/// The device named by `spec`, and a one-line notice saying what was chosen and why.
///
/// - `auto`: the first CUDA device when this build has the `cuda` feature and a GPU answers,
///   else the CPU;
/// - `cpu`; `cuda` (= `cuda:0`); `cuda:N`.
///
/// PyTorch equivalent: `torch.device("cuda" if torch.cuda.is_available() else "cpu")`.
pub fn select_device(spec: &str) -> Result<(Device, String)> {
    match spec {
        "cpu" => Ok((Device::Cpu, "device: cpu".into())),
        "auto" => {
            if !cfg!(feature = "cuda") {
                return Ok((
                    Device::Cpu,
                    "device: cpu (auto: this build has no CUDA support)".into(),
                ));
            }
            match Device::new_cuda(0) {
                Ok(d) => Ok((d, "device: cuda:0 (auto)".into())),
                Err(e) => Ok((
                    Device::Cpu,
                    format!("device: cpu (auto: no CUDA device: {e})"),
                )),
            }
        }
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal = match s.strip_prefix("cuda:") {
                None => 0,
                Some(n) => n.parse::<usize>().map_err(|_| {
                    candle::Error::Msg(format!(
                        "invalid device \"{s}\": expected cuda:N with N a GPU index"
                    ))
                })?,
            };
            if !cfg!(feature = "cuda") {
                candle::bail!("device \"{s}\": this binary was built without CUDA support; rebuild with the `cuda` feature")
            }
            let d = Device::new_cuda(ordinal)
                .map_err(|e| candle::Error::Msg(format!("device \"{s}\" is not available: {e}")))?;
            Ok((d, format!("device: cuda:{ordinal}")))
        }
        other => candle::bail!("invalid device \"{other}\": expected auto, cpu, cuda or cuda:N"),
    }
}

/// The high mark of the memory in use in the default memory pool of a CUDA `device`, in
/// bytes, after setting it to `set` (the driver takes only 0: the mark restarts from the
/// current use); `None` on other devices and where the device has no pools.
fn used_memory_high(device: &Device, set: Option<u64>) -> Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use candle::cuda_backend::cudarc::driver::sys;
        let ctx = d.cuda_stream().context().clone();
        if !ctx.has_async_alloc() {
            return Ok(None);
        }
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        let mut value = set.unwrap_or(0);
        // SAFETY: plain driver calls on a device candle has initialised; `value` is the u64
        // this attribute is read into or set from and outlives the calls.
        let results = unsafe {
            let r = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device());
            let value = (&mut value as *mut u64).cast();
            match (r, set) {
                (sys::CUresult::CUDA_SUCCESS, Some(_)) => {
                    [r, sys::cuMemPoolSetAttribute(pool, attr, value)]
                }
                (sys::CUresult::CUDA_SUCCESS, None) => {
                    [r, sys::cuMemPoolGetAttribute(pool, attr, value)]
                }
                _ => [r, r],
            }
        };
        if let Some(r) = results.iter().find(|r| **r != sys::CUresult::CUDA_SUCCESS) {
            candle::bail!("the memory pool statistics of {device:?}: {r:?}")
        }
        return Ok(Some(value));
    }
    let _ = (device, set);
    Ok(None)
}

/// The most GPU memory that tensors on `device` have held at once, in bytes, since the first
/// CUDA allocation or the last [`reset_peak_gpu_memory`]; `None` on other devices and where
/// the GPU has no memory pools (candle then allocates outside any pool).
///
/// PyTorch equivalent: `torch.cuda.max_memory_allocated(device)`.
pub fn peak_gpu_memory(device: &Device) -> Result<Option<u64>> {
    used_memory_high(device, None)
}

/// Starts [`peak_gpu_memory`] again from the memory in use now. A no-op where it is `None`.
///
/// PyTorch equivalent: `torch.cuda.reset_peak_memory_stats(device)`.
pub fn reset_peak_gpu_memory(device: &Device) -> Result<()> {
    used_memory_high(device, Some(0)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert!(select_device("cpu").unwrap().0.is_cpu());
        let (d, notice) = select_device("auto").unwrap();
        assert!(notice.starts_with("device: "));
        if !cfg!(feature = "cuda") {
            assert!(d.is_cpu());
            assert!(select_device("cuda:0")
                .unwrap_err()
                .to_string()
                .contains("without CUDA support"));
        }
        assert!(select_device("cuda:x")
            .unwrap_err()
            .to_string()
            .contains("expected cuda:N"));
        assert!(select_device("tpu")
            .unwrap_err()
            .to_string()
            .contains("expected auto, cpu, cuda or cuda:N"));
    }
}
