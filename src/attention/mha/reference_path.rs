//! The attention step op by op on materialised scores: `F.multi_head_attention_forward`
//! step by step, the reference the fused kernel is tested against.

use candle::{Result, Tensor};

use super::projection::Projected;
use super::{Call, MultiheadAttention};
use crate::attention::checks::Dims;
use crate::attention::mask::merged_mask;
use crate::attention::softmax::{masked_softmax_fused, safe_softmax_last_dim};
use crate::nn::dropout::seeded_dropout_at;
use crate::numerics::softmax_dtype;

impl MultiheadAttention {
    /// The attention step op by op on materialised scores (the reference): context
    /// `(A, B, E)` and the weights.
    pub(super) fn attend_reference(
        &self,
        projected: Projected,
        call: &Call,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let cfg = &self.config;
        let dtype = self.dtype();
        let Dims { n, l, .. } = *call.dims;
        let (e, h, hd) = (cfg.embed_dim, cfg.num_heads, cfg.head_dim());
        let seq_first = call.seq_first;
        let opts = call.opts;
        let (projected, extra) = self.append_extra_keys(projected, call)?;
        let (q, k, v) = projected.split(e)?;
        let to_heads = |t: &Tensor| -> Result<Tensor> {
            let (a, b, _) = t.dims3()?;
            let t = t.reshape((a, b, h, hd))?;
            let t = if seq_first {
                t.permute((1, 2, 0, 3))?
            } else {
                t.permute((0, 2, 1, 3))?
            };
            t.contiguous() // (N, H, len, hd)
        };
        // q is scaled before the product, by sqrt(1/hd) rounded to the dtype, as PyTorch does.
        let q = (to_heads(&q)? * (1.0 / hd as f64).sqrt())?;
        let (k, v) = (to_heads(&k)?, to_heads(&v)?);
        // Scores and softmax in f32 for the half types.
        let sm_dtype = softmax_dtype(dtype);
        let scores = q.matmul(&k.t()?)?.to_dtype(sm_dtype)?; // (N, H, L, S')
        let mask = merged_mask(opts, call.dims, h, extra, sm_dtype, q.device())?;
        let mut probs = match (q.device().is_cpu(), mask) {
            // On the CPU this path is the reference: PyTorch's ops, one by one.
            (true, Some(mask)) => safe_softmax_last_dim(&scores.broadcast_add(&mask)?)?,
            (true, None) => safe_softmax_last_dim(&scores)?,
            // Elsewhere (CUDA) one softmax kernel instead of six passes over the scores.
            (false, mask) => masked_softmax_fused(&scores, mask.as_ref())?,
        };
        if let Some(seed) = call.dropout_seed {
            let (_, heads, rows, keys) = probs.dims4()?;
            let offset = (opts.dropout_first_row * heads * rows * keys) as u64;
            probs = seeded_dropout_at(&probs, cfg.dropout, seed, offset)?;
        }
        let ctx = match k.dim(2)? {
            // No key at all: like a fully masked row, a zero context.
            0 => q.zeros_like()?,
            _ => probs.to_dtype(dtype)?.matmul(&v)?, // (N, H, L, hd)
        };
        // Merge heads (feature h*hd + j) back into the caller's layout.
        let ctx = if seq_first {
            ctx.permute((2, 0, 1, 3))?
        } else {
            ctx.permute((0, 2, 1, 3))?
        };
        let (a, b) = if seq_first { (l, n) } else { (n, l) };
        let ctx = ctx.reshape((a, b, e))?;
        let weights = match opts.need_weights {
            false => None,
            true => {
                let w = match opts.average_attn_weights {
                    true => probs.mean(1)?,
                    false => probs,
                };
                Some(w.to_dtype(dtype)?)
            }
        };
        Ok((ctx, weights))
    }
}
