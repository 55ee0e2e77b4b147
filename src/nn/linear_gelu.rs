//! `gelu(x Wᵀ + b)` as one op: the MLP's first layer and its activation.
//!
//! As two ops (fused linear, then GELU) the backward pass writes the GELU's input gradient
//! into a new tensor and candle adds it into a fresh zero tensor before the linear's backward
//! reads it: two extra passes over the widest activation of a block (`ff_dim` per token) and
//! one node less in the graph. Here the pre-activation is kept by the op (in a
//! `crate::cpu::Stash`, as the separate GELU op kept its input) and the backward pass goes
//! straight from the output gradient to the pre-activation gradient to the linear's three
//! gradients.

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Result, Shape, Tensor};

use crate::cpu::workspace::{self, AnyBuf, Buf};
use crate::cpu::{
    contiguous, fused, gelu, gelu_grad_into, gelu_into, linear, linear_backward_kept,
    linear_backward_slice, linear_forward_into, linear_forward_kept, linear_out_len,
    unsupported_dtype, Elem, GeluApproximate, Grads3, NeedsGrad, Stash,
};

const OP: &str = "fused linear_gelu";

/// The op; `pre` holds `x Wᵀ + b` from the forward pass for the backward pass, in a pooled
/// buffer (`cpu::workspace`) that goes back to the pool when the op (its autograd node) is
/// dropped.
#[derive(Clone, Default)]
struct LinearGelu {
    pre: Stash<Arc<AnyBuf>>,
    /// `Some`: the activation stays in a pooled buffer for an [`MlpOutput`] (the op returns
    /// a one-element token that only links the two ops in the graph).
    hidden: Option<Hidden>,
    /// Exact, or the tanh approximation.
    approximate: GeluApproximate,
}

/// The MLP's hidden activation handed from [`LinearGelu`] to its [`MlpOutput`] instead of
/// being a tensor: in the graph it would cost a fresh `(…, ff_dim)` buffer in the forward
/// pass, and in the backward pass a fresh gradient that candle adds into another fresh zero
/// tensor (three buffers as wide as the widest activation of a block, per step).
#[derive(Clone, Debug, Default)]
struct Hidden {
    /// `gelu(x Wᵀ + b)` (pooled) and its shape.
    value: Stash<(Arc<AnyBuf>, Shape)>,
    /// Its gradient (pooled), from the second layer's backward pass to the first's.
    grad: Stash<AnyBuf>,
}

impl LinearGelu {
    fn forward<T: Elem>(&self, x: CpuArg, w: CpuArg, b: CpuArg) -> Result<(Vec<T>, Shape)>
    where
        AnyBuf: From<Buf<T>>,
    {
        let mut pre = workspace::take::<T>(linear_out_len(x.1, w.1)?);
        let shape = linear_forward_into::<T>(x, w, Some(b), &mut pre)?;
        let out = match &self.hidden {
            None => (gelu(&pre, self.approximate), shape),
            Some(hidden) => {
                let mut h = workspace::take::<T>(pre.len());
                gelu_into(&pre, &mut h, self.approximate);
                hidden.value.put((Arc::new(h.into()), shape));
                (vec![T::ZERO], Shape::from(1))
            }
        };
        self.pre.put(Arc::new(pre.into()));
        Ok(out)
    }

    /// The gradients of x, w and b: `dL/d pre = g · gelu'(pre)` in a pooled buffer, straight
    /// into the linear's backward products.
    fn backward<T: Elem>(
        &self,
        pre: &[T],
        (x, w): (&Tensor, &Tensor),
        grad: &Tensor,
        needs: NeedsGrad,
    ) -> Result<Grads3> {
        // With an `MlpOutput`, the gradient is the one its backward pass left (`grad` is the
        // token's).
        let kept = match &self.hidden {
            Some(hidden) => Some(hidden.grad.take().ok_or_else(|| {
                candle::Error::Msg(format!("{OP}: the second layer left no gradient"))
            })?),
            None => None,
        };
        let (gs, gl) = grad.storage_and_layout();
        let g = match &kept {
            Some(buf) => T::of_any(buf).ok_or_else(|| {
                candle::Error::Msg(format!(
                    "{OP}: the second layer's gradient has another dtype"
                ))
            })?,
            None => contiguous::<T, _>(OP, &*gs, gl)?,
        };
        if g.len() != pre.len() {
            candle::bail!(
                "{OP}: output gradient of {} elements for {} outputs",
                g.len(),
                pre.len()
            )
        }
        let mut dpre = workspace::take::<T>(pre.len());
        gelu_grad_into(pre, g, &mut dpre, self.approximate);
        linear_backward_slice(x, w, &dpre, needs)
    }
}

crate::cpu::custom_op!(CustomOp3 for LinearGelu, "fused-linear-gelu", fwd: fwd, bwd: bwd);

impl LinearGelu {
    fn fwd(&self, [x, w, b]: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        match x.0 {
            CpuStorage::F32(_) => {
                let (y, shape) = self.forward::<f32>(x, w, b)?;
                Ok((CpuStorage::F32(y), shape))
            }
            CpuStorage::F64(_) => {
                let (y, shape) = self.forward::<f64>(x, w, b)?;
                Ok((CpuStorage::F64(y), shape))
            }
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    fn bwd(&self, [x, w, b]: [&Tensor; 3], _: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        let needs = NeedsGrad::of(x, w, Some(b));
        let pre = self.pre.get(OP)?;
        let grad = grad.contiguous()?;
        let wrong = || {
            candle::Error::Msg(format!(
                "{OP}: the input is {:?} but the forward pass ran in another dtype",
                x.dtype()
            ))
        };
        let (dx, dw, db) = match x.dtype() {
            DType::F32 => self.backward(f32::of_any(&pre).ok_or_else(wrong)?, (x, w), &grad, needs),
            DType::F64 => self.backward(f64::of_any(&pre).ok_or_else(wrong)?, (x, w), &grad, needs),
            dt => Err(unsupported_dtype(OP, dt)),
        }?;
        Ok([dx, dw, db])
    }
}

/// `gelu(x (…, K) @ w (Nout, K).T + b)` → `(…, Nout)`: one op forward and backward on the CPU
/// in f32/f64 with a bias, the fused linear and GELU ops otherwise.
///
/// PyTorch equivalent: `F.gelu(F.linear(x, w, b))` (`approximate="none"`).
pub fn linear_gelu(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    linear_gelu_with(x, w, b, GeluApproximate::None)
}

/// [`linear_gelu`] with the exact GELU or its tanh approximation.
///
/// PyTorch equivalent: `F.gelu(F.linear(x, w, b), approximate=...)`.
pub fn linear_gelu_with(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    approximate: GeluApproximate,
) -> Result<Tensor> {
    match b {
        Some(b) if fused(x) && x.rank() >= 2 => {
            let x = match x.rank() {
                2 => x.clone(),
                _ => x.contiguous()?,
            };
            crate::cpu::keep_weights(&[w]);
            let op = LinearGelu {
                approximate,
                ..LinearGelu::default()
            };
            x.apply_op3(w, b, op)
        }
        _ => gelu_ops(&linear(x, w, b)?, approximate),
    }
}

/// The GELU on candle's ops (other devices and dtypes, no bias).
fn gelu_ops(x: &Tensor, approximate: GeluApproximate) -> Result<Tensor> {
    match approximate {
        GeluApproximate::None => super::gelu_erf(x),
        GeluApproximate::Tanh => x.gelu(),
    }
}

/// The MLP's second layer as an op on its first layer's token: `h · w2ᵀ + b2`, with `h` read
/// from the first layer's pooled buffer and its gradient written into another, for the
/// first layer's backward pass.
///
/// PyTorch equivalent: `linear2(F.gelu(linear1(x)))`'s second linear.
#[derive(Clone)]
struct MlpOutput {
    /// The first layer's op of the same call (sharing its stashes).
    first: LinearGelu,
    /// Whether `h` stays for the backward pass: only `d w2` reads it, so a frozen `w2` (LoRA)
    /// lets it go once the forward pass has used it.
    keep_hidden: bool,
}

impl MlpOutput {
    fn hidden(&self) -> Result<&Hidden> {
        match &self.first.hidden {
            Some(h) => Ok(h),
            None => candle::bail!("{OP}: the first layer keeps no activation"),
        }
    }

    fn fwd(&self, _token: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
        let value = &self.hidden()?.value;
        let (h, shape) = match self.keep_hidden {
            true => value.get(OP)?,
            false => value
                .take()
                .ok_or_else(|| candle::Error::Msg(format!("{OP}: the first layer has not run")))?,
        };
        linear_forward_kept((&h, &shape), w, b)
    }

    /// `d h = g · w2` (into a pooled buffer for the first layer, when the token needs a
    /// gradient), `d w2 = gᵀ · h`, `d b2` the column sums of `g`.
    fn bwd(&self, [token, w, _, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
        let h = match self.keep_hidden {
            true => Some(self.hidden()?.value.get(OP)?.0),
            false => None,
        };
        linear_backward_kept(OP, h.as_deref(), (token, w, grad), needs, |dh| {
            self.hidden()?.grad.put(dh);
            Ok(())
        })
    }
}

crate::cpu::op_with_optional_bias!(MlpOutput, "fused-mlp-output");

/// `gelu(x Wᵢᵀ + bᵢ) W₂ᵀ + b₂` (a Transformer block's feed-forward part): on the CPU in
/// f32/f64 with a first-layer bias two ops whose hidden activation `(…, ff_dim)` never
/// becomes a tensor (kept in the scratch pool between the passes); [`linear_gelu`] and a
/// linear otherwise.
///
/// PyTorch equivalent: `linear2(F.gelu(linear1(x)))`.
pub fn mlp(
    x: &Tensor,
    first: (&Tensor, Option<&Tensor>),
    second: (&Tensor, Option<&Tensor>),
) -> Result<Tensor> {
    mlp_with(x, first, second, GeluApproximate::None)
}

/// [`mlp`] with the exact GELU or its tanh approximation (GPT-2's MLP).
///
/// PyTorch equivalent: `linear2(F.gelu(linear1(x), approximate=...))`.
pub fn mlp_with(
    x: &Tensor,
    (w1, b1): (&Tensor, Option<&Tensor>),
    (w2, b2): (&Tensor, Option<&Tensor>),
    approximate: GeluApproximate,
) -> Result<Tensor> {
    match b1 {
        Some(b1) if fused(x) && x.rank() >= 2 => {
            let x = match x.rank() {
                2 => x.clone(),
                _ => x.contiguous()?,
            };
            let first = LinearGelu {
                pre: Stash::default(),
                hidden: Some(Hidden::default()),
                approximate,
            };
            crate::cpu::keep_weights(&[w1, w2]);
            let token = x.apply_op3(w1, b1, first.clone())?;
            let out = MlpOutput {
                first,
                keep_hidden: w2.track_op(),
            };
            match b2 {
                Some(b2) => token.apply_op3(w2, b2, out),
                None => token.apply_op2(w2, out),
            }
        }
        _ => linear(&linear_gelu_with(x, w1, b1, approximate)?, w2, b2),
    }
}
