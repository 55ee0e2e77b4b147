//! Decoding attention on CPU tensors: the few-query kernel (`kernel/decode.rs`) over
//! head-space queries and a cache's keys and values. Inference only (no autograd node):
//! decoding runs in eval mode.

use candle::{DType, Device, Layout, Result, Tensor};

use super::kernel::{decode, DecodeGeom, RowMap, Rows};
use crate::cpu::{slice, unsupported_dtype, Elem};

const OP: &str = "fused decoding attention";

/// Row map of a `(N, H, len, d)` operand with unit last stride, relative to its [`slice`].
pub(super) fn head_map(name: &str, l: &Layout) -> Result<RowMap> {
    let st = l.stride();
    if st.len() != 4 || st[3] != 1 {
        candle::bail!(
            "{OP}: expected {name} as (N, H, len, head_dim) with unit last stride, got dims {:?} strides {st:?}",
            l.dims()
        )
    }
    Ok(RowMap {
        off: 0,
        sb: st[0],
        sh: st[1],
        si: st[2],
    })
}

/// Attention of `q (N, H, T, d)` (unscaled) over `k`, `v (N, H, S', d)` (any row strides,
/// unit last stride: a cache's views), the first `s_masked` keys under the additive key
/// padding `kpm (N, s_masked)` (unit last stride) and the causal rule of `causal_offset`
/// (query `i` sees position `j ≤ offset + i`); the rest are never masked. Returns the context
/// `(N, H, T, d)` and, when `with_probs`, the probabilities `(N, H, T, S')`, in the inputs'
/// dtype (f32 or f64, CPU).
pub(crate) fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kpm: Option<&Tensor>,
    s_masked: usize,
    causal_offset: Option<usize>,
    with_probs: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (n, h, t, s, d) = cache_dims(OP, q, k, v)?;
    let g = DecodeGeom {
        n,
        h,
        t,
        s,
        s_masked,
        d,
        causal_offset,
        scale: (1.0 / d as f64).sqrt(),
    };
    match q.dtype() {
        DType::F32 => run::<f32>(&g, q, k, v, kpm, with_probs),
        DType::F64 => run::<f64>(&g, q, k, v, kpm, with_probs),
        dt => Err(unsupported_dtype(OP, dt)),
    }
}

/// `(N, H, T, S', d)` of `q (N, H, T, d)` over a cache's `k`, `v (N, H, S', d)`; errors, in
/// `op`'s name, when `k` or `v` has other dims or another dtype than `q`.
pub(super) fn cache_dims(
    op: &str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<(usize, usize, usize, usize, usize)> {
    let (n, h, t, d) = q.dims4()?;
    let s = k.dim(2)?;
    for (name, x) in [("k", k), ("v", v)] {
        if x.dims() != [n, h, s, d] || x.dtype() != q.dtype() {
            candle::bail!(
                "{op}: {name} has dims {:?} and dtype {:?}, expected {:?} and {:?}",
                x.dims(),
                x.dtype(),
                [n, h, s, d],
                q.dtype()
            )
        }
    }
    Ok((n, h, t, s, d))
}

fn run<T: Elem>(
    g: &DecodeGeom,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kpm: Option<&Tensor>,
    with_probs: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (qs, ks, vs) = (
        q.storage_and_layout(),
        k.storage_and_layout(),
        v.storage_and_layout(),
    );
    let qr = Rows::<T> {
        data: slice(OP, &*qs.0, qs.1)?,
        map: head_map("q", qs.1)?,
    };
    let kr = Rows::<T> {
        data: slice(OP, &*ks.0, ks.1)?,
        map: head_map("k", ks.1)?,
    };
    let vr = Rows::<T> {
        data: slice(OP, &*vs.0, vs.1)?,
        map: head_map("v", vs.1)?,
    };
    let kpm_guard = kpm.map(|m| m.storage_and_layout());
    let kpm_rows = match (&kpm_guard, kpm) {
        (Some((st, l)), Some(m)) => {
            let ok = m.dims() == [g.n, g.s_masked] && m.dtype() == q.dtype();
            if !ok || (g.s_masked > 1 && l.stride()[1] != 1) {
                candle::bail!(
                    "{OP}: key padding has dims {:?}, strides {:?} and dtype {:?}, expected {:?} with unit last stride and {:?}",
                    m.dims(), l.stride(), m.dtype(), [g.n, g.s_masked], q.dtype()
                )
            }
            Some((slice::<T, _>(OP, &**st, l)?, l.stride()[0]))
        }
        _ => None,
    };
    let mut out = vec![T::ZERO; g.n * g.h * g.t * g.d];
    let mut probs = with_probs.then(|| vec![T::ZERO; g.n * g.h * g.t * g.s]);
    decode(g, (qr, kr, vr), kpm_rows, &mut out, probs.as_deref_mut());
    let cpu = Device::Cpu;
    let out = Tensor::from_vec(out, (g.n, g.h, g.t, g.d), &cpu)?;
    let probs = probs
        .map(|p| Tensor::from_vec(p, (g.n, g.h, g.t, g.s), &cpu))
        .transpose()?;
    Ok((out, probs))
}
