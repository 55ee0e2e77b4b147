//! [`RmsNorm`]: root-mean-square normalisation over the last dimension, as `torch.nn.RMSNorm`
//! computes it and as Llama's `LlamaRMSNorm` does (in f32, then cast back). On the CPU in
//! f32/f64 (input and weight of one dtype) one op forward and one backward, the row's mean
//! square in f64 (candle-nn's `rms_norm` is fused without a backward; as candle's generic ops
//! it kept eight tensors as large as the input per norm for the backward pass); elsewhere
//! candle's differentiable ops.

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Module, Result, Shape, Tensor, WithDType, D};
use candle_nn::{Init, VarBuilder};
use rayon::prelude::*;

use crate::cpu::{contiguous, filled_vec, fused, unsupported_dtype, CpuArg, Grads, ROWS_PER_TASK};

const OP: &str = "fused rms norm";

/// `1/√(mean(x²) + eps)` of a row, in f64.
fn rstd<T: WithDType>(row: &[T], eps: f64) -> f64 {
    let n = row.len().max(1) as f64;
    let ss: f64 = row.iter().map(|x| x.to_f64() * x.to_f64()).sum();
    1.0 / (ss / n + eps).sqrt()
}

struct RmsNormOp {
    eps: f64,
}

impl RmsNormOp {
    fn fwd_t<T: WithDType>(&self, x: CpuArg, w: CpuArg) -> Result<(CpuStorage, Shape)> {
        let (xs, ws) = (
            contiguous::<T, _>(OP, x.0, x.1)?,
            contiguous::<T, _>(OP, w.0, w.1)?,
        );
        let d = ws.len();
        if d == 0 || !xs.len().is_multiple_of(d) {
            candle::bail!(
                "{OP}: {} elements are not whole rows of the weight's {d}",
                xs.len()
            )
        }
        let chunk = (ROWS_PER_TASK * d).max(1);
        // SAFETY: every row of y is written whole (x is whole rows, checked).
        let y = unsafe {
            filled_vec(xs.len(), |y| {
                y.par_chunks_mut(chunk)
                    .zip(xs.par_chunks(chunk))
                    .for_each(|(y, x)| {
                        for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                            let r = rstd(x, self.eps);
                            for ((y, x), w) in y.iter_mut().zip(x).zip(ws) {
                                y.write(T::from_f64(x.to_f64() * r * w.to_f64()));
                            }
                        }
                    });
                Ok(())
            })?
        };
        Ok((T::to_cpu_storage_owned(y), x.1.shape().clone()))
    }

    fn fwd(&self, [x, w]: [CpuArg; 2]) -> Result<(CpuStorage, Shape)> {
        match x.0 {
            CpuStorage::F32(_) => self.fwd_t::<f32>(x, w),
            CpuStorage::F64(_) => self.fwd_t::<f64>(x, w),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    /// Per row `dx = r·(g∘w) − r³·x·Σ(g∘w∘x)/D` with `r = 1/√(mean(x²)+eps)`; `dw = Σ g∘x·r`
    /// over the rows (partial sums added in chunk order: the same on every run).
    fn bwd_t<T: WithDType>(&self, x: &Tensor, w: &Tensor, g: &Tensor) -> Result<Grads<2>> {
        let (xg, xl) = x.storage_and_layout();
        let (wg, wl) = w.storage_and_layout();
        let (gg, gl) = g.storage_and_layout();
        let (xs, ws, gs) = (
            contiguous::<T, _>(OP, &*xg, xl)?,
            contiguous::<T, _>(OP, &*wg, wl)?,
            contiguous::<T, _>(OP, &*gg, gl)?,
        );
        let d = ws.len();
        if gs.len() != xs.len() || d == 0 || !xs.len().is_multiple_of(d) {
            candle::bail!(
                "{OP}: gradient of {} elements for an input of {}",
                gs.len(),
                xs.len()
            )
        }
        let chunk = (ROWS_PER_TASK * d).max(1);
        let mut parts = Vec::new();
        // SAFETY: every row of dx is written whole.
        let dx = unsafe {
            filled_vec(xs.len(), |dx| {
                parts = dx
                    .par_chunks_mut(chunk)
                    .zip(xs.par_chunks(chunk).zip(gs.par_chunks(chunk)))
                    .map(|(dx, (x, g))| {
                        let mut dw = vec![0f64; d];
                        for ((dx, x), g) in dx
                            .chunks_exact_mut(d)
                            .zip(x.chunks_exact(d))
                            .zip(g.chunks_exact(d))
                        {
                            let r = rstd(x, self.eps);
                            let mut c = 0f64;
                            for (((dw, x), g), w) in dw.iter_mut().zip(x).zip(g).zip(ws) {
                                let (x, g) = (x.to_f64(), g.to_f64());
                                *dw += g * x * r;
                                c += g * w.to_f64() * x;
                            }
                            let c = c * r * r * r / d as f64;
                            for (((dx, x), g), w) in dx.iter_mut().zip(x).zip(g).zip(ws) {
                                let gw = g.to_f64() * w.to_f64();
                                dx.write(T::from_f64(r * gw - c * x.to_f64()));
                            }
                        }
                        dw
                    })
                    .collect::<Vec<_>>();
                Ok(())
            })?
        };
        let dw = parts.into_iter().fold(vec![0f64; d], |mut a, b| {
            a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
            a
        });
        let dw: Vec<T> = dw.into_iter().map(T::from_f64).collect();
        Ok([
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, w.shape(), w.device())?),
        ])
    }

    fn bwd(&self, [x, w]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let grad = grad.contiguous()?;
        match x.dtype() {
            DType::F32 => self.bwd_t::<f32>(x, w, &grad),
            DType::F64 => self.bwd_t::<f64>(x, w, &grad),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

crate::cpu::custom_op!(CustomOp2 for RmsNormOp, "fused-rms-norm", fwd: fwd, bwd: bwd);

/// Where an [`RmsNorm`] computes and where its weight multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RmsNormKind {
    /// `torch.nn.RMSNorm`: `x · rsqrt(mean(x²) + eps) · weight`, all in the input's dtype.
    Torch,
    /// Hugging Face's `LlamaRMSNorm` (Qwen2's and Mistral's too): normalised in f32, cast back
    /// to the input's dtype, then multiplied by the weight (in the weight's dtype).
    #[default]
    Llama,
}

/// RMS normalisation over the last dimension, with a learned scale.
///
/// PyTorch equivalent: `torch.nn.RMSNorm(dim, eps)` ([`RmsNormKind::Torch`]; `eps=None` is
/// the dtype's machine epsilon, [`RmsNorm::torch_default_eps`]) or transformers'
/// `LlamaRMSNorm(dim, eps)` ([`RmsNormKind::Llama`]); parameter `weight [D]`, initialised to
/// ones.
///
/// # Shapes
/// `x (…, D)` → `(…, D)`.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    kind: RmsNormKind,
}

impl RmsNorm {
    /// Takes (or creates, as ones) `weight [dim]` under `vb`.
    pub fn new(dim: usize, eps: f64, kind: RmsNormKind, vb: VarBuilder) -> Result<Self> {
        check_eps(eps)?;
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        Ok(Self { weight, eps, kind })
    }

    /// A layer of the given weight as it is.
    pub fn from_weight(weight: Tensor, eps: f64, kind: RmsNormKind) -> Result<Self> {
        check_eps(eps)?;
        if weight.rank() != 1 {
            candle::bail!("RmsNorm: weight must be 1-D, got dims {:?}", weight.dims())
        }
        Ok(Self { weight, eps, kind })
    }

    /// `torch.finfo(dtype).eps`: `torch.nn.RMSNorm`'s epsilon when given `eps=None`.
    pub fn torch_default_eps(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => f64::EPSILON,
            DType::F16 => 0.0009765625,
            DType::BF16 => 0.0078125,
            _ => f64::from(f32::EPSILON),
        }
    }

    /// `weight [D]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

fn check_eps(eps: f64) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        candle::bail!("RmsNorm: eps must be finite and not negative, got {eps}")
    }
    Ok(())
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.weight.dims1()?;
        if x.dims().last() != Some(&d) {
            candle::bail!(
                "RmsNorm: input of dims {:?}, expected a last dim of {d}",
                x.dims()
            )
        }
        let dtype = x.dtype();
        // Both kinds compute the same in the weight's own dtype when it is f32 or f64.
        if fused(x) && self.weight.dtype() == dtype {
            return x
                .contiguous()?
                .apply_op2(&self.weight.contiguous()?, RmsNormOp { eps: self.eps });
        }
        let compute = match self.kind {
            RmsNormKind::Llama if dtype != DType::F64 => DType::F32,
            _ => dtype,
        };
        let x32 = x.to_dtype(compute)?;
        let inv = (x32.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?
            .sqrt()?
            .recip()?;
        let y = x32.broadcast_mul(&inv)?.to_dtype(dtype)?;
        match self.kind {
            RmsNormKind::Torch => y.broadcast_mul(&self.weight.to_dtype(dtype)?),
            // PyTorch's type promotion of `weight * x`: the wider of the two dtypes.
            RmsNormKind::Llama => {
                let w = &self.weight;
                let out = match (w.dtype(), dtype) {
                    (a, b) if a == b => a,
                    (DType::F64, _) | (_, DType::F64) => DType::F64,
                    _ => DType::F32,
                };
                y.to_dtype(out)?.broadcast_mul(&w.to_dtype(out)?)
            }
        }
    }
}
