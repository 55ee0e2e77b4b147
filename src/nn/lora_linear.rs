//! A frozen linear layer and its LoRA adapter as one op: `x Wᵀ + b + s·(x Aᵀ) Bᵀ`.
//!
//! As candle ops the graph keeps the layer's own output and the adapter's update, two tensors
//! as wide as the output, besides the sum; this op keeps its input (which the adapter's
//! gradient needs anyway) and the rank-`r` product `s·x Aᵀ`, and its backward pass is five
//! products, none as large as the output but `dx = g·W`.

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Result, Shape, Tensor};

use super::lora::Lora;
use crate::cpu::{
    contiguous, fused, gemm, input_grad_into, linear_forward, linear_forward_into, linear_out_len,
    unsupported_dtype, weight_grad, with_slice, written_vec, AsCpu, CpuArg, Elem, Grads, Stash,
    Threads,
};

const OP: &str = "fused LoRA linear";

/// The op over `(x, A, B)`; the frozen `W` and `b` are data of the op (no gradient).
struct LoraLinear {
    w: Tensor,
    bias: Option<Tensor>,
    scaling: f64,
    /// `s·x Aᵀ (M, r)` from the forward pass, for `dB`.
    u: Stash<CpuStorage>,
}

impl LoraLinear {
    fn forward<T: Elem>(&self, x: CpuArg, a: CpuArg, b: CpuArg) -> Result<(Vec<T>, Shape)> {
        let (mut u, _) = linear_forward::<T>(x, a, None)?;
        let s = T::from_f64(self.scaling);
        u.iter_mut().for_each(|v| *v *= s);
        let (ws, wl) = self.w.storage_and_layout();
        let bias = self.bias.as_ref().map(|b| b.storage_and_layout());
        let w = (ws.as_cpu(OP)?, wl);
        let bias = match &bias {
            Some((bs, bl)) => Some((bs.as_cpu(OP)?, *bl)),
            None => None,
        };
        let mut y = vec![T::ZERO; linear_out_len(x.1, w.1)?];
        let shape = linear_forward_into::<T>(x, w, bias, &mut y)?;
        let bd = contiguous::<T, _>(OP, b.0, b.1)?;
        let (n, r) = b.1.shape().dims2()?;
        let m = y.len() / n.max(1);
        if u.len() != m * r {
            candle::bail!(
                "{OP}: lora_A {:?} and lora_B {:?} do not chain",
                a.1.dims(),
                b.1.dims()
            )
        }
        // SAFETY: y is m×n, u m×r, B n×r read transposed; all contiguous and sized above.
        unsafe {
            gemm(
                (m, n, r),
                (y.as_mut_ptr(), n, 1),
                true,
                (u.as_ptr(), r, 1),
                (bd.as_ptr(), 1, r),
                T::ONE,
                Threads::All,
            )
        }
        self.u.put(T::to_cpu_storage_owned(u));
        Ok((y, shape))
    }

    fn fwd(&self, [x, a, b]: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        match x.0 {
            CpuStorage::F32(_) => self
                .forward::<f32>(x, a, b)
                .map(|(y, s)| (CpuStorage::F32(y), s)),
            CpuStorage::F64(_) => self
                .forward::<f64>(x, a, b)
                .map(|(y, s)| (CpuStorage::F64(y), s)),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    /// With `u = s·x Aᵀ` and `du = s·g·B` (the gradient of `x Aᵀ`): `dB = gᵀ·u`,
    /// `dA = duᵀ·x`, `dx = g·W + du·A`.
    fn backward<T: Elem>(&self, [x, a, b]: [&Tensor; 3], grad: &Tensor) -> Result<Grads<3>> {
        let kept = self.u.get(OP)?;
        let u = T::cpu_storage_as_slice(&kept)?;
        let ((n, k), (r, _)) = (self.w.dims2()?, a.dims2()?);
        let s = T::from_f64(self.scaling);
        with_slice::<T, _>(OP, grad, |g| {
            let m = g.len() / n.max(1);
            if g.len() != m * n || u.len() != m * r {
                candle::bail!("{OP}: output gradient {:?} for {m} rows", grad.dims())
            }
            let (du, db) = with_slice::<T, _>(OP, b, |bd| {
                // SAFETY: du is m×r, every element written by the product.
                let du = unsafe {
                    written_vec(m * r, |du| {
                        gemm(
                            (m, r, n),
                            (du.as_mut_ptr(), r, 1),
                            false,
                            (g.as_ptr(), n, 1),
                            (bd.as_ptr(), r, 1),
                            s,
                            Threads::All,
                        )
                    })
                };
                let db = b
                    .track_op()
                    .then(|| weight_grad(g, u, (m, r, n)))
                    .transpose()?;
                Ok((du, db))
            })?;
            let da = with_slice::<T, _>(OP, x, |xd| {
                a.track_op()
                    .then(|| weight_grad(&du, xd, (m, k, r)))
                    .transpose()
            })?;
            let dx = x
                .track_op()
                .then(|| {
                    with_slice::<T, _>(OP, &self.w, |wd| {
                        with_slice::<T, _>(OP, a, |ad| {
                            // SAFETY: dx is m×k: written by the first product, added to by the
                            // second; W n×k, A r×k, du m×r.
                            let dx = unsafe {
                                written_vec(m * k, |dx| {
                                    input_grad_into(g, wd, (m, k, n), dx.as_mut_ptr());
                                    gemm(
                                        (m, k, r),
                                        (dx.as_mut_ptr(), k, 1),
                                        true,
                                        (du.as_ptr(), r, 1),
                                        (ad.as_ptr(), k, 1),
                                        T::ONE,
                                        Threads::All,
                                    )
                                })
                            };
                            Tensor::from_vec(dx, x.shape(), &Device::Cpu)
                        })
                    })
                })
                .transpose()?;
            Ok([dx, da, db])
        })
    }

    fn bwd(&self, args: [&Tensor; 3], _: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        match args[0].dtype() {
            DType::F32 => self.backward::<f32>(args, grad),
            DType::F64 => self.backward::<f64>(args, grad),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

crate::cpu::custom_op!(CustomOp3 for LoraLinear, "fused-lora-linear", fwd: fwd, bwd: bwd);

/// `x Wᵀ + b + s·B(A(x))` as one op when it can be: on the CPU in f32/f64, `W` and `b` frozen
/// (no gradient), every operand of `x`'s dtype and contiguous, no adapter dropout in this
/// call. `None` otherwise (the caller takes candle's ops).
pub(super) fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    lora: &Lora,
    dropout_now: bool,
) -> Result<Option<Tensor>> {
    let (a, b) = (lora.a(), lora.b());
    let ok = fused(x)
        && x.rank() >= 2
        && !dropout_now
        && !w.track_op()
        && !bias.is_some_and(Tensor::track_op)
        && [w, a, b]
            .into_iter()
            .chain(bias)
            .all(|t| t.dtype() == x.dtype() && t.device().is_cpu() && t.is_contiguous())
        && lora.features()? == (w.dim(1)?, w.dim(0)?)
        && x.dims().last() == Some(&w.dim(1)?);
    if !ok {
        return Ok(None);
    }
    crate::cpu::keep_weights(&[w]);
    let op = LoraLinear {
        w: w.clone(),
        bias: bias.cloned(),
        scaling: lora.scaling(),
        u: Stash::default(),
    };
    x.contiguous()?.apply_op3(a, b, op).map(Some)
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device, Module, Result, Tensor, Var};

    use crate::nn::{Linear, Lora};
    use crate::rng::normal;

    fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
        let max = |t: Tensor| -> Result<f64> {
            t.abs()?
                .flatten_all()?
                .max(0)?
                .to_dtype(DType::F64)?
                .to_scalar()
        };
        Ok(max((a - b)?)? / max(b.clone())?)
    }

    /// The one op against candle's `x Wᵀ + b + s·(x Aᵀ) Bᵀ`: output and the gradients of x, A
    /// and B (f32, f64, a 3-D input, with and without a bias); a trainable W takes candle's
    /// ops and still gets its gradient.
    #[test]
    fn the_op_equals_candle_ops() -> Result<()> {
        let dev = Device::Cpu;
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            let t = |s: &[usize], seed| normal(0.0, 1.0, s, dtype, &dev, seed);
            let (w, bias) = (t(&[7, 10], 1)?, t(&[7], 2)?);
            let (a, b) = (
                Var::from_tensor(&t(&[3, 10], 3)?)?,
                Var::from_tensor(&t(&[7, 3], 4)?)?,
            );
            let x = Var::from_tensor(&t(&[2, 5, 10], 5)?)?;
            let r = t(&[2, 5, 7], 6)?;
            for with_bias in [true, false] {
                let lora =
                    Lora::from_weights(a.as_tensor().clone(), b.as_tensor().clone(), 1.5, 0.0)?;
                let layer = Linear::from_weights(w.clone(), with_bias.then(|| bias.clone()))
                    .with_lora(lora)?;
                let y = layer.forward(&x)?;
                let mut e = (x.broadcast_matmul(&w.t()?)?
                    + (x.broadcast_matmul(&a.t()?)?.broadcast_matmul(&b.t()?)? * 1.5)?)?;
                if with_bias {
                    e = e.broadcast_add(&bias)?;
                }
                let what = format!("{dtype:?} bias {with_bias}");
                assert!(rel(&y, &e)? < tol, "{what}: y");
                let (gy, ge) = (
                    (&y * &r)?.sum_all()?.backward()?,
                    (&e * &r)?.sum_all()?.backward()?,
                );
                for (name, v) in [("x", &x), ("A", &a), ("B", &b)] {
                    let (p, q) = (gy.get(v).expect("op"), ge.get(v).expect("ops"));
                    assert!(rel(p, q)? < tol, "{what}: d{name}");
                }
            }
            let wv = Var::from_tensor(&w)?;
            let lora = Lora::from_weights(a.as_tensor().clone(), b.as_tensor().clone(), 1.5, 0.0)?;
            let layer = Linear::from_weights(wv.as_tensor().clone(), None).with_lora(lora)?;
            let g = layer.forward(&x)?.sum_all()?.backward()?;
            assert!(g.get(&wv).is_some(), "a trainable W lost its gradient");
        }
        Ok(())
    }
}
