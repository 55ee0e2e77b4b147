//! `gelu(x Wᵀ + b)` as one op: the MLP's first layer and its activation.
//!
//! As two ops (fused linear, then GELU) the backward pass writes the GELU's input gradient
//! into a new tensor and candle adds it into a fresh zero tensor before the linear's backward
//! reads it: two extra passes over the widest activation of a block (`ff_dim` per token) and
//! one node less in the graph. Here the pre-activation is kept by the op (in a
//! `crate::cpu::Stash`, as the separate GELU op kept its input) and the backward pass goes
//! straight from the output gradient to the pre-activation gradient to the linear's three
//! gradients.

use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use crate::cpu::workspace::{self, AnyBuf, Buf};
use crate::cpu::{
    contiguous, fused, gelu, gelu_grad_into, linear, linear_backward_slice, linear_forward_into,
    linear_out_len, unsupported_dtype, Elem, Grads3, NeedsGrad, Stash,
};

const OP: &str = "fused linear_gelu";

/// The op; `pre` holds `x Wᵀ + b` from the forward pass for the backward pass, in a pooled
/// buffer (`cpu::workspace`) that goes back to the pool when the op (its autograd node) is
/// dropped.
#[derive(Default)]
struct LinearGelu {
    pre: Stash<Arc<AnyBuf>>,
}

impl LinearGelu {
    fn forward<T: Elem>(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: (&CpuStorage, &Layout),
    ) -> Result<(Vec<T>, Shape)>
    where
        AnyBuf: From<Buf<T>>,
    {
        let mut pre = workspace::take::<T>(linear_out_len(x.1, w.1)?);
        let shape = linear_forward_into::<T>(x, w, Some(b), &mut pre)?;
        let y = gelu(&pre);
        self.pre.put(Arc::new(pre.into()));
        Ok((y, shape))
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
        let (gs, gl) = grad.storage_and_layout();
        let g = contiguous::<T, _>(OP, &*gs, gl)?;
        if g.len() != pre.len() {
            candle::bail!(
                "{OP}: output gradient of {} elements for {} outputs",
                g.len(),
                pre.len()
            )
        }
        let mut dpre = workspace::take::<T>(pre.len());
        gelu_grad_into(pre, g, &mut dpre);
        linear_backward_slice(x, w, &dpre, needs)
    }
}

impl CustomOp3 for LinearGelu {
    fn name(&self) -> &'static str {
        "fused-linear-gelu"
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
        let (x, w, b) = ((s1, l1), (s2, l2), (s3, l3));
        match s1 {
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

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        let needs = NeedsGrad::of(x, w, Some(b));
        let pre = self.pre.get(OP)?;
        let grad = grad.contiguous()?;
        let wrong = || {
            candle::Error::Msg(format!(
                "{OP}: the input is {:?} but the forward pass ran in another dtype",
                x.dtype()
            ))
        };
        match x.dtype() {
            DType::F32 => self.backward(f32::of_any(&pre).ok_or_else(wrong)?, (x, w), &grad, needs),
            DType::F64 => self.backward(f64::of_any(&pre).ok_or_else(wrong)?, (x, w), &grad, needs),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

/// `gelu(x (…, K) @ w (Nout, K).T + b)` → `(…, Nout)`: one op forward and backward on the CPU
/// in f32/f64 with a bias, the fused linear and GELU ops otherwise.
///
/// PyTorch equivalent: `F.gelu(F.linear(x, w, b))` (`approximate="none"`).
pub(crate) fn linear_gelu(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) if fused(x) && x.rank() >= 2 => {
            let x = match x.rank() {
                2 => x.clone(),
                _ => x.contiguous()?,
            };
            x.apply_op3(w, b, LinearGelu::default())
        }
        _ => super::gelu_erf(&linear(x, w, b)?),
    }
}
