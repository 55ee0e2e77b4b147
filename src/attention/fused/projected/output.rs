//! The output projection of a [`ProjectedSelfAttention`] call as an op on that call's token:
//! `ctx · out_wᵀ + out_b`, with the context read from the attention op's pooled buffer and
//! its gradient written into another, for the attention op's backward pass.
//!
//! PyTorch equivalent: the `out_proj` linear of `F.multi_head_attention_forward`.

use crate::cpu::CpuArg;
use candle::{CpuStorage, Result, Shape, Tensor};

use super::{ProjectedSelfAttention, OP};
use crate::cpu::{linear_backward_kept, linear_forward_kept, Grads3, NeedsGrad};

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
    fn fwd(&self, _token: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
        let (ctx, shape) = self.op.context()?.value.get(OP)?;
        linear_forward_kept((&ctx, &shape), w, b)
    }

    /// `d ctx = g · out_w` (into a pooled buffer for the attention op, when the token needs a
    /// gradient), `d out_w = gᵀ · ctx`, `d out_b` the column sums of `g`.
    fn bwd(&self, [token, w, _, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
        let (ctx, _) = self.op.context()?.value.get(OP)?;
        linear_backward_kept(OP, Some(&ctx), (token, w, grad), needs, |d_ctx| {
            self.op.context()?.grad.put(d_ctx);
            Ok(())
        })
    }
}

crate::cpu::op_with_optional_bias!(ProjectedOutput, "fused-self-attention-output");
