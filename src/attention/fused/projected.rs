//! Packed self-attention with its input projection as one op: `x → x·Wᵀ + b → attention`.
//!
//! The packed projection `(·, ·, 3E)` stays inside the op (kept for the backward pass) rather
//! than being a tensor of the autograd graph: candle adds every node's gradient into a fresh
//! zero tensor, which for a `3E`-wide projection is a memset, an add and two buffers per
//! step. The backward pass hands the attention gradient straight to the projection's.
//!
//! The module's forward pass (no head mask) also keeps the attention context out of the
//! graph: the attention op returns a one-element token, and the output projection is a
//! second op on that token (`output.rs`) that reads the context from a pooled buffer and, in
//! its backward pass, leaves the context's gradient in another for the attention op. At
//! (4,1024,1024,16) that removed four fresh 16 MB buffers per training step (the context,
//! its gradient, and candle's zero tensor and sum for it). Two backward passes of one graph
//! run one after the other (candle's `backward` is sequential); two at once on the same
//! graph from two threads are not supported.
//!
//! PyTorch equivalent: `_in_projection_packed` followed by the attention of
//! `F.multi_head_attention_forward`, for `query is key is value`.

use crate::cpu::CpuArg;
use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{CpuStorage, Result, Shape, Tensor};

use super::op::{FusedAttention, Parts, OP};
use super::weights_op::FusedWeights;
use crate::cpu::workspace::{self, AnyBuf};
use crate::cpu::{
    linear_backward_slice, linear_forward_into, linear_out_len, unsupported_dtype, Elem, Grads3,
    NeedsGrad, Stash,
};
use output::ProjectedOutput;

/// The op on `x (A, B, E)`, the packed `in_proj_weight (3E, E)` and optional
/// `in_proj_bias (3E)`, giving the attention context `(A, B, E)` (heads merged), or, when
/// the output projection is a [`ProjectedOutput`], a one-element token that only links the
/// two ops in the graph.
#[derive(Clone, Debug)]
pub(crate) struct ProjectedSelfAttention {
    attn: FusedAttention,
    /// The projection of the forward pass, for the backward pass: a pooled buffer (see
    /// `cpu::workspace`), back in the pool when the op (its autograd node) is dropped.
    qkv: Stash<Arc<AnyBuf>>,
    /// `Some`: the context stays in a pooled buffer for [`ProjectedOutput`].
    context: Option<Context>,
}

/// The attention context handed between [`ProjectedSelfAttention`] and its
/// [`ProjectedOutput`] instead of being a tensor: in the graph it would cost a fresh
/// `(A, B, E)` buffer in the forward pass, and in the backward pass a fresh gradient that
/// candle then adds into another fresh zero tensor.
#[derive(Clone, Debug, Default)]
struct Context {
    /// The context (pooled) and its shape, from the attention's forward pass.
    value: Stash<(Arc<AnyBuf>, Shape)>,
    /// Its gradient (pooled), from the output projection's backward pass to the
    /// attention's, which takes it.
    grad: Stash<AnyBuf>,
}

impl ProjectedSelfAttention {
    /// With `attn.with_weights`, the forward pass also leaves the weights for
    /// [`ProjectedWeights`].
    pub(crate) fn new(attn: FusedAttention) -> Self {
        Self {
            attn,
            qkv: Default::default(),
            context: None,
        }
    }

    /// The op whose result is the token of a [`ProjectedOutput`].
    fn with_output_op(attn: FusedAttention) -> Self {
        Self {
            context: Some(Context::default()),
            ..Self::new(attn)
        }
    }

    fn context(&self) -> Result<&Context> {
        match &self.context {
            Some(c) => Ok(c),
            None => candle::bail!("{OP}: the op keeps no context for an output projection"),
        }
    }

    fn fwd_t<T: Elem>(&self, x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)>
    where
        AnyBuf: From<workspace::Buf<T>>,
    {
        let mut qkv = workspace::take::<T>(linear_out_len(x.1, w.1)?);
        linear_forward_into::<T>(x, w, b, &mut qkv)?;
        let out = match &self.context {
            None => self.attn.fwd_packed_slice::<T>(&qkv)?,
            Some(c) => {
                let mut ctx = workspace::take::<T>(self.attn.context_len());
                let shape = self.attn.fwd_packed_into::<T>(&qkv, &mut ctx)?;
                c.value.put((Arc::new(ctx.into()), shape));
                (T::to_cpu_storage_owned(vec![T::ZERO]), Shape::from(1))
            }
        };
        self.qkv.put(Arc::new(qkv.into()));
        Ok(out)
    }

    fn fwd(&self, x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
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
        match &self.context {
            None => self.attn.bwd_packed_slice(qkv, res, grad, &mut dqkv)?,
            Some(c) => {
                let (ctx, _) = c.value.get(OP)?;
                let Some(d_ctx) = c.grad.take() else {
                    candle::bail!("{OP}: the output projection's backward pass has not run")
                };
                match (T::of_any(&ctx), T::of_any(&d_ctx)) {
                    (Some(o), Some(d)) => self.attn.bwd_packed_slices(qkv, (o, d), &mut dqkv)?,
                    _ => candle::bail!("{OP}: the context is not of the input's dtype"),
                }
            }
        }
        linear_backward_slice(x, w, &dqkv, needs)
    }

    fn bwd(&self, [x, w, res, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
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
    fn fwd(&self, _x: CpuArg, _w: CpuArg, _b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
        match self.op.attn.weights_slot.take() {
            Some(ready) => Ok(ready),
            None => candle::bail!("{OP}: the weights were not computed by the forward pass"),
        }
    }

    /// Gradients of x, the weight and the bias (those `needs` names) from the weights'
    /// gradient.
    fn bwd(&self, [x, w, _, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
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
    let op = ProjectedSelfAttention::new(attn);
    let ctx = apply(&x, w, b, op.clone())?;
    Ok((ctx, weights_of(&x, w, b, op)?))
}

/// Packed self-attention on `x (A, B, E)` (contiguous, CPU, f32 or f64) through the output
/// projection `out_w (E_out, E)`, `out_b (E_out)`: the output `(A, B, E_out)` and, when
/// `attn` asks for them, the weights (batch-major). The context never becomes a tensor: the
/// attention op hands it to the output projection's op in a pooled buffer, and the
/// projection's backward pass hands its gradient back the same way.
pub(crate) fn projected_self_attention_output(
    x: &Tensor,
    (w, b): (&Tensor, Option<&Tensor>),
    (out_w, out_b): (&Tensor, Option<&Tensor>),
    attn: FusedAttention,
) -> Result<(Tensor, Option<Tensor>)> {
    let x = x.contiguous()?;
    let op = ProjectedSelfAttention::with_output_op(attn);
    let token = apply(&x, w, b, op.clone())?;
    let weights = weights_of(&x, w, b, op.clone())?;
    Ok((
        apply(&token, out_w, out_b, ProjectedOutput { op })?,
        weights,
    ))
}

/// An op on `(x, w, optional b)` applied as `CustomOp3` with the bias, else `CustomOp2`.
fn apply<Op>(x: &Tensor, w: &Tensor, b: Option<&Tensor>, op: Op) -> Result<Tensor>
where
    Op: candle::CustomOp2 + candle::CustomOp3 + Send + Sync + 'static,
{
    crate::cpu::keep_weights(&[w]);
    match b {
        Some(b) => x.apply_op3(w, b, op),
        None => x.apply_op2(w, op),
    }
}

/// The weights of the call `op` ran, when it was asked for them.
fn weights_of(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    op: ProjectedSelfAttention,
) -> Result<Option<Tensor>> {
    op.attn
        .with_weights
        .map(|average| apply(x, w, b, ProjectedWeights { op, average }))
        .transpose()
}

mod output;
#[cfg(test)]
mod tests;
