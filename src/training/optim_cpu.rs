//! The optimizer's CPU loops: AdamW's update and a gradient's squared norm in one parallel pass
//! each, where candle's tensor ops take about ten passes (and as many allocations) for the update.
//! PyTorch's operations in its order (`_single_tensor_adamw`), in the parameter's dtype.

use candle::{CpuStorage, Device, Layout, Result, Storage, Tensor, WithDType};
use rayon::prelude::*;

use crate::cpu::{contiguous, Elem};

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// The contiguous elements behind a CPU storage, or `None` (the caller's tensor path runs).
fn elems<'a, T: WithDType>(s: &'a Storage, l: &Layout) -> Option<&'a [T]> {
    contiguous("AdamW", s, l).ok()
}

/// AdamW's scalars for one step of one parameter.
pub(super) struct Update {
    /// `1 - lr·weight_decay`.
    pub decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// `lr / (1 - β1ᵗ)`.
    pub step_size: f64,
    /// `√(1 - β2ᵗ)`.
    pub bias2_sqrt: f64,
    pub eps: f64,
}

fn update<T: Elem>(u: &Update, p: &[T], g: &[T], m: &[T], v: &[T]) -> (Vec<T>, Vec<T>, Vec<T>) {
    let c = |x: f64| T::from_f64(x);
    let (decay, b1, b2) = (c(u.decay), c(1.0 - u.beta1), c(u.beta2));
    let (nb2, step_size, bias2_sqrt, eps) =
        (c(1.0 - u.beta2), c(u.step_size), c(u.bias2_sqrt), c(u.eps));
    let n = p.len();
    // Written in place of a zero fill (three passes as large as the parameters).
    let (mut p2, mut m2, mut v2) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    p2.spare_capacity_mut()[..n]
        .par_chunks_mut(CHUNK)
        .zip(
            m2.spare_capacity_mut()[..n]
                .par_chunks_mut(CHUNK)
                .zip(v2.spare_capacity_mut()[..n].par_chunks_mut(CHUNK)),
        )
        .enumerate()
        .for_each(|(k, (p2, (m2, v2)))| {
            let r = k * CHUNK..(k * CHUNK + p2.len());
            let (p, g, m, v) = (&p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]);
            for i in 0..p2.len() {
                // m.lerp_(g, 1 - β1); v = v·β2 + g²·(1 - β2); p = p·decay - m/denom·step_size.
                let mi = m[i] + (g[i] - m[i]) * b1;
                let vi = v[i] * b2 + g[i] * g[i] * nb2;
                let denom = vi.sqrt() / bias2_sqrt + eps;
                p2[i].write(p[i] * decay - mi / denom * step_size);
                m2[i].write(mi);
                v2[i].write(vi);
            }
        });
    // SAFETY: the loop wrote all n elements of each (the inputs are n long: the caller
    // checked the shapes).
    unsafe {
        p2.set_len(n);
        m2.set_len(n);
        v2.set_len(n);
    }
    (p2, m2, v2)
}

/// `(new parameter, new exp_avg, new exp_avg_sq)` in one pass, or `None` where the loop does
/// not apply (not CPU, not f32/f64, mixed dtypes, non-contiguous): the caller's tensor path then
/// runs.
pub(super) fn adamw_update(
    u: &Update,
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let dtype = p.dtype();
    if !matches!(p.device(), Device::Cpu)
        || [g, m, v]
            .iter()
            .any(|t| t.dtype() != dtype || t.shape() != p.shape())
    {
        return Ok(None);
    }
    let ts = [p, g, m, v].map(|t| t.storage_and_layout());
    macro_rules! run {
        ($t:ty) => {{
            let s: Vec<Option<&[$t]>> = ts.iter().map(|(s, l)| elems::<$t>(s, l)).collect();
            let [Some(ps), Some(gs), Some(ms), Some(vs)] = s[..] else {
                return Ok(None);
            };
            let (a, b, c) = update(u, ps, gs, ms, vs);
            (
                Tensor::from_vec(a, p.shape(), &Device::Cpu)?,
                Tensor::from_vec(b, p.shape(), &Device::Cpu)?,
                Tensor::from_vec(c, p.shape(), &Device::Cpu)?,
            )
        }};
    }
    let out = match dtype {
        candle::DType::F32 => run!(f32),
        candle::DType::F64 => run!(f64),
        _ => return Ok(None),
    };
    Ok(Some(out))
}

/// `Σ g²` accumulated in f64 in one pass, or `None` where the loop does not apply.
pub(super) fn sum_of_squares(g: &Tensor) -> Option<f64> {
    fn sum<T: WithDType>(x: &[T]) -> f64 {
        x.par_chunks(CHUNK)
            .map(|c| c.iter().map(|x| x.to_f64() * x.to_f64()).sum::<f64>())
            // In chunk order, for a run-to-run identical norm (see `cross_entropy.rs`).
            .collect::<Vec<f64>>()
            .into_iter()
            .sum()
    }
    let (s, l) = g.storage_and_layout();
    match &*s {
        Storage::Cpu(CpuStorage::F32(_)) => elems::<f32>(&s, l).map(sum),
        Storage::Cpu(CpuStorage::F64(_)) => elems::<f64>(&s, l).map(sum),
        _ => None,
    }
}
