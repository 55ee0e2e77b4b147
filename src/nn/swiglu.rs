//! [`SwiGlu`]: the gated MLP of Llama-family blocks, and its gate [`silu_mul`] as one op.
//!
//! As candle ops, `silu(g)·u` keeps `silu(g)` for the product's backward pass besides `g`
//! and `u`, and its backward pass is a dozen elementwise passes over the block's widest
//! activation, each into a fresh tensor; the op keeps only its inputs and makes both
//! gradients in one pass.

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Module, Result, Shape, Tensor};
use candle_nn::VarBuilder;

use super::{Linear, Lora};
use crate::cpu::{
    contiguous, fused, input_grad_into, linear_forward_slice, unsupported_dtype, weight_grad,
    with_slice, written_vec, CpuArg, Elem, Grads,
};

const OP: &str = "fused silu_mul";

/// `silu(g)·u` on contiguous CPU tensors of one shape, f32 or f64.
struct SiluMul;

crate::cpu::custom_op!(CustomOp2 for SiluMul, "fused-silu-mul", fwd: fwd, bwd: bwd);

impl SiluMul {
    fn forward<T: Elem>([(gs, gl), (us, ul)]: [CpuArg; 2]) -> Result<Vec<T>> {
        let (g, u) = (
            contiguous::<T, _>(OP, gs, gl)?,
            contiguous::<T, _>(OP, us, ul)?,
        );
        if gl.shape() != ul.shape() || g.len() != u.len() {
            candle::bail!(
                "{OP}: gate {:?} and up {:?} differ in shape",
                gl.dims(),
                ul.dims()
            )
        }
        Ok(crate::cpu::silu_mul(g, u))
    }

    fn fwd(&self, args: [CpuArg; 2]) -> Result<(CpuStorage, Shape)> {
        let shape = args[0].1.shape().clone();
        let y = match args[0].0 {
            CpuStorage::F32(_) => CpuStorage::F32(Self::forward(args)?),
            CpuStorage::F64(_) => CpuStorage::F64(Self::forward(args)?),
            other => return Err(unsupported_dtype(OP, other.dtype())),
        };
        Ok((y, shape))
    }

    fn backward<T: Elem>(g: &Tensor, u: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        let (dg, du) = with_slice::<T, _>(OP, g, |gd| {
            with_slice::<T, _>(OP, u, |ud| {
                with_slice::<T, _>(OP, grad, |d| match d.len() == gd.len() {
                    true => Ok(crate::cpu::silu_mul_grad(gd, ud, d)),
                    false => candle::bail!(
                        "{OP}: output gradient of {} elements for {} outputs",
                        d.len(),
                        gd.len()
                    ),
                })
            })
        })?;
        let tensor = |v: Vec<T>, like: &Tensor| Tensor::from_vec(v, like.shape(), &Device::Cpu);
        Ok([
            g.track_op().then(|| tensor(dg, g)).transpose()?,
            u.track_op().then(|| tensor(du, u)).transpose()?,
        ])
    }

    fn bwd(&self, [g, u]: [&Tensor; 2], _: &Tensor, grad: &Tensor) -> Result<Grads<2>> {
        match g.dtype() {
            DType::F32 => Self::backward::<f32>(g, u, grad),
            DType::F64 => Self::backward::<f64>(g, u, grad),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

/// `(silu(g)·u)·wᵀ` on contiguous CPU tensors of one dtype (f32/f64): SwiGLU's gate and its
/// down projection, keeping `g`, `u` and `w` only. The hidden `h = silu(g)·u (…, I)`, the
/// block's widest activation, lives during the forward pass and again, remade, in the
/// backward pass when `w` takes a gradient.
struct SiluMulLinear;

crate::cpu::custom_op!(CustomOp3 for SiluMulLinear, "fused-silu-mul-linear", fwd: fwd, bwd: bwd);

impl SiluMulLinear {
    fn fwd(&self, [g, u, w]: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        fn run<T: Elem>(g: CpuArg, u: CpuArg, w: CpuArg) -> Result<(Vec<T>, Shape)> {
            let h = SiluMul::forward::<T>([g, u])?;
            linear_forward_slice((&h, g.1.dims()), w, None)
        }
        match g.0 {
            CpuStorage::F32(_) => run::<f32>(g, u, w).map(|(y, s)| (CpuStorage::F32(y), s)),
            CpuStorage::F64(_) => run::<f64>(g, u, w).map(|(y, s)| (CpuStorage::F64(y), s)),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    /// `dh = grad·w`, then `dg`, `du` from it; `dw = gradᵀ·h` with `h` made again.
    fn backward<T: Elem>([g, u, w]: [&Tensor; 3], grad: &Tensor) -> Result<Grads<3>> {
        let (n, k) = w.dims2()?;
        with_slice::<T, _>(OP, g, |gs| {
            with_slice::<T, _>(OP, u, |us| {
                with_slice::<T, _>(OP, grad, |ds| {
                    with_slice::<T, _>(OP, w, |ws| {
                        let m = gs.len() / k.max(1);
                        if gs.len() != m * k || us.len() != gs.len() || ds.len() != m * n {
                            candle::bail!(
                                "{OP}: gate {:?}, up {:?} and output gradient {:?} for a weight {:?}",
                                g.dims(),
                                u.dims(),
                                grad.dims(),
                                w.dims()
                            )
                        }
                        // SAFETY: dh is m·k elements, every one written by the product.
                        let dh = unsafe {
                            written_vec(m * k, |dh| {
                                input_grad_into(ds, ws, (m, k, n), dh.as_mut_ptr())
                            })
                        };
                        let dw = w
                            .track_op()
                            .then(|| weight_grad(ds, &crate::cpu::silu_mul(gs, us), (m, k, n)))
                            .transpose()?;
                        let (dg, du) = crate::cpu::silu_mul_grad(gs, us, &dh);
                        let tensor = |v: Vec<T>, like: &Tensor| {
                            Tensor::from_vec(v, like.shape(), &Device::Cpu)
                        };
                        Ok([
                            g.track_op().then(|| tensor(dg, g)).transpose()?,
                            u.track_op().then(|| tensor(du, u)).transpose()?,
                            dw,
                        ])
                    })
                })
            })
        })
    }

    fn bwd(&self, args: [&Tensor; 3], _: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        match args[0].dtype() {
            DType::F32 => Self::backward::<f32>(args, grad),
            DType::F64 => Self::backward::<f64>(args, grad),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

/// `(silu(g)·u)·wᵀ`: SwiGLU's gate and a bias-free down projection `w (N, I)`, as one op on
/// the CPU in f32/f64 (the hidden `silu(g)·u` is never a tensor of the graph), [`silu_mul`]
/// and a linear layer otherwise.
///
/// PyTorch equivalent: `F.linear(F.silu(g) * u, w)`.
///
/// # Shapes
/// `g (…, I)`, `u` the same, `w (N, I)` → `(…, N)`.
pub fn silu_mul_linear(g: &Tensor, u: &Tensor, w: &Tensor) -> Result<Tensor> {
    let one_op = fused(g)
        && [u, w]
            .iter()
            .all(|t| t.dtype() == g.dtype() && t.device().is_cpu())
        && g.dims() == u.dims()
        && g.rank() >= 2
        && w.dims2().is_ok_and(|(_, k)| g.dims().last() == Some(&k));
    if !one_op {
        return crate::cpu::linear(&silu_mul(g, u)?, w, None);
    }
    crate::cpu::keep_weights(&[w]);
    g.contiguous()?
        .apply_op3(&u.contiguous()?, w, SiluMulLinear)
}

/// `silu(g) · u` (SwiGLU's gate): one op forward and backward on the CPU in f32/f64, candle's
/// ops otherwise.
///
/// PyTorch equivalent: `F.silu(g) * u`.
///
/// # Shapes
/// `g (…)`, `u` the same shape → the same shape.
pub fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    if g.dims() != u.dims() {
        candle::bail!(
            "silu_mul: gate {:?} and up {:?} must have one shape",
            g.dims(),
            u.dims()
        )
    }
    match fused(g) && g.dtype() == u.dtype() && u.device().is_cpu() {
        true => g.contiguous()?.apply_op2(&u.contiguous()?, SiluMul),
        false => g.silu()? * u,
    }
}

/// `down(silu(gate(x)) · up(x))`, three bias-free linear layers named as Hugging Face's
/// (`gate_proj`, `up_proj`, `down_proj`).
///
/// PyTorch equivalent: transformers' `LlamaMLP` (`hidden_act="silu"`, `mlp_bias=False`).
///
/// # Shapes
/// `x (…, E)` → `(…, E)`; the hidden width is `I` (`intermediate_size`).
#[derive(Clone, Debug)]
pub struct SwiGlu {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl SwiGlu {
    /// Takes (or creates, with `nn.Linear`'s init) `gate_proj.weight [I, E]`,
    /// `up_proj.weight [I, E]` and `down_proj.weight [E, I]` under `vb`.
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            gate: Linear::new(dim, hidden, false, vb.pp("gate_proj"))?,
            up: Linear::new(dim, hidden, false, vb.pp("up_proj"))?,
            down: Linear::new(hidden, dim, false, vb.pp("down_proj"))?,
        })
    }

    /// The three layers: gate, up, down.
    pub fn layers(&self) -> [&Linear; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// The MLP with LoRA adapters on the layers given (`[gate, up, down]`).
    ///
    /// PyTorch equivalent: PEFT's `lora.Linear` around `gate_proj`, `up_proj`, `down_proj`.
    pub fn with_lora(mut self, [gate, up, down]: [Option<Lora>; 3]) -> Result<Self> {
        for (layer, lora) in [
            (&mut self.gate, gate),
            (&mut self.up, up),
            (&mut self.down, down),
        ] {
            if let Some(l) = lora {
                *layer = layer.clone().with_lora(l)?;
            }
        }
        Ok(self)
    }

    /// The MLP with its adapters merged into the weights.
    pub fn merged(&self) -> Result<Self> {
        Ok(Self {
            gate: self.gate.merged()?,
            up: self.up.merged()?,
            down: self.down.merged()?,
        })
    }

    /// The output in training mode: each adapter's dropout drawn from `seeds` (`[gate, up,
    /// down]`) and the rows' `first_row` (see [`Linear::forward_train`]).
    pub fn forward_train(&self, x: &Tensor, seeds: [u64; 3], first_row: usize) -> Result<Tensor> {
        let offset =
            |t: &Tensor| (first_row * t.elem_count() / t.dim(0).unwrap_or(1).max(1)) as u64;
        let g = self.gate.forward_train(x, (seeds[0], offset(x)))?;
        let u = self.up.forward_train(x, (seeds[1], offset(x)))?;
        match self.plain_down() {
            Some(w) => silu_mul_linear(&g, &u, w),
            None => {
                let h = silu_mul(&g, &u)?;
                self.down.forward_train(&h, (seeds[2], offset(&h)))
            }
        }
    }

    /// The down projection's weight when the layer is just that (no bias, no adapter: the
    /// case [`silu_mul_linear`] covers).
    fn plain_down(&self) -> Option<&Tensor> {
        match (self.down.bias(), self.down.lora()) {
            (None, None) => Some(self.down.weight()),
            _ => None,
        }
    }
}

impl Module for SwiGlu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (g, u) = (self.gate.forward(x)?, self.up.forward(x)?);
        match self.plain_down() {
            Some(w) => silu_mul_linear(&g, &u, w),
            None => self.down.forward(&silu_mul(&g, &u)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::Var;

    fn ramp(n: usize, dtype: DType, f: impl Fn(usize) -> f64) -> Result<Tensor> {
        let v: Vec<f64> = (0..n).map(f).collect();
        Tensor::from_vec(v, (3, n / 3), &Device::Cpu)?.to_dtype(dtype)
    }

    /// The op against candle's composition `silu(g) * u`, forward and both gradients, in f64
    /// (the precision path) and f32 (the SIMD rows).
    #[test]
    fn op_equals_candle_ops() -> Result<()> {
        for (dtype, tol) in [(DType::F64, 1e-14), (DType::F32, 2e-6)] {
            let g = Var::from_tensor(&ramp(30, dtype, |i| i as f64 * 0.7 - 9.0)?)?;
            let u = Var::from_tensor(&ramp(30, dtype, |i| (i % 7) as f64 * 0.5 - 1.4)?)?;
            let d = ramp(30, dtype, |i| 1.0 + (i % 4) as f64 * 0.3)?;
            let fused = silu_mul(&g, &u)?;
            let ops = (g.silu()? * u.as_tensor())?;
            let diff = |a: &Tensor, b: &Tensor| -> Result<f64> {
                (a - b)?
                    .abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_dtype(DType::F64)?
                    .to_scalar()
            };
            assert!(diff(&fused, &ops)? <= tol, "{dtype:?} forward");
            let gf = (&fused * &d)?.sum_all()?.backward()?;
            let go = (&ops * &d)?.sum_all()?.backward()?;
            for (name, v) in [("gate", &g), ("up", &u)] {
                let (a, b) = (gf.get(v).expect("fused grad"), go.get(v).expect("ops grad"));
                assert!(
                    diff(a, b)? <= tol * 10.0,
                    "{dtype:?} d{name}: {}",
                    diff(a, b)?
                );
            }
        }
        Ok(())
    }

    /// The gate and down projection as one op against candle's `linear(silu(g)·u, w)`:
    /// output and the gradients of g, u and w (f64, f32), none for a frozen w.
    #[test]
    fn gate_and_down_projection_equal_candle_ops() -> Result<()> {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let g = Var::from_tensor(&ramp(36, dtype, |i| i as f64 * 0.4 - 7.0)?)?;
            let u = Var::from_tensor(&ramp(36, dtype, |i| (i % 5) as f64 * 0.6 - 1.1)?)?;
            let w = Var::from_tensor(
                &Tensor::from_vec(
                    (0..60).map(|i| ((i * 7) % 11) as f64 * 0.1 - 0.5).collect(),
                    (5, 12),
                    &Device::Cpu,
                )?
                .to_dtype(dtype)?,
            )?;
            let d = Tensor::from_vec(
                (0..15).map(|i| 1.0 - (i % 3) as f64 * 0.7).collect(),
                (3, 5),
                &Device::Cpu,
            )?
            .to_dtype(dtype)?;
            let fused = silu_mul_linear(&g, &u, &w)?;
            let ops = (g.silu()? * u.as_tensor())?.matmul(&w.t()?)?;
            let rel = |a: &Tensor, b: &Tensor| -> Result<f64> {
                let err = (a - b)?
                    .abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_dtype(DType::F64)?;
                let size = b.abs()?.flatten_all()?.max(0)?.to_dtype(DType::F64)?;
                Ok(err.to_scalar::<f64>()? / size.to_scalar::<f64>()?)
            };
            assert!(rel(&fused, &ops)? <= tol, "{dtype:?} forward");
            let gf = (&fused * &d)?.sum_all()?.backward()?;
            let go = (&ops * &d)?.sum_all()?.backward()?;
            for (name, v) in [("g", &g), ("u", &u), ("w", &w)] {
                let (a, b) = (gf.get(v).expect("fused"), go.get(v).expect("ops"));
                assert!(rel(a, b)? <= tol, "{dtype:?} d{name}");
            }
            let frozen = silu_mul_linear(&g, &u, &w.as_tensor().detach())?;
            let gz = (&frozen * &d)?.sum_all()?.backward()?;
            assert!(gz.get(&w).is_none(), "a frozen weight got a gradient");
            assert!(rel(gz.get(&g).expect("dg"), go.get(&g).expect("dg"))? <= tol);
        }
        Ok(())
    }

    /// A constant `u` gets no gradient; the gate's is still right.
    #[test]
    fn only_the_tracked_input_gets_a_gradient() -> Result<()> {
        let g = Var::from_tensor(&ramp(12, DType::F64, |i| i as f64 - 6.0)?)?;
        let u = ramp(12, DType::F64, |_| 2.0)?;
        let grads = silu_mul(&g, &u)?.sum_all()?.backward()?;
        assert!(grads.get(&u).is_none());
        let want = (g.silu()? * &u)?.sum_all()?.backward()?;
        let (a, b) = (grads.get(&g).expect("dg"), want.get(&g).expect("dg"));
        let err: f64 = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar()?;
        assert!(err < 1e-14, "{err}");
        Ok(())
    }

    #[test]
    fn shapes_must_agree_and_other_dtypes_take_candle_ops() -> Result<()> {
        let g = ramp(12, DType::F32, |i| i as f64)?;
        let u = Tensor::zeros((4, 3), DType::F32, &Device::Cpu)?;
        let e = silu_mul(&g, &u).unwrap_err().to_string();
        assert!(e.contains("[3, 4]") && e.contains("[4, 3]"), "{e}");
        let (g, u) = (
            g.to_dtype(DType::BF16)?,
            g.ones_like()?.to_dtype(DType::BF16)?,
        );
        let y = silu_mul(&g, &u)?;
        assert_eq!(y.dtype(), DType::BF16);
        let want = g.silu()?;
        let err: f32 = (y - want)?
            .abs()?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .max(0)?
            .to_scalar()?;
        assert_eq!(err, 0.0);
        Ok(())
    }
}
