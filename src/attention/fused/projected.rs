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
use candle::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::op::{FusedAttention, OP};
use crate::cpu::workspace::{self, AnyBuf};
use crate::cpu::{
    linear_backward_slice, linear_forward_into, linear_out_len, unsupported_dtype, Elem, Stash,
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
    /// `attn` must be a call without weights (they would need the projection in the graph).
    pub(crate) fn new(attn: FusedAttention) -> Self {
        debug_assert!(attn.with_weights.is_none());
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
        bias: bool,
    ) -> Result<Vec<Tensor>> {
        let mut dqkv = workspace::take::<T>(qkv.len());
        self.attn.bwd_packed_slice(qkv, res, grad, &mut dqkv)?;
        linear_backward_slice(x, w, &dqkv, bias)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
        bias: bool,
    ) -> Result<Vec<Tensor>> {
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
                self.bwd_t(q, (x, w), (res, grad), bias)
            }
            candle::DType::F64 => {
                let q = f64::of_any(&qkv).ok_or_else(wrong)?;
                self.bwd_t(q, (x, w), (res, grad), bias)
            }
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

impl CustomOp2 for ProjectedSelfAttention {
    fn name(&self) -> &'static str {
        "fused-self-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.fwd((s1, l1), (s2, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut g = self.bwd(x, w, res, grad, false)?.into_iter();
        Ok((g.next(), g.next()))
    }
}

impl CustomOp3 for ProjectedSelfAttention {
    fn name(&self) -> &'static str {
        "fused-self-attention-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.fwd((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut g = self.bwd(x, w, res, grad, true)?.into_iter();
        Ok((g.next(), g.next(), g.next()))
    }
}

/// The attention context of packed self-attention on `x (A, B, E)` (contiguous, CPU, f32 or
/// f64), projections included: one autograd node.
pub(crate) fn projected_self_attention(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    attn: FusedAttention,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let op = ProjectedSelfAttention::new(attn);
    match b {
        Some(b) => x.apply_op3(w, b, op),
        None => x.apply_op2(w, op),
    }
}

#[cfg(test)]
mod tests;
