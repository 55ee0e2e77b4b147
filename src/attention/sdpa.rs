//! [`scaled_dot_product_attention`]: PyTorch's `F.scaled_dot_product_attention`, grouped
//! key/value heads included, forward and backward.
//!
//! On the CPU in f32/f64 (value head dim equal to the query's) it is one fused op, the
//! kernels of [`MultiheadAttention`](super::MultiheadAttention)'s fused path: the query heads
//! of a group read their key/value head in place, and the key and value gradients of a group
//! add up in one buffer. Elsewhere (CUDA, f16, bf16) it is built from candle's differentiable
//! ops, the query heads of a group stacked as rows of one product with their key/value head:
//! K and V are never repeated there either.

use candle::{DType, Device, Result, Shape, Tensor};

use super::fused::{FusedSdpa, Geom};
use super::options::AttentionKernel;
use super::softmax::safe_softmax_last_dim;
use crate::cpu::fused;
use crate::cpu::Stash;
use crate::nn::dropout::{seeded_dropout, DropoutMask};

/// The most heads, query or key/value, a call may have.
pub const MAX_SDPA_HEADS: usize = 1 << 16;

/// The keyword arguments of [`scaled_dot_product_attention`], PyTorch's defaults by
/// [`Default`].
///
/// PyTorch equivalent: `attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
/// enable_gqa=False`.
#[derive(Clone, Debug, Default)]
pub struct SdpaOptions {
    /// A mask broadcastable to `(…, H, L, S)`. **u8 is PyTorch's bool mask: nonzero means the
    /// key takes part** (SDPA's convention, the opposite of
    /// [`AttentionOptions`](super::AttentionOptions)'s, whose nonzero means masked); a float
    /// mask (the inputs' dtype) is added to the scores. Default none.
    pub attn_mask: Option<Tensor>,
    /// Dropout probability on the attention weights, in `[0, 1]`. Default 0.
    pub dropout_p: f64,
    /// Seed of the dropout mask ([`DropoutMask`]; PyTorch draws from its global generator, so
    /// masks differ from PyTorch's, not their distribution). Default 0.
    pub dropout_seed: u64,
    /// Causal: query `i` sees keys `j ≤ i` (top-left aligned, as PyTorch's `tril`); an
    /// `attn_mask` must then be `None`. Default false.
    pub is_causal: bool,
    /// Factor of `q·kᵀ`. Default `None`: `1/√E`.
    pub scale: Option<f64>,
    /// Grouped-query attention: `k` and `v` may have fewer heads than `q`, a divisor of them;
    /// query head `h` reads key/value head `h / (H / H_kv)`. Default false.
    pub enable_gqa: bool,
    /// Which implementation computes it. Default [`AttentionKernel::Auto`]: the fused CPU op
    /// where it covers the call (f32/f64, `E_v = E`, `S > 0`, a mask that needs no
    /// gradient), candle's ops elsewhere; `Reference` is always candle's ops (the path of
    /// CUDA, f16 and bf16), `Fused` the fused op or an error naming what it does not cover.
    /// PyTorch equivalent: `torch.nn.attention.sdpa_kernel(...)`, `Reference` its math
    /// backend.
    pub kernel: AttentionKernel,
}

impl SdpaOptions {
    /// PyTorch's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// With the causal rule (`is_causal=True`).
    pub fn causal(mut self) -> Self {
        self.is_causal = true;
        self
    }

    /// With `attn_mask`.
    pub fn with_mask(mut self, mask: Tensor) -> Self {
        self.attn_mask = Some(mask);
        self
    }

    /// With `enable_gqa=True`.
    pub fn gqa(mut self) -> Self {
        self.enable_gqa = true;
        self
    }

    /// With `scale`.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// With the implementation `kernel`.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// With dropout of probability `p`, its mask drawn from `seed`.
    pub fn with_dropout(mut self, p: f64, seed: u64) -> Self {
        self.dropout_p = p;
        self.dropout_seed = seed;
        self
    }
}

/// The sizes of one call, leading dimensions flattened into `b`.
#[derive(Clone, Debug)]
struct Sizes {
    lead: Vec<usize>,
    b: usize,
    hq: usize,
    hk: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

impl Sizes {
    fn out_shape(&self) -> Shape {
        let mut dims = self.lead.clone();
        dims.extend([self.hq, self.l, self.ev]);
        dims.into()
    }

    fn full_mask_dims(&self) -> Vec<usize> {
        let mut dims = self.lead.clone();
        dims.extend([self.hq, self.l, self.s]);
        dims
    }
}

fn check(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Result<Sizes> {
    const F: &str = "scaled_dot_product_attention";
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() < 2 || kd.len() != qd.len() || vd.len() != qd.len() {
        candle::bail!(
            "{F}: query, key and value must have one rank of at least 2, got query {qd:?}, key {kd:?}, value {vd:?}"
        )
    }
    for (name, t) in [("key", k), ("value", v)] {
        if t.dtype() != q.dtype() || !t.device().same_device(q.device()) {
            candle::bail!(
                "{F}: {name} is {:?} on {:?}, expected the query's {:?} on {:?}",
                t.dtype(),
                t.device().location(),
                q.dtype(),
                q.device().location()
            )
        }
    }
    if !super::is_float(q.dtype()) {
        candle::bail!("{F}: query must be a float tensor, got {:?}", q.dtype())
    }
    let r = qd.len();
    let (l, e) = (qd[r - 2], qd[r - 1]);
    let (s, ek) = (kd[r - 2], kd[r - 1]);
    let (sv, ev) = (vd[r - 2], vd[r - 1]);
    if ek != e {
        candle::bail!(
            "{F}: key has head dim {ek}, expected the query's {e} (query {qd:?}, key {kd:?})"
        )
    }
    if sv != s {
        candle::bail!(
            "{F}: value has {sv} positions, expected the key's {s} (key {kd:?}, value {vd:?})"
        )
    }
    let (hq, hk, lead) = if r >= 3 {
        (qd[r - 3], kd[r - 3], qd[..r - 3].to_vec())
    } else {
        (1, 1, vec![])
    };
    if r >= 3 && (kd[..r - 3] != lead[..] || vd[..r - 3] != lead[..] || vd[r - 3] != hk) {
        candle::bail!(
            "{F}: key and value must have the query's batch dims and one head count, got query {qd:?}, key {kd:?}, value {vd:?}"
        )
    }
    if hq > MAX_SDPA_HEADS || hk > MAX_SDPA_HEADS {
        candle::bail!("{F}: {hq} query and {hk} key/value heads, at most {MAX_SDPA_HEADS}")
    }
    if opts.enable_gqa {
        if hk == 0 || hq % hk != 0 {
            candle::bail!(
                "{F}: enable_gqa needs the query's heads ({hq}) to be a multiple of the key/value heads ({hk})"
            )
        }
    } else if hk != hq {
        candle::bail!(
            "{F}: key/value have {hk} heads, the query {hq}: set enable_gqa for grouped-query attention"
        )
    }
    if !(0.0..=1.0).contains(&opts.dropout_p) {
        candle::bail!("{F}: dropout_p must be in [0, 1], got {}", opts.dropout_p)
    }
    if let Some(sc) = opts.scale {
        if !sc.is_finite() {
            candle::bail!("{F}: scale must be finite, got {sc}")
        }
    }
    if opts.is_causal && opts.attn_mask.is_some() {
        candle::bail!("{F}: an explicit attn_mask must not be set when is_causal is true")
    }
    if let Some(m) = &opts.attn_mask {
        if m.dtype() != DType::U8 && m.dtype() != q.dtype() {
            candle::bail!(
                "{F}: attn_mask is {:?}, expected u8 (PyTorch's bool) or the query's {:?}",
                m.dtype(),
                q.dtype()
            )
        }
        let full = [&lead[..], &[hq, l, s]].concat();
        if m.rank() > full.len() || m.broadcast_as(full.clone()).is_err() {
            candle::bail!(
                "{F}: attn_mask of dims {:?} does not broadcast to (…, H, L, S) = {full:?}",
                m.dims()
            )
        }
    }
    let b = lead.iter().product();
    Ok(Sizes {
        lead,
        b,
        hq,
        hk,
        l,
        s,
        e,
        ev,
    })
}

/// The mask as an additive float mask in `dtype`: u8 nonzero (takes part) → 0, zero → `-inf`.
fn additive(mask: &Tensor, dtype: DType) -> Result<Tensor> {
    match mask.dtype() {
        DType::U8 => {
            let neg_inf = Tensor::full(f32::NEG_INFINITY, mask.shape(), mask.device())?;
            mask.ne(0u8)?
                .where_cond(&neg_inf.zeros_like()?, &neg_inf)?
                .to_dtype(dtype)
        }
        _ => Ok(mask.clone()),
    }
}

/// The additive mask as `(L, S)` when it is the same for every batch and head, else as
/// `(B·H, L, S)`.
fn flat_mask(mask: &Tensor, z: &Sizes, dtype: DType) -> Result<Tensor> {
    let m = additive(mask, dtype)?;
    let full = z.full_mask_dims();
    let r = full.len();
    let shared = m.rank() <= 2 || m.dims()[..m.rank() - 2].iter().all(|&d| d == 1);
    if shared {
        let m2 = m.reshape(&m.dims()[m.rank().saturating_sub(2)..])?;
        let m2 = match m2.rank() {
            0 => m2.reshape((1, 1))?,
            1 => m2.reshape((1, m2.dims()[0]))?,
            _ => m2,
        };
        m2.broadcast_as((full[r - 2], full[r - 1]))?.contiguous()
    } else {
        m.broadcast_as(full)?
            .contiguous()?
            .reshape((z.b * z.hq, z.l, z.s))
    }
}

/// The causal mask `(L, S)`, additive: `-inf` where key `j > i`.
fn causal_bias(l: usize, s: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = (0..l)
        .flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(data, (l, s), device)?.to_dtype(dtype)
}

/// `softmax(q·kᵀ·scale + mask)·v`, with dropout on the weights and grouped key/value heads.
///
/// PyTorch equivalent: `F.scaled_dot_product_attention(query, key, value, attn_mask,
/// dropout_p, is_causal, scale, enable_gqa)`; a row whose every key is masked gives zeros (as
/// PyTorch's math path since 2.5, `torch._safe_softmax`), with finite gradients. The dropout
/// mask is [`DropoutMask`]'s over the `(…, H, L, S)` weights, not PyTorch's generator's.
///
/// # Shapes
/// - `query`: `(…, H, L, E)`; `key`: `(…, H_kv, S, E)`; `value`: `(…, H_kv, S, E_v)`, the
///   same leading dims; `H_kv = H` unless [`SdpaOptions::enable_gqa`], then a divisor of `H`.
///   Rank 2 (`(L, E)`) is one head.
/// - output: `(…, H, L, E_v)`.
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let z = check(query, key, value, opts)?;
    let scale = opts.scale.unwrap_or(1.0 / (z.e as f64).sqrt());
    if z.b * z.hq * z.l == 0 || z.ev == 0 {
        return Tensor::zeros(z.out_shape(), query.dtype(), query.device());
    }
    let heads = |t: &Tensor, h: usize, len: usize, d: usize| -> Result<Tensor> {
        match t.rank() {
            4 => Ok(t.clone()),
            _ => t.contiguous()?.reshape((z.b, h, len, d)),
        }
    };
    let (q, k, v) = (
        heads(query, z.hq, z.l, z.e)?,
        heads(key, z.hk, z.s, z.e)?,
        heads(value, z.hk, z.s, z.ev)?,
    );
    // A float mask that needs its gradient goes through candle's ops: the kernels take the
    // mask as a constant.
    let mask_grad = opts.attn_mask.as_ref().is_some_and(Tensor::track_op);
    let covered = fused(&q) && z.e == z.ev && z.s > 0 && !mask_grad;
    if opts.kernel == AttentionKernel::Fused && !covered {
        candle::bail!(
            "scaled_dot_product_attention: kernel Fused covers the CPU in f32/f64 with E_v = E, S > 0 and a mask without gradient; got {:?} {:?}, E {} and E_v {}, S {}, a mask gradient: {mask_grad}",
            q.device().location(),
            q.dtype(),
            z.e,
            z.ev,
            z.s
        )
    }
    if opts.kernel != AttentionKernel::Reference && covered {
        let unit = |t: &Tensor| -> Result<Tensor> {
            match t.stride()[3] {
                1 => Ok(t.clone()),
                _ => t.contiguous(),
            }
        };
        let mask = match &opts.attn_mask {
            Some(m) => Some(flat_mask(m, &z, q.dtype())?),
            None => None,
        };
        let dropout = match opts.dropout_p {
            p if p > 0.0 => Some(DropoutMask::new(p, opts.dropout_seed)?),
            _ => None,
        };
        let op = FusedSdpa {
            geom: Geom {
                n: z.b,
                h: z.hq,
                l: z.l,
                s: z.s,
                d: z.e,
                s_masked: z.s,
                causal: opts.is_causal,
                scale,
                group: z.hq / z.hk,
            },
            mask,
            dropout,
            lse: Stash::default(),
        };
        let out = unit(&q)?.apply_op3(&unit(&k)?, &unit(&v)?, op)?;
        return out.reshape(z.out_shape());
    }
    composed(&q, &k, &v, &z, scale, opts)
}

/// The candle-ops path: the `rep` query heads of a group stacked as `rep·L` rows against
/// their key/value head.
fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    z: &Sizes,
    scale: f64,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let rep = z.hq / z.hk;
    let dtype = q.dtype();
    let qg = q.contiguous()?.reshape((z.b, z.hk, rep * z.l, z.e))?;
    let kt = k.contiguous()?.transpose(2, 3)?;
    let scores = (qg.matmul(&kt)? * scale)?.reshape((z.b, z.hk, rep, z.l, z.s))?;
    let bias = match (&opts.attn_mask, opts.is_causal) {
        (Some(m), _) => {
            let m = flat_mask(m, z, dtype)?;
            Some(match m.rank() {
                2 => m.reshape((1, 1, 1, z.l, z.s))?,
                _ => m.reshape((z.b, z.hk, rep, z.l, z.s))?,
            })
        }
        (None, true) => {
            Some(causal_bias(z.l, z.s, dtype, q.device())?.reshape((1, 1, 1, z.l, z.s))?)
        }
        (None, false) => None,
    };
    let scores = match bias {
        Some(b) => scores.broadcast_add(&b)?,
        None => scores,
    };
    let mut p = safe_softmax_last_dim(&scores)?;
    if opts.dropout_p > 0.0 {
        p = seeded_dropout(&p, opts.dropout_p, opts.dropout_seed)?;
    }
    let p = p.reshape((z.b, z.hk, rep * z.l, z.s))?;
    p.matmul(&v.contiguous()?)?.reshape(z.out_shape())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(seed: u64, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let data: Vec<f64> = (0..n)
            .map(|i| {
                let x = crate::rng::splitmix64(seed.wrapping_mul(1_000_003) + i as u64);
                (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// The fused op and the composed path agree, forward and gradients, for every grouping,
    /// mask form and dropout.
    #[test]
    fn fused_equals_composed() {
        let cases: Vec<(usize, usize, usize, usize, SdpaOptions)> = vec![
            (4, 4, 5, 7, SdpaOptions::new()),
            (6, 2, 9, 9, SdpaOptions::new().gqa().causal()),
            (6, 3, 4, 11, SdpaOptions::new().gqa().causal()),
            (7, 1, 8, 8, SdpaOptions::new().gqa().with_dropout(0.3, 7)),
            (
                4,
                2,
                5,
                6,
                SdpaOptions::new().gqa().with_mask(
                    randn(3, &[2, 4, 5, 6])
                        .ge(0.0)
                        .unwrap()
                        .to_dtype(DType::U8)
                        .unwrap(),
                ),
            ),
            (
                4,
                2,
                5,
                6,
                SdpaOptions::new()
                    .gqa()
                    .with_mask(randn(4, &[5, 6]))
                    .with_scale(0.3),
            ),
        ];
        for (hq, hk, l, s, opts) in cases {
            let q = candle::Var::from_tensor(&randn(1, &[2, hq, l, 8])).unwrap();
            let k = candle::Var::from_tensor(&randn(2, &[2, hk, s, 8])).unwrap();
            let v = candle::Var::from_tensor(&randn(5, &[2, hk, s, 8])).unwrap();
            let fused_out = scaled_dot_product_attention(&q, &k, &v, &opts).unwrap();
            let z = check(&q, &k, &v, &opts).unwrap();
            let scale = opts.scale.unwrap_or(1.0 / 8f64.sqrt());
            let comp = composed(&q, &k, &v, &z, scale, &opts).unwrap();
            assert!(max_diff(&fused_out, &comp) < 1e-12, "{hq}/{hk} {opts:?}");
            let w = randn(9, fused_out.dims());
            let gf = (&fused_out * &w)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let gc = (&comp * &w).unwrap().sum_all().unwrap().backward().unwrap();
            for t in [&q, &k, &v] {
                let (a, b) = (gf.get(t).unwrap(), gc.get(t).unwrap());
                assert!(max_diff(a, b) < 1e-12, "grad {hq}/{hk} {opts:?}");
            }
        }
    }

    #[test]
    fn bad_input_is_refused_by_name() {
        let q = randn(1, &[1, 6, 3, 4]);
        let k = randn(2, &[1, 4, 3, 4]);
        let e = scaled_dot_product_attention(&q, &k, &k, &SdpaOptions::new().gqa()).unwrap_err();
        assert!(
            e.to_string()
                .contains("multiple of the key/value heads (4)"),
            "{e}"
        );
        let e = scaled_dot_product_attention(&q, &k, &k, &SdpaOptions::new()).unwrap_err();
        assert!(e.to_string().contains("enable_gqa"), "{e}");
        let m = randn(3, &[3, 3]);
        let e = scaled_dot_product_attention(&q, &q, &q, &SdpaOptions::new().causal().with_mask(m))
            .unwrap_err();
        assert!(e.to_string().contains("is_causal"), "{e}");
        let m = randn(3, &[2, 3]);
        let e =
            scaled_dot_product_attention(&q, &q, &q, &SdpaOptions::new().with_mask(m)).unwrap_err();
        assert!(e.to_string().contains("does not broadcast"), "{e}");
    }
}
