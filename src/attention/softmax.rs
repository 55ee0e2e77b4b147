//! A differentiable softmax that gives zeros, not NaN, for a row whose every entry is `-inf`.

use candle::{DType, Result, Tensor, D};

use crate::cpu::Grads;

/// Softmax over the last dimension, built from differentiable ops, where a row that is
/// entirely `-inf` (every key masked) gives all zeros and zero, finite gradients.
///
/// PyTorch equivalent: `torch._safe_softmax(x, -1)`, used by
/// `F.scaled_dot_product_attention` since 2.5; the plain `softmax` of MHA's
/// `need_weights=True` path gives NaN for such rows (pytorch#41508).
///
/// candle's `softmax_last_dim` has no backward, which is why this is written out.
pub fn safe_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.elem_count() == 0 {
        // Nothing to normalise (an empty batch, query or key set); reductions would fail.
        return Ok(x.clone());
    }
    // The max only shifts for stability: detached, it needs no gradient. A -inf max (a fully
    // masked row) is raised to the dtype's lowest finite value so that `x - max` stays -inf.
    let lowest = match x.dtype() {
        DType::F64 => f64::MIN,
        _ => f64::from(f32::MIN),
    };
    let max = x.max_keepdim(D::Minus1)?.detach().maximum(lowest)?;
    let num = x.broadcast_sub(&max)?.exp()?;
    let den = num.sum_keepdim(D::Minus1)?;
    // A non-empty row has den >= 1 (its max contributes exp(0)); den == 0 only for a fully
    // masked row, whose numerators are all 0: divide those by 1 instead.
    let den = (&den + den.eq(0.0)?.to_dtype(den.dtype())?)?;
    num.broadcast_div(&den)
}

/// Softmax over the last dimension of `scores + mask` in one kernel (candle's
/// `softmax_last_dim`: a fused CUDA kernel, where [`safe_softmax_last_dim`]'s six ops each
/// pass over the `(N, H, L, S)` scores), with a backward, and [`safe_softmax_last_dim`]'s
/// zeros for a fully masked row. The attention reference path takes it off the CPU.
///
/// `-inf` in `mask` becomes the dtype's lowest finite value, so that no row is all `-inf`
/// (the kernel would give NaN): a masked score still weighs exactly 0 beside any allowed one.
/// Rows whose every mask entry is `-inf` come out uniform from the kernel and are set to zero
/// afterwards; the mask (not the scores) says which, so this costs a pass over the scores only
/// when such a row exists (and, with a mask, reading one flag back from the device).
///
/// PyTorch equivalent: `torch._safe_softmax(scores + mask, -1)`.
pub(crate) fn masked_softmax_fused(scores: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    if scores.elem_count() == 0 {
        return Ok(scores.clone());
    }
    let lowest = match scores.dtype() {
        DType::F64 => f64::MIN,
        DType::F32 => f64::from(f32::MIN),
        _ => -65504.0, // f16's lowest, finite in bf16 too
    };
    let Some(mask) = mask else {
        return softmax_last_dim_fused(scores);
    };
    let probs = softmax_last_dim_fused(&scores.broadcast_add(&mask.maximum(lowest)?)?)?;
    // 1 for a row with an allowed key, 0 for a fully masked one; shape (.., L, 1) of the mask.
    let allowed = mask.max_keepdim(D::Minus1)?.gt(f64::NEG_INFINITY)?;
    if allowed.flatten_all()?.min(0)?.to_scalar::<u8>()? == 1 {
        return Ok(probs);
    }
    probs.broadcast_mul(&allowed.to_dtype(probs.dtype())?)
}

/// candle's fused `softmax_last_dim` (forward only) with the softmax backward
/// `dx = y ⊙ (g − Σ g ⊙ y)` in generic ops: `y` goes in as a second, detached argument whose
/// storage the op copies out.
fn softmax_last_dim_fused(x: &Tensor) -> Result<Tensor> {
    let x = x.contiguous()?;
    let y = candle_nn::ops::softmax_last_dim(&x.detach())?;
    match x.track_op() {
        true => x.apply_op2(&y, SoftmaxGrad),
        false => Ok(y),
    }
}

/// Returns its second argument; the gradient goes to the first as softmax's, with the second
/// as the softmax output.
struct SoftmaxGrad;

crate::cpu::custom_op!(CustomOp2 for SoftmaxGrad, "softmax-last-dim-grad",
    fwd: second, bwd: bwd, cuda: second);

impl SoftmaxGrad {
    fn second<S: candle::backend::BackendStorage>(
        &self,
        [_, (y, yl)]: [(&S, &candle::Layout); 2],
    ) -> Result<(S, candle::Shape)> {
        Ok((y.try_clone(yl)?, yl.shape().clone()))
    }

    fn bwd(&self, [_, y]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let gy = (grad * y)?;
        let dx = (&gy - y.broadcast_mul(&gy.sum_keepdim(D::Minus1)?)?)?;
        Ok([Some(dx), None])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{Device, Var};

    #[test]
    fn fully_masked_row_is_zero_with_finite_grad() -> Result<()> {
        let inf = f32::NEG_INFINITY;
        let x = Var::new(&[[1f32, 2., 3.], [0., 0., 0.]], &Device::Cpu)?;
        let mask = Tensor::new(&[[0f32, inf, 0.], [inf, inf, inf]], &Device::Cpu)?;
        let p = safe_softmax_last_dim(&x.as_tensor().broadcast_add(&mask)?)?;
        let rows = p.to_vec2::<f32>()?;
        assert_eq!(rows[1], vec![0., 0., 0.]);
        let e = (1f32.exp(), 3f32.exp());
        assert!((rows[0][0] - e.0 / (e.0 + e.1)).abs() < 1e-7);
        assert_eq!(rows[0][1], 0.0);
        let w = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu)?;
        let grads = (p * w)?.sum_all()?.backward()?;
        let g = grads
            .get(&x)
            .expect("softmax must pass gradients")
            .to_vec2::<f32>()?;
        assert!(g.iter().flatten().all(|v| v.is_finite()));
        assert_eq!(g[1], vec![0., 0., 0.]);
        Ok(())
    }

    /// The one-kernel softmax equals the op-by-op safe softmax, forward and gradient, with no
    /// mask, an additive float mask, `-inf` entries, and rows fully masked by the key padding
    /// (`(N, 1, 1, S)`) or by the attention mask (`(1, 1, L, S)`).
    #[test]
    fn fused_masked_softmax_equals_the_safe_one() -> Result<()> {
        use crate::rng::normal;
        let dev = Device::Cpu;
        let inf = f64::NEG_INFINITY;
        let (n, h, l, s) = (2, 3, 4, 5);
        let mut attn = vec![0f64; l * s];
        attn[s + 2] = inf; // one masked key
        attn[2 * s + 1] = -1.5; // a bias
        for j in 0..s {
            attn[3 * s + j] = inf; // query 3: every key masked
        }
        let mut kpm = vec![0f64; n * s];
        for j in 0..s {
            kpm[s + j] = inf; // batch 1: every key masked
        }
        kpm[3] = inf;
        let attn = Tensor::from_vec(attn, (1, 1, l, s), &dev)?;
        let kpm = Tensor::from_vec(kpm, (n, 1, 1, s), &dev)?;
        for dtype in [DType::F32, DType::F64] {
            let tol = if dtype == DType::F64 { 1e-14 } else { 1e-6 };
            let masks = [
                None,
                Some(attn.clone()),
                Some(attn.broadcast_add(&kpm.narrow(0, 0, 1)?)?),
                Some(kpm.clone()),
            ];
            for (case, mask) in masks.iter().enumerate() {
                let mask = mask.as_ref().map(|m| m.to_dtype(dtype)).transpose()?;
                let x = Var::from_tensor(&normal(0., 2., (n, h, l, s), dtype, &dev, 7)?)?;
                let r = normal(0., 1., (n, h, l, s), dtype, &dev, 8)?;
                let fused = masked_softmax_fused(&x, mask.as_ref())?;
                let safe = match &mask {
                    Some(m) => safe_softmax_last_dim(&x.broadcast_add(m)?)?,
                    None => safe_softmax_last_dim(&x)?,
                };
                let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
                    let d = (a - b)?.abs()?.flatten_all()?.max(0)?;
                    d.to_dtype(DType::F64)?.to_scalar::<f64>()
                };
                assert!(diff(&fused, &safe)? <= tol, "{dtype:?} case {case}: probs");
                let g_fused = (&fused * &r)?.sum_all()?.backward()?;
                let g_safe = (&safe * &r)?.sum_all()?.backward()?;
                let (a, b) = (g_fused.get(&x).unwrap(), g_safe.get(&x).unwrap());
                assert!(diff(a, b)? <= tol, "{dtype:?} case {case}: gradient");
            }
        }
        Ok(())
    }
}
