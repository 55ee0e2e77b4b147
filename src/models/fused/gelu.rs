//! The exact GELU `x·Φ(x)` as one op with its backward.

use candle::backend::BackendStorage;
use candle::cpu::erf::{erf_f32, erf_f64};
use candle::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::rows::{cpu, fused, slice};

/// `erf` in the operand's precision (candle's `gelu_erf` uses the same ones).
trait Erf: WithDType {
    fn erf(self) -> Self;
}

impl Erf for f32 {
    fn erf(self) -> Self {
        erf_f32(self)
    }
}

impl Erf for f64 {
    fn erf(self) -> Self {
        erf_f64(self)
    }
}

const CHUNK: usize = 4096;

fn forward<T: Erf>(x: &[T]) -> Vec<T> {
    let (half, r2) = (
        T::from_f64(0.5),
        T::from_f64(std::f64::consts::FRAC_1_SQRT_2),
    );
    let mut y = vec![T::from_f64(0.0); x.len()];
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = (T::from_f64(1.0) + (x * r2).erf()) * half * x;
            }
        });
    y
}

/// `g · (Φ(x) + x·φ(x))`, φ the standard normal density.
fn backward<T: Erf>(x: &[T], g: &[T]) -> Vec<T> {
    let (half, r2) = (
        T::from_f64(0.5),
        T::from_f64(std::f64::consts::FRAC_1_SQRT_2),
    );
    // 1/√(2π), in full (candle's own backward rounds it to 0.398942).
    let inv_sqrt_2pi = T::from_f64(0.5 * std::f64::consts::FRAC_2_SQRT_PI * r2.to_f64());
    let mut dx = vec![T::from_f64(0.0); x.len()];
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
        .for_each(|(dx, (x, g))| {
            for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
                let cdf = (T::from_f64(1.0) + (x * r2).erf()) * half;
                let pdf = T::from_f64((-(x * x * half).to_f64()).exp()) * inv_sqrt_2pi;
                *dx = g * (cdf + x * pdf);
            }
        });
    dx
}

struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "fused-gelu-erf"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = match s {
            CpuStorage::F32(_) => CpuStorage::F32(forward(slice::<f32>("gelu", s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(forward(slice::<f64>("gelu", s, l)?)),
            _ => candle::bail!("fused gelu runs in f32 or f64, got {:?}", s.dtype()),
        };
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let (xs, xl) = x.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (xs, gs) = (cpu(&xs)?, cpu(&gs)?);
        let dx = match xs {
            CpuStorage::F32(_) => {
                let dx = backward(slice::<f32>("gelu", xs, xl)?, slice("gelu", gs, gl)?);
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            CpuStorage::F64(_) => {
                let dx = backward(slice::<f64>("gelu", xs, xl)?, slice("gelu", gs, gl)?);
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            _ => candle::bail!("fused gelu runs in f32 or f64, got {:?}", x.dtype()),
        };
        Ok(Some(dx))
    }
}

/// The exact GELU, `0.5·x·(1 + erf(x/√2))`, elementwise: one op forward and backward on the
/// CPU in f32/f64, candle's `gelu_erf` elsewhere.
///
/// PyTorch equivalent: `F.gelu(x)` (`approximate="none"`).
pub(crate) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if !fused(x) {
        return x.gelu_erf();
    }
    x.contiguous()?.apply_op1(GeluErf)
}
