//! Argument checks of the incremental calls: every error names the argument, what was
//! received and what was expected.

use candle::{DType, Result, Tensor};

use crate::attention::checks::is_batched;
use crate::attention::is_float;
use crate::attention::kv_cache::CacheGeometry;
use crate::attention::MultiheadAttentionConfig;

/// Sizes of one incremental call (or of a memory): batched or not, batch `N`, new positions
/// (or memory length) `T`, and whether the 3-D layout is sequence-first.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueryDims {
    pub batched: bool,
    pub n: usize,
    pub t: usize,
    pub seq_first: bool,
}

impl QueryDims {
    /// The input as 3-D in the caller's layout (unbatched input is seq-first with `N = 1`).
    pub fn batched3(&self, x: &Tensor) -> Result<Tensor> {
        match self.batched {
            true => Ok(x.clone()),
            false => x.unsqueeze(1),
        }
    }
}

/// Rank, dtype and device of one input; returns whether it is batched.
fn check_tensor(name: &str, x: &Tensor, g: &CacheGeometry) -> Result<bool> {
    let batched = is_batched(x, |r| {
        format!("{name} should be unbatched 2-D or batched 3-D but received a {r}-D tensor")
    })?;
    if x.dtype() != g.dtype {
        candle::bail!(
            "{name} has dtype {:?} but the module's parameters are {:?}: they must match",
            x.dtype(),
            g.dtype
        )
    }
    if !x.device().same_device(&g.device) {
        candle::bail!(
            "{name} is on {:?} but the module's parameters are on {:?}",
            x.device().location(),
            g.device.location()
        )
    }
    Ok(batched)
}

/// Checks a query of new positions against the module and a cache (or memory, `what`) of
/// batch `batch_size`.
pub(super) fn check_query(
    cfg: &MultiheadAttentionConfig,
    g: &CacheGeometry,
    query: &Tensor,
    batch_size: usize,
    what: &str,
) -> Result<QueryDims> {
    let batched = check_tensor("query", query, g)?;
    let d = query.dims();
    let e = d[d.len() - 1];
    if e != cfg.embed_dim {
        candle::bail!(
            "query: expected embedding dimension {} (the last dim), but got {e} (query shape {d:?})",
            cfg.embed_dim
        )
    }
    let seq_first = !batched || !cfg.batch_first;
    let (n, t) = match (batched, cfg.batch_first) {
        (false, _) => (1, d[0]),
        (true, true) => (d[0], d[1]),
        (true, false) => (d[1], d[0]),
    };
    if n != batch_size {
        candle::bail!(
            "query has batch size {n} (shape {d:?}, batch_first={}) but the {what} was made for batch size {batch_size}",
            cfg.batch_first
        )
    }
    Ok(QueryDims {
        batched,
        n,
        t,
        seq_first,
    })
}

/// Checks the key padding mask of the new positions: `(N, T)`, or `(T)` / `(1, T)` for an
/// unbatched query; u8 or float in the query's dtype. Returns it as `(N, T)`.
pub(super) fn check_new_padding(
    mask: Option<&Tensor>,
    dims: &QueryDims,
    query: &Tensor,
) -> Result<Option<Tensor>> {
    let Some(m) = mask else { return Ok(None) };
    let (n, t) = (dims.n, dims.t);
    let ok = m.dims() == [n, t] || (!dims.batched && m.dims() == [t]);
    if !ok {
        candle::bail!(
            "key_padding_mask of the new positions should be (N, T) = ({n}, {t}){}, but got shape {:?}",
            if dims.batched { "" } else { " or (T)" },
            m.dims()
        )
    }
    check_mask_dtype("key_padding_mask", m, query.dtype())?;
    if !m.device().same_device(query.device()) {
        candle::bail!(
            "key_padding_mask is on {:?} but query is on {:?}",
            m.device().location(),
            query.device().location()
        )
    }
    Ok(Some(m.reshape((n, t))?))
}

fn check_mask_dtype(name: &str, m: &Tensor, dtype: DType) -> Result<()> {
    match m.dtype() {
        DType::U8 => Ok(()),
        d if d == dtype => Ok(()),
        d if is_float(d) => candle::bail!(
            "float {name} has dtype {d:?} but the query has {dtype:?}: a float mask must have the query's dtype"
        ),
        d => candle::bail!(
            "only u8 (nonzero = masked) and float {name} are supported, got dtype {d:?}"
        ),
    }
}

/// Checks a memory's key, value and key padding mask; returns its sizes (`t` = memory length).
pub(super) fn check_memory_inputs(
    cfg: &MultiheadAttentionConfig,
    g: &CacheGeometry,
    key: &Tensor,
    value: &Tensor,
    key_padding_mask: Option<&Tensor>,
) -> Result<QueryDims> {
    let batched = check_tensor("key", key, g)?;
    let v_batched = check_tensor("value", value, g)?;
    if batched != v_batched {
        candle::bail!(
            "key and value must have the same rank, got shapes {:?} and {:?}",
            key.dims(),
            value.dims()
        )
    }
    crate::attention::checks::check_key_value(cfg, key, value)?;
    let d = key.dims();
    let (n, t) = match (batched, cfg.batch_first) {
        (false, _) => (1, d[0]),
        (true, true) => (d[0], d[1]),
        (true, false) => (d[1], d[0]),
    };
    if let Some(m) = key_padding_mask {
        let ok = m.dims() == [n, t] || (!batched && m.dims() == [t]);
        if !ok {
            candle::bail!(
                "memory key_padding_mask should be {}, but got shape {:?}",
                if batched {
                    format!("(N, S) = ({n}, {t})")
                } else {
                    format!("(S) = ({t})")
                },
                m.dims()
            )
        }
        check_mask_dtype("key_padding_mask", m, g.dtype)?;
        if !m.device().same_device(&g.device) {
            candle::bail!(
                "key_padding_mask is on {:?} but the module is on {:?}",
                m.device().location(),
                g.device.location()
            )
        }
    }
    Ok(QueryDims {
        batched,
        n,
        t,
        seq_first: !batched || !cfg.batch_first,
    })
}
