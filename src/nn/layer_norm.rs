//! Layer normalisation over the last dimension: the [`LayerNorm`] layer and its op, one op
//! forward and backward on the CPU in f32/f64 (candle-nn's `LayerNorm` takes a fused path
//! without backward).
//!
//! Row statistics are accumulated in f64; the backward pass recomputes them from `x` (one pass
//! over a row) instead of keeping them.

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Module, Result, Shape, Tensor, WithDType};
use candle_nn::{Init, VarBuilder};
use rayon::prelude::*;

use crate::cpu::{contiguous, filled_vec, fused, unsupported_dtype, ROWS_PER_TASK};
use crate::numerics::softmax_dtype;

/// `Σ f(x)` over a row in f64, in eight interleaved partial sums (lane `j` takes elements
/// `j, j + 8, …`) added at the end: independent lanes, so the compiler keeps them in vector
/// registers where one running sum would be a chain of dependent scalar additions.
#[inline(always)]
fn lane_sum<T: WithDType>(row: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += f(x.to_f64());
        }
    }
    for (a, x) in acc.iter_mut().zip(rest) {
        *a += f(x.to_f64());
    }
    acc.iter().sum()
}

/// `Σ a·b` in the lanes of [`lane_sum`].
#[inline(always)]
fn lane_sum_pairs(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; LANES];
    for (a, b) in a.chunks(LANES).zip(b.chunks(LANES)) {
        for ((s, a), b) in acc.iter_mut().zip(a).zip(b) {
            *s += a * b;
        }
    }
    acc.iter().sum()
}

/// Partial sums of [`lane_sum`]: one AVX-512 vector of f64.
const LANES: usize = 8;

/// Mean and `1/√(var + eps)` of a row (biased variance, as PyTorch).
fn stats<T: WithDType>(row: &[T], eps: f64) -> (f64, f64) {
    let n = row.len().max(1) as f64;
    let mean = lane_sum(row, |x| x) / n;
    let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

fn forward<T: WithDType>(x: &[T], w: &[T], b: &[T], eps: f64) -> Result<Vec<T>> {
    let d = whole_rows(x, w)?;
    if b.len() != d {
        candle::bail!("{OP}: bias of {} elements for a weight of {d}", b.len())
    }
    let chunk = (ROWS_PER_TASK * d).max(1);
    // SAFETY: x is whole rows of d (checked), and every row of y is written whole (no zero
    // fill first: a pass over a buffer as large as the activations).
    unsafe {
        filled_vec(x.len(), |y| {
            y.par_chunks_mut(chunk)
                .zip(x.par_chunks(chunk))
                .for_each(|(y, x)| {
                    for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                        let (mean, rstd) = stats(x, eps);
                        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                            let xhat = (x.to_f64() - mean) * rstd;
                            y.write(T::from_f64(xhat * w.to_f64() + b.to_f64()));
                        }
                    }
                });
            Ok(())
        })
    }
}

/// The row length `d` (= `w.len()`), checking that `x` is whole rows of it (the output is
/// written row by row, so a remainder would be left unwritten).
fn whole_rows<T>(x: &[T], w: &[T]) -> Result<usize> {
    let d = w.len();
    if !x.len().is_multiple_of(d) {
        candle::bail!(
            "{OP}: {} elements are not whole rows of the weight's {d}",
            x.len()
        )
    }
    Ok(d)
}

/// `(dx, dw, db)`: per row `dx = rstd·(g∘w − mean(g∘w) − x̂·mean(g∘w∘x̂))`; `dw = Σ g∘x̂`,
/// `db = Σ g` over the rows.
fn backward<T: WithDType>(x: &[T], w: &[T], g: &[T], eps: f64) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let d = whole_rows(x, w)?;
    if g.len() != x.len() {
        candle::bail!(
            "{OP}: gradient of {} elements for an input of {}",
            g.len(),
            x.len()
        )
    }
    let chunk = (ROWS_PER_TASK * d).max(1);
    let mut parts = Vec::new();
    // SAFETY: x and g are whole rows of d (checked), and every row of dx is written whole (no
    // zero fill first).
    let dx = unsafe {
        filled_vec(x.len(), |dx| {
            parts = dx
                .par_chunks_mut(chunk)
                .zip(x.par_chunks(chunk).zip(g.par_chunks(chunk)))
                .map(|(dx, (x, g))| {
                    let (mut dw, mut db) = (vec![0f64; d], vec![0f64; d]);
                    let (mut xhat, mut gw) = (vec![0f64; d], vec![0f64; d]);
                    for ((dx, x), g) in dx
                        .chunks_exact_mut(d)
                        .zip(x.chunks_exact(d))
                        .zip(g.chunks_exact(d))
                    {
                        let (mean, rstd) = stats(x, eps);
                        // Element-wise first (vectorised), then the two row sums in lanes.
                        let per_column = dw.iter_mut().zip(db.iter_mut());
                        for (((xh, gw), (dw, db)), ((x, g), w)) in xhat
                            .iter_mut()
                            .zip(gw.iter_mut())
                            .zip(per_column)
                            .zip(x.iter().zip(g).zip(w))
                        {
                            let g = g.to_f64();
                            *xh = (x.to_f64() - mean) * rstd;
                            *dw += g * *xh;
                            *db += g;
                            *gw = g * w.to_f64();
                        }
                        let c1 = lane_sum(&gw, |v| v) / d as f64;
                        let c2 = lane_sum_pairs(&gw, &xhat) / d as f64;
                        for ((dx, gw), xh) in dx.iter_mut().zip(&gw).zip(&xhat) {
                            dx.write(T::from_f64(rstd * (gw - c1 - xh * c2)));
                        }
                    }
                    (dw, db)
                })
                // Partial sums collected in chunk order and added in that order: the same dw
                // and db whichever thread ran which chunk, so training resumes bit-identically.
                .collect::<Vec<_>>();
            Ok(())
        })
    }?;
    let (dw, db) = parts.into_iter().fold(
        (vec![0f64; d], vec![0f64; d]),
        |(mut aw, mut ab), (bw, bb)| {
            aw.iter_mut().zip(&bw).for_each(|(a, b)| *a += b);
            ab.iter_mut().zip(&bb).for_each(|(a, b)| *a += b);
            (aw, ab)
        },
    );
    let cast = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect();
    Ok((dx, cast(dw), cast(db)))
}

struct LayerNormOp {
    eps: f64,
}

const OP: &str = "fused layer norm";

impl LayerNormOp {
    fn fwd_typed<T: WithDType>(&self, x: CpuArg, w: CpuArg, b: CpuArg) -> Result<Vec<T>> {
        forward::<T>(
            contiguous(OP, x.0, x.1)?,
            contiguous(OP, w.0, w.1)?,
            contiguous(OP, b.0, b.1)?,
            self.eps,
        )
    }

    /// `(dx, dw, db)` as tensors shaped like `x` and `w`.
    fn bwd_typed<T: WithDType>(
        &self,
        x: &Tensor,
        w: &Tensor,
        grad: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (dx, dw, db) = backward::<T>(
            contiguous(OP, &*xs, xl)?,
            contiguous(OP, &*ws, wl)?,
            contiguous(OP, &*gs, gl)?,
            self.eps,
        )?;
        let dev = x.device();
        Ok((
            Tensor::from_vec(dx, x.shape(), dev)?,
            Tensor::from_vec(dw, w.shape(), dev)?,
            Tensor::from_vec(db, w.shape(), dev)?,
        ))
    }
}

crate::cpu::custom_op!(CustomOp3 for LayerNormOp, "fused-layer-norm", fwd: fwd, bwd: bwd);

impl LayerNormOp {
    fn fwd(&self, [x, w, b]: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        let (xs, xl) = x;
        let y = match xs {
            CpuStorage::F32(_) => CpuStorage::F32(self.fwd_typed(x, w, b)?),
            CpuStorage::F64(_) => CpuStorage::F64(self.fwd_typed(x, w, b)?),
            _ => return Err(unsupported_dtype(OP, xs.dtype())),
        };
        Ok((y, xl.shape().clone()))
    }

    fn bwd(&self, [x, w, _]: [&Tensor; 3], _: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        let grad = grad.contiguous()?;
        let (dx, dw, db) = match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, w, &grad)?,
            DType::F64 => self.bwd_typed::<f64>(x, w, &grad)?,
            dt => return Err(unsupported_dtype(OP, dt)),
        };
        Ok([Some(dx), Some(dw), Some(db)])
    }
}

/// Layer normalisation of `x (…, D)` over its last dimension with `weight [D]`, `bias [D]`:
/// one op forward and backward on the CPU in f32/f64, candle's generic ops elsewhere (the row
/// statistics of f16/bf16 in f32, the result in `x`'s dtype).
///
/// PyTorch equivalent: `F.layer_norm(x, (D,), weight, bias, eps)`.
pub(crate) fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let d = weight.dims1()?;
    if x.dim(candle::D::Minus1)? != d || bias.dims() != [d] {
        candle::bail!(
            "layer norm: x {:?} must end in D = {d} like weight {:?} and bias {:?}",
            x.dims(),
            weight.dims(),
            bias.dims()
        )
    }
    if !fused(x) || x.dtype() != weight.dtype() || x.dtype() != bias.dtype() {
        let dt = softmax_dtype(x.dtype());
        let xs = x.to_dtype(dt)?;
        let mean = xs.mean_keepdim(candle::D::Minus1)?;
        let centered = xs.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(candle::D::Minus1)?;
        let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
        return normed
            .broadcast_mul(&weight.to_dtype(dt)?)?
            .broadcast_add(&bias.to_dtype(dt)?)?
            .to_dtype(x.dtype());
    }
    x.contiguous()?.apply_op3(
        &weight.contiguous()?,
        &bias.contiguous()?,
        LayerNormOp { eps },
    )
}

/// Layer normalisation over the last dimension, with a backward: one op on the CPU in
/// f32/f64 (row statistics in f64), candle's generic ops elsewhere.
///
/// PyTorch equivalent: `nn.LayerNorm(dim, eps=1e-5, bias=True)`: `weight` ones, `bias` zeros
/// (absent with `bias=False`); biased variance. candle-nn's `LayerNorm` takes a fused path
/// without backward.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// Takes (or creates) `weight` and `bias` under `vb`.
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Self::new_with_bias(dim, eps, true, vb)
    }

    /// Takes (or creates) `weight`, and `bias` when `bias` is true, under `vb`.
    ///
    /// PyTorch equivalent: `nn.LayerNorm(dim, eps, bias=bias)`.
    pub fn new_with_bias(dim: usize, eps: f64, bias: bool, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = match bias {
            true => Some(vb.get_with_hints(dim, "bias", Init::Const(0.0))?),
            false => None,
        };
        Ok(Self { weight, bias, eps })
    }

    /// `weight [dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `bias [dim]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The parameters' dtype.
    pub(crate) fn dtype(&self) -> candle::DType {
        self.weight.dtype()
    }

    /// Appends `prefix.weight` (and `prefix.bias`) to `out`.
    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((format!("{prefix}.weight"), self.weight.clone()));
        if let Some(b) = &self.bias {
            out.push((format!("{prefix}.bias"), b.clone()));
        }
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The fused op wants a bias; without one a constant zero bias gives the same numbers.
        let zeros;
        let bias = match &self.bias {
            Some(b) => b,
            None => {
                zeros = self.weight.zeros_like()?;
                &zeros
            }
        };
        layer_norm(x, &self.weight, bias, self.eps)
    }
}
