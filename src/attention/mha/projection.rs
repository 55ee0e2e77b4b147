//! The input projections of one call and the extra key rows (`bias_k`, zero attention) that
//! both attention paths start from.

use candle::{DType, Result, Tensor};

use super::{Call, InProjWeight, MultiheadAttention};
use crate::attention::fused::linear;

/// The input projections of one call, in the caller's 3-D layout.
pub(super) enum Projected {
    /// Self-attention with the packed weight: `(A, B, 3E)`, q | k | v along the last dim.
    Packed(Tensor),
    /// q `(A, B, E)`, k and v `(A', B, E)`.
    Separate(Tensor, Tensor, Tensor),
}

impl Projected {
    /// q, k, v as three tensors (views of the packed one).
    pub(super) fn split(self, e: usize) -> Result<(Tensor, Tensor, Tensor)> {
        match self {
            Projected::Packed(qkv) => Ok((
                qkv.narrow(2, 0, e)?,
                qkv.narrow(2, e, e)?,
                qkv.narrow(2, 2 * e, e)?,
            )),
            Projected::Separate(q, k, v) => Ok((q, k, v)),
        }
    }

    pub(super) fn into_dtype(self, dtype: DType) -> Result<Self> {
        Ok(match self {
            Projected::Packed(t) => Projected::Packed(t.to_dtype(dtype)?),
            Projected::Separate(q, k, v) => {
                Projected::Separate(q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?)
            }
        })
    }
}

impl MultiheadAttention {
    /// Projects the 3-D inputs: `x @ W.T + b` for each of q, k, v, in the caller's layout.
    pub(super) fn in_projection(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        self_attn: bool,
        kv_same: bool,
    ) -> Result<Projected> {
        let e = self.config.embed_dim;
        let bias = |i: usize, parts: usize| -> Result<Option<Tensor>> {
            self.in_proj_bias
                .as_ref()
                .map(|b| b.narrow(0, i * e, parts * e))
                .transpose()
        };
        match &self.in_proj_weight {
            InProjWeight::Packed(w) if self_attn => {
                // One product for all three, as `_in_projection_packed` does.
                Ok(Projected::Packed(linear(query, w, bias(0, 3)?.as_ref())?))
            }
            InProjWeight::Packed(w) if kv_same => {
                let q = linear(query, &w.narrow(0, 0, e)?, bias(0, 1)?.as_ref())?;
                let kv = linear(key, &w.narrow(0, e, 2 * e)?, bias(1, 2)?.as_ref())?;
                Ok(Projected::Separate(
                    q,
                    kv.narrow(2, 0, e)?,
                    kv.narrow(2, e, e)?,
                ))
            }
            InProjWeight::Packed(w) => Ok(Projected::Separate(
                linear(query, &w.narrow(0, 0, e)?, bias(0, 1)?.as_ref())?,
                linear(key, &w.narrow(0, e, e)?, bias(1, 1)?.as_ref())?,
                linear(value, &w.narrow(0, 2 * e, e)?, bias(2, 1)?.as_ref())?,
            )),
            InProjWeight::Separate { q, k, v } => Ok(Projected::Separate(
                linear(query, q, bias(0, 1)?.as_ref())?,
                linear(key, k, bias(1, 1)?.as_ref())?,
                linear(value, v, bias(2, 1)?.as_ref())?,
            )),
        }
    }

    /// q, k, v with the `bias_k` and zero-attention rows appended to k and v (projection
    /// space, the caller's layout; the same values PyTorch appends after the head split), and
    /// the number of rows appended. Both attention paths start from here.
    pub(super) fn append_extra_keys(
        &self,
        projected: Projected,
        call: &Call,
    ) -> Result<(Projected, usize)> {
        let cfg = &self.config;
        let extra = usize::from(cfg.add_bias_kv) + usize::from(cfg.add_zero_attn);
        if extra == 0 {
            return Ok((projected, 0));
        }
        let e = cfg.embed_dim;
        let (q, mut k, mut v) = projected.split(e)?;
        let n = call.dims.n;
        let seq_dim = if call.seq_first { 0 } else { 1 };
        if let (Some(bk), Some(bv)) = (&self.bias_k, &self.bias_v) {
            let row = |b: &Tensor| match call.seq_first {
                true => b.broadcast_as((1, n, e)),
                false => b.broadcast_as((n, 1, e)),
            };
            k = Tensor::cat(&[&k, &row(bk)?], seq_dim)?;
            v = Tensor::cat(&[&v, &row(bv)?], seq_dim)?;
        }
        if cfg.add_zero_attn {
            // Appended after projection and bias: exactly zero in head space.
            k = k.pad_with_zeros(seq_dim, 0, 1)?;
            v = v.pad_with_zeros(seq_dim, 0, 1)?;
        }
        Ok((Projected::Separate(q, k, v), extra))
    }
}
