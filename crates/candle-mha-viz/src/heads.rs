//! Head views over per-head attention weights `(…, H, L, S)`: fusing the heads into one map,
//! which head dominates each cell, how peaked each query row is, per-head summaries, and head
//! ablation (does the output actually depend on a head?).
//!
//! The weights come from [`MultiheadAttention::forward`] with
//! [`average_attn_weights`](AttentionOptions::average_attn_weights) set to `false`
//! (`(N, H, L, S')`, or `(H, L, S')` unbatched), or from
//! a model that returns them per layer, such as the train crate's
//! `NextTokenPredictor::forward_with_attention` (one `(N, H, L, L)` per layer). Every function here takes any number of leading dimensions: the
//! head axis is always the third from last.

use candle::{DType, Device, Result, Tensor, D};

use candle_mha::attention::{AttentionOptions, MultiheadAttention};

/// How the heads of each `(query, key)` cell are combined into one value: by [`fuse_heads`],
/// and before [`attention_rollout`](super::attention_rollout) and
/// [`attention_flow`](super::attention_flow). The default is `Mean`.
///
/// PyTorch equivalent: `weights.mean(-3)`, `.amax(-3)`, `.amin(-3)`; the common ViT rollout
/// implementation's `head_fusion="mean" | "max" | "min"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HeadFusion {
    /// The average over heads: rows still sum to one (the rollout paper's choice).
    ///
    /// PyTorch equivalent: `average_attn_weights=True` in `MultiheadAttention.forward`.
    #[default]
    Mean,
    /// The largest weight any head gives the cell: shows every link some head makes (rows no
    /// longer sum to one).
    Max,
    /// The smallest weight any head gives the cell: shows the links every head agrees on.
    Min,
}

/// Checks that `weights` is a float tensor `(…, H, L, S)` with at least one head.
fn check_heads(weights: &Tensor, what: &str) -> Result<()> {
    if weights.rank() < 3 {
        candle::bail!(
            "{what}: weights must be per-head attention weights of shape (…, H, L, S) (rank >= 3), got shape {:?}",
            weights.dims()
        )
    }
    check_float(weights, what)?;
    if weights.dim(D::Minus(3))? == 0 {
        candle::bail!(
            "{what}: weights has no head (H = 0 in shape {:?}); expected (…, H, L, S) with H >= 1",
            weights.dims()
        )
    }
    Ok(())
}

/// Checks that `weights` is f16, bf16, f32 or f64; the error names `what` and the dtype and
/// shape received.
pub(crate) fn check_float(weights: &Tensor, what: &str) -> Result<()> {
    // candle's `DType::is_float` also counts the f8/f6/f4 storage types.
    if !matches!(
        weights.dtype(),
        DType::F16 | DType::BF16 | DType::F32 | DType::F64
    ) {
        candle::bail!(
            "{what}: weights must be a float tensor (f16, bf16, f32 or f64), got dtype {:?} (shape {:?})",
            weights.dtype(),
            weights.dims()
        )
    }
    Ok(())
}

/// `dims` without the axis `axis`: the shape of a reduction over it.
fn without(dims: &[usize], axis: usize) -> Vec<usize> {
    let mut d = dims.to_vec();
    d.remove(axis);
    d
}

/// Combines the heads of per-head weights into one map per query.
///
/// PyTorch equivalent: `weights.mean(-3)` (what `average_attn_weights=True` returns),
/// `weights.amax(-3)`, `weights.amin(-3)`.
///
/// # Shapes
/// `weights (…, H, L, S)` → `(…, L, S)`, same dtype.
///
/// # Errors
/// `weights` of rank below 3, not float, or with `H = 0`.
pub fn fuse_heads(weights: &Tensor, fusion: HeadFusion) -> Result<Tensor> {
    check_heads(weights, "fuse_heads")?;
    let axis = weights.rank() - 3;
    if weights.elem_count() == 0 {
        // candle's max/min refuse empty tensors; an empty result is all that is left.
        return Tensor::zeros(
            without(weights.dims(), axis),
            weights.dtype(),
            weights.device(),
        );
    }
    match fusion {
        HeadFusion::Mean => weights.mean(axis),
        HeadFusion::Max => weights.max(axis),
        HeadFusion::Min => weights.min(axis),
    }
}

/// For each `(query, key)` cell, the head that gives it the most weight.
///
/// Ties go to the lowest head index on the CPU (candle's `argmax`; other devices do not
/// promise an order).
///
/// PyTorch equivalent: `weights.argmax(-3)` (as `u32` instead of `int64`).
///
/// # Shapes
/// `weights (…, H, L, S)` → `(…, L, S)` u32 head indices.
///
/// # Errors
/// `weights` of rank below 3, not float, or with `H = 0`.
pub fn argmax_head(weights: &Tensor) -> Result<Tensor> {
    check_heads(weights, "argmax_head")?;
    let axis = weights.rank() - 3;
    if weights.elem_count() == 0 {
        return Tensor::zeros(without(weights.dims(), axis), DType::U32, weights.device());
    }
    weights.argmax(axis)
}

/// The entropy, in nats, of each query row: `−Σ_s p·ln p`, with `0·ln 0 = 0`.
///
/// A row spread uniformly over `S` keys has entropy `ln S`; a row on one key has 0. A fully
/// masked row (all zeros, see [`MultiheadAttention`]) also gives 0. Rows are taken as they
/// are: after dropout they do not sum to one and the value is no longer an entropy.
///
/// PyTorch equivalent: `torch.special.entr(weights).sum(-1)`.
///
/// # Shapes
/// `weights (…, H, L, S)` → `(…, H, L)`, same dtype (computed in f32 for f16/bf16).
///
/// # Errors
/// `weights` of rank below 3, not float, or with `H = 0`.
pub fn row_entropy(weights: &Tensor) -> Result<Tensor> {
    check_heads(weights, "row_entropy")?;
    let dtype = weights.dtype();
    let p = match dtype {
        DType::F16 | DType::BF16 => weights.to_dtype(DType::F32)?,
        _ => weights.clone(),
    };
    // ln(p + [p == 0]) is ln p where p > 0 and ln 1 = 0 where p = 0: no -inf, so no 0·(-inf)
    // NaN and a finite gradient.
    let zero = p.eq(0.0)?.to_dtype(p.dtype())?;
    let plogp = (&p * (&p + zero)?.log()?)?;
    plogp.sum(D::Minus1)?.neg()?.to_dtype(dtype)
}

/// The largest weight of each query row: how much the row's top key gets.
///
/// A row with no key at all (`S = 0`) gives 0, as a fully masked row does.
///
/// PyTorch equivalent: `weights.amax(-1)`.
///
/// # Shapes
/// `weights (…, H, L, S)` → `(…, H, L)`, same dtype.
///
/// # Errors
/// `weights` of rank below 3, not float, or with `H = 0`.
pub fn row_max(weights: &Tensor) -> Result<Tensor> {
    check_heads(weights, "row_max")?;
    if weights.elem_count() == 0 {
        let axis = weights.rank() - 1;
        return Tensor::zeros(
            without(weights.dims(), axis),
            weights.dtype(),
            weights.device(),
        );
    }
    weights.max(D::Minus1)
}

/// A one-line summary of a head: how spread and how peaked its query rows are.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadStats {
    /// The head's index in `0..H`.
    pub head: usize,
    /// The mean of [`row_entropy`] over the head's query rows (nats; `ln S` = uniform).
    pub mean_entropy: f64,
    /// The mean of [`row_max`] over the head's query rows (1 = every row on one key).
    pub mean_max_weight: f64,
}

/// Per-head means of [`row_entropy`] and [`row_max`], over every query row of every leading
/// index (batch element, …).
///
/// # Shapes
/// `weights (H, L, S)`, or `(…, H, L, S)` (e.g. `(N, H, L, S)`: averaged over `N` too) →
/// one [`HeadStats`] per head, in head order. With `L = 0` the means are 0.
///
/// # Errors
/// `weights` of rank below 3, not float, or with `H = 0`.
pub fn head_stats(weights: &Tensor) -> Result<Vec<HeadStats>> {
    check_heads(weights, "head_stats")?;
    let h = weights.dim(D::Minus(3))?;
    // (…, H, L) → (H, rows): every row of a head, whatever the leading dims.
    let per_head = |t: Tensor| -> Result<Vec<f64>> {
        let rank = t.rank();
        let t = t
            .to_dtype(DType::F64)?
            .transpose(0, rank - 2)?
            .contiguous()?;
        let rows = t.elem_count() / h;
        if rows == 0 {
            return Ok(vec![0.0; h]);
        }
        t.reshape((h, rows))?.mean(1)?.to_vec1::<f64>()
    };
    let entropy = per_head(row_entropy(weights)?)?;
    let max = per_head(row_max(weights)?)?;
    Ok(entropy
        .into_iter()
        .zip(max)
        .enumerate()
        .map(|(head, (mean_entropy, mean_max_weight))| HeadStats {
            head,
            mean_entropy,
            mean_max_weight,
        })
        .collect())
}

/// What removing one head does to a module's output.
#[derive(Clone, Debug, PartialEq)]
pub struct Ablation {
    /// The head's index in `0..H`.
    pub head: usize,
    /// `‖out − out_without_head‖ / ‖out‖` (Frobenius norms over the whole output). 0 means the
    /// output does not depend on the head's context at all. When `out` is exactly zero the
    /// ratio is undefined: 0 if the ablated output is zero too, else `f64::INFINITY`.
    pub output_change: f64,
}

/// Ablates each head in turn and measures how much the output moves.
///
/// One forward with `opts` as given, then one per head with that head's factor set to 0 in
/// [`head_mask`](AttentionOptions::head_mask) (the caller's own `head_mask`, if any, is kept
/// for the other heads). The weights are not computed. This tests what reading the weights
/// cannot: whether the output depends on the head at all (see the [module
/// docs](crate)).
///
/// Not in PyTorch (Hugging Face models take a `head_mask` argument for the same purpose).
///
/// # Shapes
/// `query`, `key`, `value` and the masks of `opts` as for [`MultiheadAttention::forward`]; one
/// [`Ablation`] per head, in head order.
///
/// # Errors
/// Anything [`MultiheadAttention::forward`] rejects, and training mode with dropout but no
/// [`dropout_seed`](AttentionOptions::dropout_seed): each forward would draw its own dropout
/// mask and the differences would measure the masks, not the head.
pub fn head_ablation(
    mha: &MultiheadAttention,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    opts: &AttentionOptions,
) -> Result<Vec<Ablation>> {
    let cfg = mha.config();
    if opts.train && cfg.dropout > 0.0 && opts.dropout_seed.is_none() {
        candle::bail!(
            "head_ablation: opts.train is true with dropout {} but opts.dropout_seed is None; set a dropout_seed (or train = false) so every forward uses the same dropout mask",
            cfg.dropout
        )
    }
    let h = cfg.num_heads;
    let weight = mha.out_proj().weight();
    let (dtype, device) = (weight.dtype(), weight.device());
    let base_mask: Vec<f64> = match &opts.head_mask {
        Some(m) => {
            if m.dims() != [h] {
                candle::bail!(
                    "head_ablation: opts.head_mask must have shape [{h}] (one factor per head), got shape {:?}",
                    m.dims()
                )
            }
            m.to_dtype(DType::F64)?.to_vec1::<f64>()?
        }
        None => vec![1.0; h],
    };
    let opts = opts.clone().with_need_weights(false);
    let forward = |opts: &AttentionOptions| -> Result<Tensor> {
        let out = mha.forward(query, key, value, opts)?.output;
        out.to_dtype(DType::F64)
    };
    let full = forward(&opts)?;
    let full_norm = norm(&full)?;
    (0..h)
        .map(|head| {
            let mut factors = base_mask.clone();
            factors[head] = 0.0;
            let mask = head_mask_tensor(&factors, dtype, device)?;
            let ablated = forward(&opts.clone().with_head_mask(mask))?;
            let diff = norm(&(&full - ablated)?)?;
            let output_change = if full_norm > 0.0 {
                diff / full_norm
            } else if diff == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            Ok(Ablation {
                head,
                output_change,
            })
        })
        .collect()
}

fn head_mask_tensor(factors: &[f64], dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::new(factors, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)
}

/// The Frobenius norm of an f64 tensor (0 for an empty one).
fn norm(t: &Tensor) -> Result<f64> {
    if t.elem_count() == 0 {
        return Ok(0.0);
    }
    t.sqr()?.sum_all()?.to_scalar::<f64>().map(f64::sqrt)
}
