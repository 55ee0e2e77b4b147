//! The output projection of a [`ProjectedSelfAttention`] call as an op on that call's token:
//! `ctx · out_wᵀ + out_b`, with the context read from the attention op's pooled buffer and
//! its gradient written into another, for the attention op's backward pass.
//!
//! PyTorch equivalent: the `out_proj` linear of `F.multi_head_attention_forward`.

use candle::{CpuStorage, Layout, Result, Shape, Tensor};

use super::{AnyBuf, ProjectedSelfAttention, OP};
use crate::cpu::workspace::{self, Buf};
use crate::cpu::{
    bias_grad, input_grad_into, linear_forward_slice, weight_grad, with_slice, Elem, Grads3,
    NeedsGrad,
};

/// The op on the attention op's one-element token, `out_proj.weight (E_out, E)` and optional
/// `out_proj.bias (E_out)`, giving the output `(A, B, E_out)`. Its backward pass gives the
/// token a zero gradient (what links the two backward passes in candle's graph) and leaves
/// the context's gradient with the attention op.
#[derive(Clone, Debug)]
pub(super) struct ProjectedOutput {
    /// The attention op of the same call (sharing its stashes).
    pub(super) op: ProjectedSelfAttention,
}

impl ProjectedOutput {
    fn fwd(
        &self,
        _token: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let (ctx, shape) = self.op.context()?.value.get(OP)?;
        match &*ctx {
            AnyBuf::F32(c) => {
                let (v, s) = linear_forward_slice::<f32>((c, shape.dims()), w, b)?;
                Ok((CpuStorage::F32(v), s))
            }
            AnyBuf::F64(c) => {
                let (v, s) = linear_forward_slice::<f64>((c, shape.dims()), w, b)?;
                Ok((CpuStorage::F64(v), s))
            }
        }
    }

    fn bwd(
        &self,
        token: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
        needs: NeedsGrad,
    ) -> Result<Grads3> {
        let (ctx, _) = self.op.context()?.value.get(OP)?;
        match &*ctx {
            AnyBuf::F32(c) => self.bwd_t::<f32>(c, token, w, grad, needs),
            AnyBuf::F64(c) => self.bwd_t::<f64>(c, token, w, grad, needs),
        }
    }

    /// `d ctx = g · out_w` (into a pooled buffer for the attention op, when the token needs a
    /// gradient), `d out_w = gᵀ · ctx`, `d out_b` the column sums of `g`.
    fn bwd_t<T: Elem>(
        &self,
        ctx: &[T],
        token: &Tensor,
        w: &Tensor,
        grad: &Tensor,
        needs: NeedsGrad,
    ) -> Result<Grads3>
    where
        AnyBuf: From<Buf<T>>,
    {
        let (n, k) = w.dims2()?;
        let m = ctx.len() / k.max(1);
        with_slice(OP, grad, |g: &[T]| {
            if g.len() != m * n || ctx.len() != m * k {
                candle::bail!(
                    "{OP}: output gradient of {} elements for a ({m}, {n}) output of a context of {}",
                    g.len(),
                    ctx.len()
                )
            }
            let d_token = needs
                .x
                .then(|| {
                    with_slice(OP, w, |wd| {
                        let mut d_ctx = workspace::take::<T>(m * k);
                        // SAFETY: d_ctx holds m·k elements and is the op's own buffer.
                        unsafe { input_grad_into(g, wd, (m, k, n), d_ctx.as_mut_ptr()) };
                        self.op.context()?.grad.put(d_ctx.into());
                        token.zeros_like()
                    })
                })
                .transpose()?;
            let dw = needs
                .w
                .then(|| weight_grad(g, ctx, (m, k, n)))
                .transpose()?;
            let db = needs.b.then(|| bias_grad(g, m, n)).transpose()?;
            Ok((d_token, dw, db))
        })
    }
}

crate::cpu::op_with_optional_bias!(ProjectedOutput, "fused-self-attention-output");
