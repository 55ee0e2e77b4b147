//! Backpropagation from a non-scalar tensor with a given gradient.
//!
//! candle's [`Tensor::backward`] starts from a scalar; the usual stand-in for PyTorch's
//! `out.backward(gradient)` is `(out * gradient).sum_all()?.backward()`, which adds a product
//! and a sum to the graph: several more passes over `out` in the backward pass (each node's
//! gradient is also added into a fresh zero tensor). [`backward_with`] seeds the backward pass
//! with the gradient itself, so only candle's accumulation into `out`'s slot remains.

use crate::cpu::Grads;
use candle::backend::{BackendDevice, BackendStorage};
use candle::backprop::GradStore;
use candle::{Device, Layout, Result, Shape, Tensor};

/// A scalar zero whose backward hands `grad` to its argument (the upstream gradient is the
/// `1` that [`Tensor::backward`] starts from).
struct Seed {
    grad: Tensor,
}

crate::cpu::custom_op!(CustomOp1 for Seed, "backward-seed", fwd: zero, bwd: seed, cuda: zero);

impl Seed {
    /// A scalar zero of the argument's dtype on its device.
    fn zero<S>(&self, [(s, _)]: [(&S, &Layout); 1]) -> Result<(S, Shape)>
    where
        S: BackendStorage,
        S::Device: BackendDevice<Storage = S>,
    {
        let shape = Shape::from(());
        Ok((s.device().zeros_impl(&shape, s.dtype())?, shape))
    }

    fn seed(&self, _: [&Tensor; 1], _res: &Tensor, _grad: &Tensor) -> Result<Grads<1>> {
        Ok([Some(self.grad.clone())])
    }
}

/// The gradients of every variable `out` depends on, given the gradient of some loss with
/// respect to `out` (the vector–Jacobian product); `grad` is a constant (not differentiated
/// through).
///
/// PyTorch equivalent: `out.backward(gradient=grad)` (`torch.autograd.backward(out, grad)`),
/// except that the gradients come back in a [`GradStore`] instead of accumulating into `.grad`.
///
/// # Shapes
/// - `out`: any shape; `grad`: the same shape, dtype and device.
///
/// # Errors
/// If `grad`'s shape, dtype or device differs from `out`'s.
///
/// ```
/// use candle::{Device, Tensor, Var};
/// # fn main() -> candle::Result<()> {
/// let x = Var::new(&[1f32, 2., 3.], &Device::Cpu)?;
/// let y = x.sqr()?; // dy/dx = 2x
/// let grads = candle_mha::autograd::backward_with(&y, &Tensor::new(&[1f32, 10., 100.], &Device::Cpu)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec1::<f32>()?, [2., 40., 600.]);
/// # Ok(()) }
/// ```
pub fn backward_with(out: &Tensor, grad: &Tensor) -> Result<GradStore> {
    if grad.dims() != out.dims() {
        candle::bail!(
            "backward_with: grad has shape {:?}, expected out's shape {:?}",
            grad.dims(),
            out.dims()
        )
    }
    if grad.dtype() != out.dtype() {
        candle::bail!(
            "backward_with: grad has dtype {:?}, expected out's dtype {:?}",
            grad.dtype(),
            out.dtype()
        )
    }
    if !grad.device().same_device(out.device()) {
        candle::bail!(
            "backward_with: grad is on {:?}, expected out's device {:?}",
            grad.device(),
            out.device()
        )
    }
    let grad = grad.detach();
    match out.device() {
        Device::Cpu | Device::Cuda(_) => out.apply_op1(Seed { grad }),
        // Other backends: the product-and-sum form (the seed op has no kernel there).
        _ => (out * grad)?.sum_all(),
    }?
    .backward()
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device, Tensor, Var};

    use super::backward_with;

    /// Against the product-and-sum form, through a graph with a shared input (gradients of
    /// two paths add up) and a non-contiguous `out`.
    #[test]
    fn matches_product_and_sum() -> candle::Result<()> {
        let dev = Device::Cpu;
        let a = Var::from_tensor(&Tensor::arange(0f64, 12., &dev)?.reshape((3, 4))?)?;
        let b = Var::from_tensor(&Tensor::arange(-3f64, 5., &dev)?.reshape((4, 2))?)?;
        let out = (a.matmul(&b)?.t()?.exp()?.affine(0.01, 0.0)?
            + a.sum(1)?.unsqueeze(0)?.broadcast_as((2, 3))?)?;
        let g = Tensor::arange(1f64, 7., &dev)?.reshape((2, 3))?;
        let ours = backward_with(&out, &g)?;
        let theirs = (&out * &g)?.sum_all()?.backward()?;
        for v in [&a, &b] {
            let (x, y) = (ours.get(v).unwrap(), theirs.get(v).unwrap());
            let diff = (x - y)?.abs()?.max_all()?.to_scalar::<f64>()?;
            let scale = y.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(
                diff <= 1e-12 * scale,
                "gradient differs by {diff} (scale {scale})"
            );
            assert!(scale > 0.0);
        }
        Ok(())
    }

    #[test]
    fn mismatched_grad_is_an_error_naming_it() -> candle::Result<()> {
        let dev = Device::Cpu;
        let x = Var::zeros((2, 3), DType::F32, &dev)?;
        let y = x.exp()?;
        let e = backward_with(&y, &Tensor::zeros((3, 2), DType::F32, &dev)?).unwrap_err();
        assert!(
            e.to_string()
                .contains("grad has shape [3, 2], expected out's shape [2, 3]"),
            "{e}"
        );
        let e = backward_with(&y, &Tensor::zeros((2, 3), DType::F64, &dev)?).unwrap_err();
        assert!(e.to_string().contains("grad has dtype F64"), "{e}");
        Ok(())
    }
}
