//! Packed self-attention with its input projection as one op: `x → x·Wᵀ + b → attention`.
//!
//! The packed projection `(·, ·, 3E)` stays inside the op (kept for the backward pass) rather
//! than being a tensor of the autograd graph: candle adds every node's gradient into a fresh
//! zero tensor, which for a `3E`-wide projection is a memset, an add and two buffers per
//! step. The backward pass hands the attention gradient straight to the projection's.
//!
//! PyTorch equivalent: `_in_projection_packed` followed by the attention of
//! `F.multi_head_attention_forward`, for `query is key is value`.

use candle::backend::BackendStorage;
use candle::{CpuStorage, CustomOp2, CustomOp3, Device, Layout, Result, Shape, Tensor};

use super::op::{FusedAttention, OP};
use crate::cpu::{linear_backward, linear_forward, unsupported_dtype, AsCpu, Elem, Stash};

/// The op on `x (A, B, E)`, the packed `in_proj_weight (3E, E)` and optional
/// `in_proj_bias (3E)`, giving the attention context `(A, B, E)` (heads merged).
#[derive(Clone, Debug)]
pub(crate) struct ProjectedSelfAttention {
    attn: FusedAttention,
    /// The projection of the forward pass, for the backward pass.
    qkv: Stash<Tensor>,
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

    fn fwd(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        fn project<T: Elem>(
            x: (&CpuStorage, &Layout),
            w: (&CpuStorage, &Layout),
            b: Option<(&CpuStorage, &Layout)>,
        ) -> Result<Tensor> {
            let (qkv, shape) = linear_forward::<T>(x, w, b)?;
            Tensor::from_vec(qkv, shape, &Device::Cpu)
        }
        let qkv = match x.0 {
            CpuStorage::F32(_) => project::<f32>(x, w, b)?,
            CpuStorage::F64(_) => project::<f64>(x, w, b)?,
            other => return Err(unsupported_dtype(OP, other.dtype())),
        };
        let out = {
            let (storage, layout) = qkv.storage_and_layout();
            self.attn.fwd_packed(storage.as_cpu(OP)?, layout)?
        };
        self.qkv.put(qkv);
        Ok(out)
    }

    /// Gradients of x, the weight and (with `bias`) the bias.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
        bias: bool,
    ) -> Result<Vec<Tensor>> {
        let qkv = self.qkv.get(OP)?;
        let dqkv = self.attn.bwd_packed(&qkv, res, grad)?;
        linear_backward(x, w, &dqkv, bias)
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
