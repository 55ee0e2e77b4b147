//! A differentiable softmax that gives zeros, not NaN, for a row whose every entry is `-inf`.

use candle::{DType, Result, Tensor, D};

/// The dtype attention scores are normalised in: f32 for the half types (f16/bf16 sums lose
/// too much), the input dtype otherwise.
pub(crate) fn softmax_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

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
}
