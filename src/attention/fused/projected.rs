//! Packed self-attention with its input projection as one op: `x → x·Wᵀ + b → attention`.
//!
//! The packed projection `(·, ·, 3E)` stays inside the op (kept for the backward pass) rather
//! than being a tensor of the autograd graph: candle adds every node's gradient into a fresh
//! zero tensor, which for a `3E`-wide projection is a memset, an add and two buffers per
//! step. The backward pass hands the attention gradient straight to the projection's.
//!
//! PyTorch equivalent: `_in_projection_packed` followed by the attention of
//! `F.multi_head_attention_forward`, for `query is key is value`.

use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{CpuStorage, Layout, Result, Shape, Tensor};

use super::op::{FusedAttention, Parts, OP};
use super::weights_op::FusedWeights;
use crate::cpu::workspace::{self, AnyBuf};
use crate::cpu::{
    linear_backward_slice, linear_forward_into, linear_out_len, unsupported_dtype, Elem, Grads3,
    NeedsGrad, Stash,
};

/// The op on `x (A, B, E)`, the packed `in_proj_weight (3E, E)` and optional
/// `in_proj_bias (3E)`, giving the attention context `(A, B, E)` (heads merged).
#[derive(Clone, Debug)]
pub(crate) struct ProjectedSelfAttention {
    attn: FusedAttention,
    /// The projection of the forward pass, for the backward pass: a pooled buffer (see
    /// `cpu::workspace`), back in the pool when the op (its autograd node) is dropped.
    qkv: Stash<Arc<AnyBuf>>,
}

impl ProjectedSelfAttention {
    /// With `attn.with_weights`, the forward pass also leaves the weights for
    /// [`ProjectedWeights`].
    pub(crate) fn new(attn: FusedAttention) -> Self {
        Self {
            attn,
            qkv: Default::default(),
        }
    }

    fn fwd_t<T: Elem>(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)>
    where
        AnyBuf: From<workspace::Buf<T>>,
    {
        let mut qkv = workspace::take::<T>(linear_out_len(x.1, w.1)?);
        linear_forward_into::<T>(x, w, b, &mut qkv)?;
        let out = self.attn.fwd_packed_slice::<T>(&qkv)?;
        self.qkv.put(Arc::new(qkv.into()));
        Ok(out)
    }

    fn fwd(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        match x.0 {
            CpuStorage::F32(_) => self.fwd_t::<f32>(x, w, b),
            CpuStorage::F64(_) => self.fwd_t::<f64>(x, w, b),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    /// Gradients of x, the weight and (with `bias`) the bias: the projection's gradient goes
    /// through a pooled buffer straight into the projection's backward products.
    fn bwd_t<T: Elem>(
        &self,
        qkv: &[T],
        (x, w): (&Tensor, &Tensor),
        (res, grad): (&Tensor, &Tensor),
        needs: NeedsGrad,
    ) -> Result<Grads3> {
        let mut dqkv = workspace::take::<T>(qkv.len());
        self.attn.bwd_packed_slice(qkv, res, grad, &mut dqkv)?;
        linear_backward_slice(x, w, &dqkv, needs)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
        needs: NeedsGrad,
    ) -> Result<Grads3> {
        let qkv = self.qkv.get(OP)?;
        let dt = x.dtype();
        let wrong = || {
            candle::Error::Msg(format!(
                "{OP}: the input is {dt:?} but the forward pass ran in another dtype"
            ))
        };
        match dt {
            candle::DType::F32 => {
                let q = f32::of_any(&qkv).ok_or_else(wrong)?;
                self.bwd_t(q, (x, w), (res, grad), needs)
            }
            candle::DType::F64 => {
                let q = f64::of_any(&qkv).ok_or_else(wrong)?;
                self.bwd_t(q, (x, w), (res, grad), needs)
            }
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

crate::cpu::op_with_optional_bias!(ProjectedSelfAttention, "fused-self-attention");

/// The attention weights of a [`ProjectedSelfAttention`] call, as a second op on the same
/// `x`, weight and bias: its forward pass hands over the weights the attention's forward pass
/// computed; its backward pass (only when a loss depends on the weights) takes them back to
/// the packed projection (kept by the attention op) and through the projection to `x`, the
/// weight and the bias.
#[derive(Clone, Debug)]
struct ProjectedWeights {
    op: ProjectedSelfAttention,
    /// Head mean `(N, L, S)` rather than `(N, H, L, S)`.
    average: bool,
}

impl ProjectedWeights {
    /// The weights the attention's forward pass left (the arguments are that call's).
    fn fwd(
        &self,
        _x: (&CpuStorage, &Layout),
        _w: (&CpuStorage, &Layout),
        _b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        match self.op.attn.weights_slot.take() {
            Some(ready) => Ok(ready),
            None => candle::bail!("{OP}: the weights were not computed by the forward pass"),
        }
    }

    /// Gradients of x, the weight and the bias (those `needs` names) from the weights'
    /// gradient.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
        needs: NeedsGrad,
    ) -> Result<Grads3> {
        let (a, b, e) = x.dims3()?;
        let buf = self.op.qkv.get(OP)?;
        let shape = (a, b, 3 * e);
        let qkv = match (f32::of_any(&buf), f64::of_any(&buf)) {
            (Some(s), _) => Tensor::from_slice(s, shape, x.device())?,
            (_, Some(s)) => Tensor::from_slice(s, shape, x.device())?,
            _ => candle::bail!("{OP}: no packed projection of the forward pass"),
        };
        let weights = FusedWeights {
            attn: self.op.attn.clone(),
            average: self.average,
        };
        let (dq, dk) = weights.grads(Parts::Packed, &qkv, &qkv, grad)?;
        let dqkv = Tensor::cat(&[&dq, &dk, &dq.zeros_like()?], 2)?.reshape((a * b, 3 * e))?;
        let x2 = x.reshape((a * b, e))?;
        Ok((
            needs
                .x
                .then(|| dqkv.matmul(w)?.reshape((a, b, e)))
                .transpose()?,
            needs.w.then(|| dqkv.t()?.matmul(&x2)).transpose()?,
            needs.b.then(|| dqkv.sum(0)).transpose()?,
        ))
    }
}

crate::cpu::op_with_optional_bias!(ProjectedWeights, "fused-self-attention-weights");

/// The attention context of packed self-attention on `x (A, B, E)` (contiguous, CPU, f32 or
/// f64), projections included: one autograd node; and, when `attn` asks for them, the
/// weights (batch-major), a second node on the same arguments.
pub(crate) fn projected_self_attention(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    attn: FusedAttention,
) -> Result<(Tensor, Option<Tensor>)> {
    let x = x.contiguous()?;
    let average = attn.with_weights;
    let op = ProjectedSelfAttention::new(attn);
    let ctx = match b {
        Some(b) => x.apply_op3(w, b, op.clone())?,
        None => x.apply_op2(w, op.clone())?,
    };
    let weights = match average {
        None => None,
        Some(average) => {
            let wop = ProjectedWeights { op, average };
            Some(match b {
                Some(b) => x.apply_op3(w, b, wop)?,
                None => x.apply_op2(w, wop)?,
            })
        }
    };
    Ok((ctx, weights))
}

#[cfg(test)]
mod tests;
