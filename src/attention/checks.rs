//! Input validation for `forward`, with PyTorch's messages where PyTorch has one.
//!
//! Every check of PyTorch's `_mha_shape_check`, `_canonical_mask` and
//! `multi_head_attention_forward` (spec §7) has a counterpart here that returns an error naming
//! the argument, what was received and what was expected. Checks that PyTorch leaves to lower
//! ops (dtype and device mismatches, key/value feature sizes) get an explicit message too.

use candle::{DType, Device, Result, Tensor};

use super::{AttentionOptions, MultiheadAttentionConfig};

/// Sizes of one call: batched or not, batch `N`, target length `L`, source length `S`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub batched: bool,
    pub n: usize,
    pub l: usize,
    pub s: usize,
}

/// Whether `dtype` is one of the float dtypes the crate computes in (f16, bf16, f32, f64);
/// candle's `DType::is_float` also counts the f8/f6/f4 storage types.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// Whether `x` is batched (3-D) rather than unbatched (2-D); any other rank is an error,
/// `wrong(rank)` followed by the shape.
pub(crate) fn is_batched(x: &Tensor, wrong: impl FnOnce(usize) -> String) -> Result<bool> {
    match x.rank() {
        3 => Ok(true),
        2 => Ok(false),
        r => candle::bail!("{} (shape {:?})", wrong(r), x.dims()),
    }
}

/// Checks every argument of a forward call and returns its sizes.
pub(crate) fn check_inputs(
    cfg: &MultiheadAttentionConfig,
    param_dtype: DType,
    param_device: &Device,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    opts: &AttentionOptions,
) -> Result<Dims> {
    let kpm = opts.key_padding_mask.as_ref();
    let mask = opts.attn_mask.as_ref();
    let batched = is_batched(query, |d| {
        format!("query should be unbatched 2D or batched 3D tensor but received {d}-D query tensor")
    })?;
    let (kind, rank) = if batched {
        ("batched (3-D)", 3)
    } else {
        ("unbatched (2-D)", 2)
    };
    if key.rank() != rank || value.rank() != rank {
        candle::bail!(
            "For {kind} `query`, expected `key` and `value` to be {rank}-D but found {}-D and {}-D tensors respectively (shapes {:?} and {:?})",
            key.rank(), value.rank(), key.dims(), value.dims()
        )
    }
    if let Some(m) = kpm {
        if m.rank() != rank - 1 {
            candle::bail!(
                "For {kind} `query`, expected `key_padding_mask` to be `None` or {}-D but found {}-D tensor instead (shape {:?})",
                rank - 1, m.rank(), m.dims()
            )
        }
    }
    if let Some(m) = mask {
        if m.rank() != 2 && m.rank() != 3 {
            candle::bail!(
                "For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found {}-D tensor instead (shape {:?})",
                m.rank(), m.dims()
            )
        }
    }

    // Dtypes and devices: PyTorch fails in a matmul here; we say which argument is off.
    if !is_float(query.dtype()) {
        candle::bail!(
            "query must be a floating tensor (f16, bf16, f32 or f64), got dtype {:?}",
            query.dtype()
        )
    }
    if query.dtype() != param_dtype {
        candle::bail!(
            "query has dtype {:?} but the module's parameters are {param_dtype:?}: they must match",
            query.dtype()
        )
    }
    for (name, t) in [("key", key), ("value", value)] {
        if t.dtype() != query.dtype() {
            candle::bail!(
                "{name} has dtype {:?} but query has {:?}: they must match",
                t.dtype(),
                query.dtype()
            )
        }
    }
    for (name, t) in [("query", query), ("key", key), ("value", value)] {
        if !t.device().same_device(param_device) {
            candle::bail!(
                "{name} is on {:?} but the module's parameters are on {param_device:?}",
                t.device().location()
            )
        }
    }

    // Feature sizes.
    let e = cfg.embed_dim;
    let q_e = query.dims()[rank - 1];
    if q_e != e {
        candle::bail!(
            "was expecting embedding dimension of {e}, but got {q_e} (query shape {:?})",
            query.dims()
        )
    }
    check_key_value(cfg, key, value)?;

    // Sizes in the caller's layout.
    let (n, l, s) = if !batched {
        (1, query.dims()[0], key.dims()[0])
    } else if cfg.batch_first {
        (query.dims()[0], query.dims()[1], key.dims()[1])
    } else {
        (query.dims()[1], query.dims()[0], key.dims()[0])
    };
    if batched {
        let kn = if cfg.batch_first {
            key.dims()[0]
        } else {
            key.dims()[1]
        };
        if kn != n {
            candle::bail!(
                "query batch size {n} does not match key batch size {kn} (query shape {:?}, key shape {:?}, batch_first={})",
                query.dims(), key.dims(), cfg.batch_first
            )
        }
    }

    let h = cfg.num_heads;
    if let Some(m) = mask {
        let expected: Vec<usize> = match (m.rank(), batched) {
            (2, _) => vec![l, s],
            (_, true) => vec![n * h, l, s],
            (_, false) => vec![h, l, s],
        };
        if m.dims() != expected.as_slice() {
            candle::bail!(
                "The shape of the {}D attn_mask is {:?}, but should be {:?}, i.e. {}.",
                m.rank(),
                m.dims(),
                expected,
                match m.rank() {
                    2 => "(L, S)",
                    _ if batched => "(N*num_heads, L, S)",
                    _ => "(num_heads, L, S) for unbatched input",
                }
            )
        }
        check_mask_dtype("attn_mask", m, query)?;
    }
    if let Some(m) = kpm {
        let expected: Vec<usize> = if batched { vec![n, s] } else { vec![s] };
        if m.dims() != expected.as_slice() {
            candle::bail!(
                "Expected key_padding_mask shape {:?}, i.e. {}, but got {:?}",
                expected,
                if batched { "(N, S)" } else { "(S)" },
                m.dims()
            )
        }
        check_mask_dtype("key_padding_mask", m, query)?;
    }
    if let Some(m) = &opts.head_mask {
        if m.dims() != [h] || !is_float(m.dtype()) {
            candle::bail!(
                "head_mask must be a float tensor of shape [{h}] (one factor per head), got shape {:?} and dtype {:?}",
                m.dims(),
                m.dtype()
            )
        }
        if !m.device().same_device(query.device()) {
            candle::bail!(
                "head_mask is on {:?} but query is on {:?}",
                m.device().location(),
                query.device().location()
            )
        }
    }
    Ok(Dims { batched, n, l, s })
}

fn check_mask_dtype(name: &str, mask: &Tensor, query: &Tensor) -> Result<()> {
    match mask.dtype() {
        DType::U8 => {}
        d if is_float(d) => {
            if d != query.dtype() {
                candle::bail!(
                    "float {name} has dtype {d:?} but query has {:?}: a float mask must have the query's dtype",
                    query.dtype()
                )
            }
        }
        d => candle::bail!(
            "only bool (u8, nonzero = masked) and floating types of {name} are supported, got dtype {d:?}"
        ),
    }
    if !mask.device().same_device(query.device()) {
        candle::bail!(
            "{name} is on {:?} but query is on {:?}",
            mask.device().location(),
            query.device().location()
        )
    }
    Ok(())
}

/// `key` and `value` (of the same rank) against `kdim` and `vdim`, and against each other in
/// their sequence and batch dims.
pub(crate) fn check_key_value(
    cfg: &MultiheadAttentionConfig,
    key: &Tensor,
    value: &Tensor,
) -> Result<()> {
    let rank = key.rank();
    for (name, t, want, dim) in [
        ("key", key, cfg.kdim(), "kdim"),
        ("value", value, cfg.vdim(), "vdim"),
    ] {
        let got = t.dims()[rank - 1];
        if got != want {
            candle::bail!(
                "expecting {name} feature size {dim}={want}, but got {got} ({name} shape {:?})",
                t.dims()
            )
        }
    }
    if key.dims()[..rank - 1] != value.dims()[..rank - 1] {
        candle::bail!(
            "key's sequence and batch dims {:?} do not match value's {:?}",
            &key.dims()[..rank - 1],
            &value.dims()[..rank - 1]
        )
    }
    Ok(())
}
