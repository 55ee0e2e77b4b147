//! The attention step by the fused CPU kernel (FlashAttention-2 scheme).

use candle::{DType, Result, Tensor};

use super::projection::Projected;
use super::{Call, MultiheadAttention};
use crate::attention::checks::Dims;
use crate::attention::fused::{FusedAttention, FusedWeights, Geom};
use crate::attention::mask::additive_mask;
use crate::nn::dropout::DropoutMask;
use crate::numerics::softmax_dtype;

impl MultiheadAttention {
    /// The fused kernel's op for one call: `extra` appended key rows, masks in `mask_dt` (the
    /// kernel's dtype on the CPU, f32 on CUDA).
    pub(super) fn fused_op(
        &self,
        call: &Call,
        extra: usize,
        mask_dt: DType,
    ) -> Result<FusedAttention> {
        let cfg = &self.config;
        let Dims { n, l, s, .. } = *call.dims;
        let (h, hd) = (cfg.num_heads, cfg.head_dim());
        let opts = call.opts;
        let attn_mask = match &opts.attn_mask {
            Some(m) if m.rank() == 2 => Some(additive_mask(m, mask_dt)?.contiguous()?),
            Some(m) => Some(
                additive_mask(m, mask_dt)?
                    .reshape((n * h, l, s))?
                    .contiguous()?,
            ),
            None => None,
        };
        let key_padding_mask = match &opts.key_padding_mask {
            Some(m) => Some(additive_mask(m, mask_dt)?.reshape((n, s))?.contiguous()?),
            None => None,
        };
        let dropout = match call.dropout_seed {
            // Row b of this call is row `dropout_first_row + b` of the weights' (N, H, L, S')
            // counter space.
            Some(seed) => Some(
                DropoutMask::new(cfg.dropout, seed)?
                    .with_offset((opts.dropout_first_row * h * l * (s + extra)) as u64),
            ),
            None => None,
        };
        Ok(FusedAttention {
            geom: Geom {
                n,
                h,
                l,
                s: s + extra,
                d: hd,
                s_masked: s,
                causal: opts.is_causal && opts.attn_mask.is_none(),
                scale: (1.0 / hd as f64).sqrt(),
                group: 1,
            },
            seq_first: call.seq_first,
            attn_mask,
            key_padding_mask,
            dropout,
            lse: Default::default(),
            with_weights: opts.need_weights.then_some(opts.average_attn_weights),
            weights_slot: Default::default(),
        })
    }

    /// The attention step by the fused kernel: context `(A, B, E)` and the weights.
    pub(super) fn attend_fused(
        &self,
        projected: Projected,
        call: &Call,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let dtype = self.dtype();
        let (projected, extra) = self.append_extra_keys(projected, call)?;
        // On the CPU the half types run in f32 (the kernel accumulates in its dtype); the CUDA
        // kernel takes them as they are (f32 accumulation on tensor cores) and f32 masks.
        let (kdt, mask_dt) = match self.out_proj.weight().device().is_cuda() {
            true => (dtype, DType::F32),
            false => (softmax_dtype(dtype), softmax_dtype(dtype)),
        };
        let projected = projected.into_dtype(kdt)?;
        let opts = call.opts;
        let op = self.fused_op(call, extra, mask_dt)?;
        let ctx = match &projected {
            Projected::Packed(qkv) => qkv.apply_op1(op.clone())?,
            Projected::Separate(q, k, v) => q.apply_op3(k, v, op.clone())?,
        };
        let weights = match opts.need_weights {
            false => None,
            true => {
                let wop = FusedWeights {
                    attn: op,
                    average: opts.average_attn_weights,
                };
                let w = match &projected {
                    Projected::Packed(qkv) => qkv.apply_op1(wop)?,
                    Projected::Separate(q, k, _) => q.apply_op2(k, wop)?,
                };
                Some(w.to_dtype(dtype)?)
            }
        };
        Ok((ctx.to_dtype(dtype)?, weights))
    }
}
