//! The exact GELU `x·Φ(x)` as one op with its backward (the row math is
//! `crate::cpu::gelu`'s).

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Result, Shape, Tensor};

use crate::cpu::{contiguous, fused, gelu, gelu_grad, unsupported_dtype, GeluApproximate};

const OP: &str = "fused gelu";

/// The GELU as one op: exact (`GeluOp(None)`) or its tanh approximation.
struct GeluOp(GeluApproximate);

crate::cpu::custom_op!(CustomOp1 for GeluOp, "fused-gelu", fwd: fwd, bwd: bwd);

impl GeluOp {
    fn fwd(&self, [(s, l)]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        let y = match s {
            CpuStorage::F32(_) => CpuStorage::F32(gelu(contiguous::<f32, _>(OP, s, l)?, self.0)),
            CpuStorage::F64(_) => CpuStorage::F64(gelu(contiguous::<f64, _>(OP, s, l)?, self.0)),
            _ => return Err(unsupported_dtype(OP, s.dtype())),
        };
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, [x]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Result<Grads<1>> {
        let grad = grad.contiguous()?;
        let (xs, xl) = x.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let dx = match x.dtype() {
            DType::F32 => {
                let (xv, gv) = (contiguous(OP, &*xs, xl)?, contiguous(OP, &*gs, gl)?);
                let dx = gelu_grad::<f32>(xv, gv, self.0);
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            DType::F64 => {
                let (xv, gv) = (contiguous(OP, &*xs, xl)?, contiguous(OP, &*gs, gl)?);
                let dx = gelu_grad::<f64>(xv, gv, self.0);
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            dt => return Err(unsupported_dtype(OP, dt)),
        };
        Ok([Some(dx)])
    }
}

/// The exact GELU, `0.5·x·(1 + erf(x/√2))`, elementwise: one op forward and backward on the
/// CPU in f32/f64, candle's ops elsewhere.
///
/// Off the CPU, an f32/f64 input that autograd tracks is not given to candle's `gelu_erf`:
/// its backward writes 1/√(2π) as `0.398942`, a 7·10⁻⁷ relative error in the gradient that
/// an f64 comparison with PyTorch shows. `x·Φ(x)` built from `erf` has candle's exact `erf`
/// backward instead. Half precision and inference keep `gelu_erf` (one kernel; its forward is
/// exact).
///
/// PyTorch equivalent: `F.gelu(x)` (`approximate="none"`).
pub(crate) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1(GeluOp(GeluApproximate::None));
    }
    if x.track_op() && matches!(x.dtype(), DType::F32 | DType::F64) {
        return gelu_erf_ops(x);
    }
    x.gelu_erf()
}

/// `0.5·x·(1 + erf(x/√2))` in candle's generic ops, whose backward is exact: the non-CPU
/// training path of [`gelu_erf`], and the reference the fused op is tested against.
pub(crate) fn gelu_erf_ops(x: &Tensor) -> Result<Tensor> {
    (((x * std::f64::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)? * x)? * 0.5
}

/// The GELU, exact or its tanh approximation, elementwise: one op forward and backward on the
/// CPU in f32/f64 (the formulas of `crate::cpu::gelu`), candle's ops elsewhere.
///
/// PyTorch equivalent: `F.gelu(x, approximate=...)`.
pub fn gelu_with(x: &Tensor, approximate: GeluApproximate) -> Result<Tensor> {
    match approximate {
        GeluApproximate::None => gelu_erf(x),
        GeluApproximate::Tanh if fused(x) => x.contiguous()?.apply_op1(GeluOp(approximate)),
        GeluApproximate::Tanh => x.gelu(),
    }
}
