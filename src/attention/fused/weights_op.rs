//! The weights pass of a fused attention call as a custom op, with its backward: the weights
//! `(N, H, L, S')` (or their head mean) from q, k and the forward's row log-sum-exp, or handed
//! over when the forward pass computed them.

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, Result, Shape, Tensor};

use super::kernel;
use super::op::{FusedAttention, Parts, OP};
use crate::cpu::{contiguous, filled_vec, unsupported_dtype, Elem};

impl FusedAttention {
    pub(super) fn weights_shape(&self, average: bool) -> Shape {
        let g = &self.geom;
        if average {
            (g.n, g.l, g.s).into()
        } else {
            (g.n, g.h, g.l, g.s).into()
        }
    }

    /// Weights `(N, H, L, S')` (or their head mean `(N, L, S')`) from q, k and the stored lse.
    fn weights_t<T: Elem>(
        &self,
        parts: Parts,
        args: [CpuArg; 2],
        average: bool,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let rows = |i: usize| self.arg_rows::<T>(parts, args[i], i);
        let (q, k) = (rows(0)?, rows(1)?);
        let lse_t = self.lse.get(OP)?;
        let lg = lse_t.storage_and_layout();
        let lse = contiguous(OP, &*lg.0, lg.1)?;
        let shape = self.weights_shape(average);
        // SAFETY: kernel::weights writes every element of `out`.
        let out = unsafe {
            filled_vec(shape.elem_count(), |out| {
                self.with_masks(|masks| {
                    kernel::weights(g, q, k, lse, masks, self.dropout.as_ref(), average, out);
                    Ok(())
                })
            })?
        };
        Ok((T::to_cpu_storage_owned(out), shape))
    }

    pub(super) fn weights(
        &self,
        parts: Parts,
        args: [CpuArg; 2],
        average: bool,
    ) -> Result<(CpuStorage, Shape)> {
        if let Some(ready) = self.weights_slot.take() {
            return Ok(ready);
        }
        match args[0].0 {
            CpuStorage::F32(_) => self.weights_t::<f32>(parts, args, average),
            CpuStorage::F64(_) => self.weights_t::<f64>(parts, args, average),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }
}

/// The weights pass of a [`FusedAttention`] call (run after it: it reads its lse).
#[derive(Clone, Debug)]
pub(crate) struct FusedWeights {
    pub attn: FusedAttention,
    /// Head mean `(N, L, S')` rather than `(N, H, L, S')`.
    pub average: bool,
}

impl FusedWeights {
    /// Gradients of q and k (head space `(N, H, ·, d)`) from the weights' gradient, with
    /// materialised `(N, H, L, S')` tensors: the weights are that size already, and this path
    /// runs only when a loss depends on them.
    pub(super) fn grads(
        &self,
        parts: Parts,
        q: &Tensor,
        k: &Tensor,
        grad: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let g = &self.attn.geom;
        let (q4, k4) = match parts {
            Parts::Packed => {
                let e = self.attn.e();
                (
                    self.heads(&q.narrow(2, 0, e)?)?,
                    self.heads(&q.narrow(2, e, e)?)?,
                )
            }
            Parts::Separate => (self.heads(q)?, self.heads(k)?),
        };
        // Probabilities before dropout and averaging.
        let probs = {
            let plain = FusedWeights {
                attn: FusedAttention {
                    dropout: None,
                    weights_slot: Default::default(),
                    ..self.attn.clone()
                },
                average: false,
            };
            match parts {
                Parts::Packed => q.detach().apply_op1_no_bwd(&plain)?,
                Parts::Separate => q.detach().apply_op2_no_bwd(&k.detach(), &plain)?,
            }
        };
        let mut gp = if self.average {
            (grad.unsqueeze(1)?.broadcast_as(probs.shape())? * (1.0 / g.h as f64))?
        } else {
            grad.clone()
        };
        if let Some(dm) = &self.attn.dropout {
            gp = (gp * dm.factors(probs.shape(), probs.dtype(), probs.device())?)?;
        }
        let row = (&gp * &probs)?.sum_keepdim(3)?;
        let ds = (probs * gp.broadcast_sub(&row)?)?;
        let dq = (ds.matmul(&k4)? * g.scale)?;
        let dk = (ds.t()?.contiguous()?.matmul(&q4)? * g.scale)?;
        Ok((self.merge(&dq)?, self.merge(&dk)?))
    }

    /// `(A, B, E)` in the caller's layout → `(N, H, len, d)` contiguous.
    fn heads(&self, t: &Tensor) -> Result<Tensor> {
        let g = &self.attn.geom;
        let (a, b, _) = t.dims3()?;
        let t = t.reshape((a, b, g.h, g.d))?;
        match self.attn.seq_first {
            true => t.permute((1, 2, 0, 3))?.contiguous(),
            false => t.permute((0, 2, 1, 3))?.contiguous(),
        }
    }

    /// `(N, H, len, d)` → `(A, B, E)` in the caller's layout.
    fn merge(&self, t: &Tensor) -> Result<Tensor> {
        let (n, h, len, d) = t.dims4()?;
        match self.attn.seq_first {
            true => t.permute((2, 0, 1, 3))?.reshape((len, n, h * d)),
            false => t.permute((0, 2, 1, 3))?.reshape((n, len, h * d)),
        }
    }
}

crate::cpu::custom_op!(CustomOp1 for FusedWeights, "fused-attention-weights-packed",
    fwd: fwd_packed, bwd: bwd_packed);
crate::cpu::custom_op!(CustomOp2 for FusedWeights, "fused-attention-weights",
    fwd: fwd_separate, bwd: bwd_separate);

impl FusedWeights {
    fn fwd_packed(&self, [x]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        self.attn.weights(Parts::Packed, [x, x], self.average)
    }

    fn bwd_packed(&self, [qkv]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Result<Grads<1>> {
        let (dq, dk) = self.grads(Parts::Packed, qkv, qkv, grad)?;
        let dv = dq.zeros_like()?;
        Ok([Some(Tensor::cat(&[dq, dk, dv], 2)?)])
    }

    fn fwd_separate(&self, qk: [CpuArg; 2]) -> Result<(CpuStorage, Shape)> {
        self.attn.weights(Parts::Separate, qk, self.average)
    }

    fn bwd_separate(&self, [q, k]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let (dq, dk) = self.grads(Parts::Separate, q, k, grad)?;
        Ok([Some(dq), Some(dk)])
    }
}
