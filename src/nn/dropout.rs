//! Seeded dropout on attention weights, counter-based so that any kernel can regenerate it.
//!
//! Whether element `idx` of the `(N, H, L, S')` weights is dropped is a pure function of
//! `(seed, idx)` ([`DropoutMask::keep`]): the reference path builds the whole mask from it, the
//! fused kernel draws the same bits tile by tile in the forward pass and again in the
//! backward pass, so the mask is never stored and both paths drop the same elements.
//!
//! The same masks drop any other tensor ([`seeded_dropout`]) and the branch of a residual
//! connection ([`seeded_dropout_add`]): on the CPU each is one pass forward and one backward.

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Result, Shape, Tensor};

use crate::cpu::{
    contiguous, fused, par, unsupported_dtype, with_slice, written_vec, CpuArg, Elem, Grads,
};
use crate::rng::splitmix64;

/// The drop test of one seed and probability: `keep(idx)` is false with probability `p`.
///
/// Element `idx` is dropped when the top 53 bits of SplitMix64 at position `idx` of the stream
/// seeded by `seed`, read as a number in `[0, 1)`, are below `p`.
#[derive(Clone, Copy, Debug)]
pub struct DropoutMask {
    key: u64,
    threshold: u64,
    offset: u64,
    /// `1 / (1 - p)`, the factor of kept elements (0 when `p = 1`).
    pub scale: f64,
}

impl DropoutMask {
    /// The mask of probability `p` (in `[0, 1]`) and `seed`.
    pub fn new(p: f64, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            candle::bail!("dropout probability has to be between 0 and 1, but got {p}")
        }
        // u < p  ⇔  bits < p·2^53 (exact: a power-of-two scale) ⇔ bits < ceil(p·2^53).
        let threshold = (p * (1u64 << 53) as f64).ceil() as u64;
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        Ok(Self {
            key: splitmix64(seed),
            threshold,
            offset: 0,
            scale,
        })
    }

    /// The same mask read from position `offset` of its stream on: element `idx` is tested as
    /// `offset + idx`. A part of a larger batch that starts at row `b0` takes
    /// `offset = b0 · (elements per row)` and draws exactly the whole batch's mask for its rows
    /// (the data-parallel ranks of `candle-mha-train`).
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The key, threshold, offset and scale of the test, for kernels that draw the same mask
    /// elsewhere (the CUDA kernel).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn parts(&self) -> (u64, u64, u64, f64) {
        (self.key, self.threshold, self.offset, self.scale)
    }

    /// Whether element `idx` (row-major over `(N, H, L, S')`) is kept.
    #[inline(always)]
    pub fn keep(&self, idx: u64) -> bool {
        let z = self.key.wrapping_add(
            idx.wrapping_add(self.offset)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        (splitmix64(z) >> 11) >= self.threshold
    }

    /// The mask as factors of a row-major tensor of `shape`: `scale` where kept, 0 where
    /// dropped, in `dtype` on `device`.
    pub fn factors(&self, shape: &Shape, dtype: DType, device: &Device) -> Result<Tensor> {
        let mut factors = vec![0f64; shape.elem_count()];
        self.factors_into(0, &mut factors);
        Tensor::from_vec(factors, shape, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)
    }
}

/// Zeroes each element of `x` with probability `p` and scales the rest by `1/(1-p)`, with a
/// mask drawn from `seed` ([`DropoutMask`], element `i` of the row-major `x`). `p = 1` gives
/// zeros (candle's `ops::dropout` rejects it).
///
/// PyTorch equivalent: `F.dropout(x, p, training=True)`; the mask differs from PyTorch's
/// (another generator), its distribution does not.
pub fn seeded_dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    seeded_dropout_at(x, p, seed, 0)
}

/// [`seeded_dropout`] with the mask read from position `offset` on
/// ([`DropoutMask::with_offset`]): `x` as rows of a larger tensor starting at element `offset`.
///
/// On the CPU in f32/f64 one pass forward and one backward, the mask drawn in the pass; elsewhere
/// `x` times a tensor of the mask's factors. Both give the same numbers.
pub fn seeded_dropout_at(x: &Tensor, p: f64, seed: u64, offset: u64) -> Result<Tensor> {
    let mask = DropoutMask::new(p, seed)?.with_offset(offset);
    if p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.zeros_like();
    }
    if fused(x) {
        return x.contiguous()?.apply_op1(SeededDropout(mask));
    }
    x * mask.factors(x.shape(), x.dtype(), x.device())?
}

/// `residual + seeded_dropout_at(y, p, seed, offset)`: a residual connection with dropout on its
/// branch, one pass forward and one backward on the CPU in f32/f64 (the same numbers as the two
/// ops).
///
/// PyTorch equivalent: `residual + F.dropout(y, p, training=True)` (another generator's mask).
///
/// # Shapes
/// `residual` and `y` the same shape, which is the output's.
pub fn seeded_dropout_add(
    residual: &Tensor,
    y: &Tensor,
    p: f64,
    seed: u64,
    offset: u64,
) -> Result<Tensor> {
    let mask = DropoutMask::new(p, seed)?.with_offset(offset);
    let one_op = p > 0.0
        && p < 1.0
        && fused(y)
        && residual.dtype() == y.dtype()
        && residual.device().same_device(y.device())
        && residual.shape() == y.shape();
    if !one_op {
        return residual + seeded_dropout_at(y, p, seed, offset)?;
    }
    residual
        .contiguous()?
        .apply_op2(&y.contiguous()?, SeededDropout(mask))
}

/// The fused CPU op of [`seeded_dropout_at`] (one argument) and [`seeded_dropout_add`] (the
/// residual, then the branch): the mask is drawn again in the backward pass, never stored.
struct SeededDropout(DropoutMask);

const OP: &str = "seeded dropout";

crate::cpu::custom_op!(CustomOp1 for SeededDropout, "seeded-dropout", fwd: fwd1, bwd: bwd1);
crate::cpu::custom_op!(CustomOp2 for SeededDropout, "seeded-dropout-add", fwd: fwd2, bwd: bwd2);

impl SeededDropout {
    fn fwd1(&self, [y]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        Ok((self.storage(None, y)?, y.1.shape().clone()))
    }

    fn fwd2(&self, [r, y]: [CpuArg; 2]) -> Result<(CpuStorage, Shape)> {
        Ok((self.storage(Some(r), y)?, y.1.shape().clone()))
    }

    fn bwd1(&self, [y]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Result<Grads<1>> {
        Ok([self.branch_grad(y, grad)?])
    }

    fn bwd2(&self, [r, y]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let dr = r.track_op().then(|| grad.clone());
        Ok([dr, self.branch_grad(y, grad)?])
    }

    /// `grad` times the mask's factors, when autograd needs `y`'s gradient.
    fn branch_grad(&self, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if !y.track_op() {
            return Ok(None);
        }
        fn times_mask<T: Elem>(m: &DropoutMask, grad: &Tensor) -> Result<Tensor> {
            let dy = with_slice::<T, _>(OP, grad, |g| Ok(m.apply(None, g)))?;
            Tensor::from_vec(dy, grad.shape(), grad.device())
        }
        match grad.dtype() {
            DType::F32 => times_mask::<f32>(&self.0, grad).map(Some),
            DType::F64 => times_mask::<f64>(&self.0, grad).map(Some),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }

    /// `r + y·f` (or `y·f`) elementwise, `f` the mask's factors.
    fn storage(&self, r: Option<CpuArg>, (ys, yl): CpuArg) -> Result<CpuStorage> {
        fn run<T: Elem>(m: &DropoutMask, r: Option<CpuArg>, y: CpuArg) -> Result<Vec<T>> {
            let y = contiguous::<T, _>(OP, y.0, y.1)?;
            let r = match r {
                Some((rs, rl)) => Some(contiguous::<T, _>(OP, rs, rl)?),
                None => None,
            };
            Ok(m.apply(r, y))
        }
        Ok(match ys {
            CpuStorage::F32(_) => CpuStorage::F32(run(&self.0, r, (ys, yl))?),
            CpuStorage::F64(_) => CpuStorage::F64(run(&self.0, r, (ys, yl))?),
            _ => return Err(unsupported_dtype(OP, ys.dtype())),
        })
    }
}

/// Elements per task of the fused pass.
const CHUNK: usize = 4096;

/// Elements whose factors are drawn at a time (a buffer on the stack).
const PIECE: usize = 256;

impl DropoutMask {
    /// `out[k]` = the factor of element `start + k`: `scale` (in `T`) where kept, 0 where
    /// dropped. The hash is the cost of a dropout pass, so this loop is compiled again for
    /// AVX-512 (its 64-bit multiply) and AVX2 and chosen at run time, as the f32 rows of
    /// `crate::cpu::simd` are.
    pub(crate) fn factors_into<T: Elem>(&self, start: u64, out: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::simd::avx512() && is_x86_feature_detected!("avx512dq") {
                // SAFETY: the CPU has these features (checked just above).
                return unsafe { factors_avx512(self, start, out) };
            }
            if crate::cpu::simd::avx2() {
                // SAFETY: as above.
                return unsafe { factors_avx2(self, start, out) };
            }
        }
        factors(self, start, out)
    }

    /// `r[i] + y[i]·f(i)` (`y[i]·f(i)` without `r`), `f(i)` the factor of element `i`: `scale`
    /// where kept, 0 where dropped (so `y`'s NaNs stay NaN, as with a factor tensor).
    fn apply<T: Elem>(&self, r: Option<&[T]>, y: &[T]) -> Vec<T> {
        let parallel = par::parallel_pass(y.len());
        // SAFETY: every piece of every chunk is written.
        unsafe {
            written_vec(y.len(), |out| {
                par::for_each_chunk_mut(out, CHUNK, parallel, |c, chunk| {
                    let mut f = [T::ZERO; PIECE];
                    for (p, out) in chunk.chunks_mut(PIECE).enumerate() {
                        let at = c * CHUNK + p * PIECE;
                        let (f, y) = (&mut f[..out.len()], &y[at..at + out.len()]);
                        self.factors_into(at as u64, f);
                        match r {
                            Some(r) => {
                                let r = &r[at..at + out.len()];
                                for (((o, &y), &f), &r) in out.iter_mut().zip(y).zip(&*f).zip(r) {
                                    *o = r + y * f;
                                }
                            }
                            None => {
                                for ((o, &y), &f) in out.iter_mut().zip(y).zip(&*f) {
                                    *o = y * f;
                                }
                            }
                        }
                    }
                })
            })
        }
    }
}

#[inline(always)]
fn factors<T: Elem>(m: &DropoutMask, start: u64, out: &mut [T]) {
    let scale = T::from_f64(m.scale);
    for (k, o) in out.iter_mut().enumerate() {
        *o = if m.keep(start + k as u64) {
            scale
        } else {
            T::ZERO
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn factors_avx512<T: Elem>(m: &DropoutMask, start: u64, out: &mut [T]) {
    factors(m, start, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn factors_avx2<T: Elem>(m: &DropoutMask, start: u64, out: &mut [T]) {
    factors(m, start, out)
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device, Result, Tensor, Var};

    use super::{seeded_dropout_add, seeded_dropout_at, DropoutMask};

    /// The generic ops' result: `r + y·factors` (the path off the CPU), and its gradients.
    fn by_factors(
        r: &Var,
        y: &Var,
        p: f64,
        offset: u64,
    ) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let mask = DropoutMask::new(p, 7)?.with_offset(offset);
        let f: Vec<f64> = (0..y.elem_count() as u64)
            .map(|i| if mask.keep(i) { mask.scale } else { 0.0 })
            .collect();
        let f = Tensor::new(f, &Device::Cpu)?.to_dtype(y.dtype())?;
        let dropped = (y.as_tensor() * f)?;
        let out = (r.as_tensor() + &dropped)?;
        let up = Tensor::arange(0f32, out.elem_count() as f32, &Device::Cpu)?
            .to_dtype(out.dtype())?
            .reshape(out.shape())?;
        let g = (&out * &up)?.sum_all()?.backward()?;
        let (gr, gy) = (g.get(r).unwrap().clone(), g.get(y).unwrap().clone());
        Ok((dropped, out, gr, gy))
    }

    /// The fused CPU op draws the mask the factor tensor holds: the same bits forward and
    /// backward, alone and added to a residual, in f32 and f64, at an offset, over several
    /// tasks (NaN in a dropped element stays NaN, as `NaN·0` does).
    #[test]
    fn fused_op_equals_factor_tensor_bit_for_bit() -> Result<()> {
        for dtype in [DType::F32, DType::F64] {
            for (p, offset, parallel) in [(0.2, 0, false), (0.5, 12_345, true), (0.9, 3, true)] {
                crate::cpu::par::force(Some(parallel));
                let n = 3 * super::CHUNK + 17;
                let mut yv: Vec<f64> = (0..n)
                    .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
                    .collect();
                yv[5] = f64::NAN;
                let y = Var::from_tensor(&Tensor::new(yv, &Device::Cpu)?.to_dtype(dtype)?)?;
                let r = Var::from_tensor(&(y.as_tensor().cos()? * 3.0)?)?;
                let (want_drop, want, want_gr, want_gy) = by_factors(&r, &y, p, offset)?;

                let dropped = seeded_dropout_at(y.as_tensor(), p, 7, offset)?;
                let out = seeded_dropout_add(r.as_tensor(), y.as_tensor(), p, 7, offset)?;
                let up = Tensor::arange(0f32, n as f32, &Device::Cpu)?.to_dtype(dtype)?;
                let g = (&out * &up)?.sum_all()?.backward()?;
                let g1 = (&dropped * &up)?.sum_all()?.backward()?;
                crate::cpu::par::force(None);

                let bits = |t: &Tensor| -> Result<Vec<u64>> {
                    let v = t.to_dtype(DType::F64)?.to_vec1::<f64>()?;
                    Ok(v.iter().map(|x| x.to_bits()).collect())
                };
                let case = format!("{dtype:?} p={p} offset={offset}");
                assert_eq!(bits(&dropped)?, bits(&want_drop)?, "dropout, {case}");
                assert_eq!(bits(&out)?, bits(&want)?, "dropout + residual, {case}");
                assert_eq!(
                    bits(g.get(&r).unwrap())?,
                    bits(&want_gr)?,
                    "residual grad, {case}"
                );
                assert_eq!(
                    bits(g.get(&y).unwrap())?,
                    bits(&want_gy)?,
                    "branch grad, {case}"
                );
                assert_eq!(
                    bits(g1.get(&y).unwrap())?,
                    bits(&want_gy)?,
                    "dropout grad, {case}"
                );
                assert!(dropped.to_dtype(DType::F64)?.to_vec1::<f64>()?[5].is_nan());
            }
        }
        Ok(())
    }

    /// Every compiled form of the factor loop this CPU runs gives `keep`'s factors, in f32 and
    /// f64, from any start (the fused kernels draw rows from the middle of the stream).
    #[test]
    fn factor_loops_follow_keep() -> Result<()> {
        let m = DropoutMask::new(0.3, 5)?.with_offset(99);
        let start = (1u64 << 40) + 3;
        let want: Vec<f64> = (0..1000)
            .map(|k| if m.keep(start + k) { m.scale } else { 0.0 })
            .collect();
        type Loop<T> = fn(&DropoutMask, u64, &mut [T]);
        let mut loops: Vec<(&str, Loop<f64>, Loop<f32>)> =
            vec![("scalar", super::factors, super::factors)];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::simd::avx2() {
                // SAFETY (both closures): called only where the CPU has the features.
                loops.push((
                    "avx2",
                    |m, s, o| unsafe { super::factors_avx2(m, s, o) },
                    |m, s, o| unsafe { super::factors_avx2(m, s, o) },
                ));
            }
            if crate::cpu::simd::avx512() && is_x86_feature_detected!("avx512dq") {
                loops.push((
                    "avx512",
                    |m, s, o| unsafe { super::factors_avx512(m, s, o) },
                    |m, s, o| unsafe { super::factors_avx512(m, s, o) },
                ));
            }
        }
        for (name, f64_loop, f32_loop) in loops {
            let (mut a, mut b) = (vec![-1f64; 1000], vec![-1f32; 1000]);
            f64_loop(&m, start, &mut a);
            f32_loop(&m, start, &mut b);
            assert_eq!(a, want, "{name}, f64");
            let want32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            assert_eq!(b, want32, "{name}, f32");
        }
        Ok(())
    }

    /// A residual that autograd does not track gets no gradient; shapes that differ fall back to
    /// candle's add, which refuses them.
    #[test]
    fn untracked_residual_and_mismatched_shapes() -> Result<()> {
        let y = Var::from_tensor(&Tensor::ones(64, DType::F32, &Device::Cpu)?)?;
        let r = Tensor::ones(64, DType::F32, &Device::Cpu)?;
        let g = seeded_dropout_add(&r, y.as_tensor(), 0.5, 1, 0)?
            .sum_all()?
            .backward()?;
        assert!(g.get(&r).is_none());
        assert!(g.get(&y).is_some());
        let short = Tensor::ones(63, DType::F32, &Device::Cpu)?;
        assert!(seeded_dropout_add(&short, y.as_tensor(), 0.5, 1, 0).is_err());
        Ok(())
    }
}
