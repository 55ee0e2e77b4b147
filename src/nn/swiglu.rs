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
use crate::cpu::{contiguous, fused, unsupported_dtype, with_slice, CpuArg, Elem, Grads};

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
        let h = silu_mul(&g, &self.up.forward_train(x, (seeds[1], offset(x)))?)?;
        self.down.forward_train(&h, (seeds[2], offset(&h)))
    }
}

impl Module for SwiGlu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = silu_mul(&self.gate.forward(x)?, &self.up.forward(x)?)?;
        self.down.forward(&h)
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
