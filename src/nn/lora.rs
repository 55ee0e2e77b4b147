//! [`Lora`]: a low-rank update `W + s·B·A` of a frozen linear layer, as PEFT computes it:
//! `base(x) + s·B(A(dropout(x)))`, never forming `B·A` except to merge.
//!
//! The update is two products of rank `r` on the layer's input, so the layer's own weight
//! gets no gradient when it is frozen (a tensor no variable leads to): its backward pass
//! computes `dx = g·W` and skips `gᵀ·x`, the product as large as the forward's.

use candle::backend::BackendStorage;
use candle::{CpuStorage, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};

use super::dropout::seeded_dropout_at;
use crate::cpu::{contiguous, fused, gemm, unsupported_dtype, CpuArg, Elem, Grads, Threads};
use crate::init::linear_weight;

/// Largest rank a [`LoraConfig`] takes (PEFT does not bound it; ranks beyond a few hundred
/// are full fine-tuning at a higher cost).
pub const MAX_LORA_RANK: usize = 4096;

/// The hyper-parameters of a LoRA adapter.
///
/// PyTorch equivalent: PEFT's `LoraConfig(r, lora_alpha, lora_dropout, use_rslora)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r` of the update (PEFT's default 8).
    pub rank: usize,
    /// `lora_alpha`: the scaling is `alpha / r` (PEFT's default 8).
    pub alpha: f64,
    /// Dropout on the adapter's input in training mode (PEFT's default 0).
    pub dropout: f64,
    /// Scale by `alpha / √r` instead (rank-stabilised LoRA; PEFT's `use_rslora`, default
    /// false).
    pub use_rslora: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            use_rslora: false,
        }
    }
}

crate::setters! {
    LoraConfig {
        with_rank(rank: usize);
        with_alpha(alpha: f64);
        with_dropout(dropout: f64);
        with_use_rslora(use_rslora: bool);
    }
}

impl LoraConfig {
    /// Errors, naming the field, on a rank outside `1..=MAX_LORA_RANK`, a non-finite alpha or
    /// a dropout outside `[0, 1)`.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_LORA_RANK).contains(&self.rank) {
            candle::bail!(
                "LoRA rank must be in 1..={MAX_LORA_RANK}, got {}",
                self.rank
            )
        }
        if !self.alpha.is_finite() {
            candle::bail!("LoRA alpha must be finite, got {}", self.alpha)
        }
        if !(0.0..1.0).contains(&self.dropout) {
            candle::bail!("LoRA dropout must be in [0, 1), got {}", self.dropout)
        }
        Ok(())
    }

    /// The factor of the update: `alpha / r`, or `alpha / √r` with `use_rslora`.
    ///
    /// PyTorch equivalent: PEFT's `LoraLayer.scaling[adapter]`.
    pub fn scaling(&self) -> f64 {
        match self.use_rslora {
            true => self.alpha / (self.rank as f64).sqrt(),
            false => self.alpha / self.rank as f64,
        }
    }
}

/// The adapter of one linear layer of `in_features → out_features`: `lora_A.weight [r, in]`
/// and `lora_B.weight [out, r]` (PEFT's names and layouts, also for GPT-2's `Conv1D`, whose
/// PEFT adapter is stored the same way), the scaling and the input dropout.
///
/// # Shapes
/// [`delta`](Self::delta): `x (…, in)` → `(…, out)`.
#[derive(Clone, Debug)]
pub struct Lora {
    a: Tensor,
    b: Tensor,
    scaling: f64,
    dropout: f64,
}

impl Lora {
    /// Takes (or creates) `lora_A.weight` and `lora_B.weight` under `vb`: new ones as PEFT
    /// draws them, A `kaiming_uniform_(a=√5)` (U(±1/√in)), B zeros, so that a new adapter
    /// leaves the layer's output exactly as it was.
    ///
    /// PyTorch equivalent: `peft.tuners.lora.Linear.update_layer(..., init_lora_weights=True)`.
    pub fn new(
        in_features: usize,
        out_features: usize,
        config: &LoraConfig,
        vb: VarBuilder,
    ) -> Result<Self> {
        config.validate()?;
        let r = config.rank;
        let a = vb.pp("lora_A").get_with_hints(
            (r, in_features),
            "weight",
            linear_weight(in_features),
        )?;
        let b = vb
            .pp("lora_B")
            .get_with_hints((out_features, r), "weight", Init::Const(0.0))?;
        Ok(Self {
            a,
            b,
            scaling: config.scaling(),
            dropout: config.dropout,
        })
    }

    /// An adapter of the given tensors as they are: `a [r, in]`, `b [out, r]`. Errors when
    /// they do not chain or `scaling` is not finite.
    pub fn from_weights(a: Tensor, b: Tensor, scaling: f64, dropout: f64) -> Result<Self> {
        let ((r, _), (_, rb)) = (a.dims2()?, b.dims2()?);
        if r != rb {
            candle::bail!(
                "LoRA: lora_A {:?} and lora_B {:?} do not chain (rank {r} against {rb})",
                a.dims(),
                b.dims()
            )
        }
        if !scaling.is_finite() || !(0.0..1.0).contains(&dropout) {
            candle::bail!("LoRA: scaling {scaling} must be finite and dropout {dropout} in [0, 1)")
        }
        Ok(Self {
            a,
            b,
            scaling,
            dropout,
        })
    }

    /// `lora_A.weight [r, in]`.
    pub fn a(&self) -> &Tensor {
        &self.a
    }

    /// `lora_B.weight [out, r]`.
    pub fn b(&self) -> &Tensor {
        &self.b
    }

    /// The factor `s` of `s·B·A`.
    pub fn scaling(&self) -> f64 {
        self.scaling
    }

    /// `(in_features, out_features)`.
    pub fn features(&self) -> Result<(usize, usize)> {
        Ok((self.a.dim(1)?, self.b.dim(0)?))
    }

    /// `s·B(A(dropout(x)))`: what the adapter adds to the layer's output. `train`: the
    /// dropout's `(seed, offset)` in training mode (the mask of rows from element `offset` of
    /// a larger batch, as [`seeded_dropout_at`]), `None` in evaluation.
    ///
    /// PyTorch equivalent: `lora_B(lora_A(lora_dropout(x))) * scaling`.
    pub fn delta(&self, x: &Tensor, train: Option<(u64, u64)>) -> Result<Tensor> {
        let x = match train {
            Some((seed, offset)) if self.dropout > 0.0 => {
                seeded_dropout_at(x, self.dropout, seed, offset)?
            }
            _ => x.clone(),
        };
        // The scaling on the rank-r activation: r columns instead of `out`.
        let u = crate::cpu::linear(&x, &self.a, None)?.affine(self.scaling, 0.0)?;
        crate::cpu::linear(&u, &self.b, None)
    }

    /// The dropout on the adapter's input.
    pub fn dropout(&self) -> f64 {
        self.dropout
    }

    /// `w + s·B·A` with the gradient flowing to `A` and `B` (and `w` where it is a
    /// variable): the adapted weight of one call, for an op that takes its weight whole. Its
    /// backward pass costs one weight-sized product `gᵀ·x` (which the adapter's own two
    /// rank-`r` products avoid), so it is for ops whose other savings outweigh that.
    pub fn adapted_weight(&self, w: &Tensor) -> Result<Tensor> {
        let (a, b) = (&self.a, &self.b);
        let one_op = fused(w)
            && [a, b]
                .iter()
                .all(|t| t.dtype() == w.dtype() && t.device().is_cpu())
            && [w, a, b].iter().all(|t| t.is_contiguous());
        if !one_op {
            return w + (b.matmul(a)? * self.scaling)?;
        }
        let (out, inp) = w.dims2()?;
        if b.dims2()?.0 != out || a.dims2()?.1 != inp {
            candle::bail!(
                "LoRA: lora_B {:?} · lora_A {:?} cannot adapt a weight of {:?}",
                b.dims(),
                a.dims(),
                w.dims()
            )
        }
        w.apply_op3(a, b, AdaptedWeight(self.scaling))
    }

    /// `s·B·A [out, in]`, in the dtype of `A`.
    ///
    /// PyTorch equivalent: PEFT's `get_delta_weight(adapter)` (before GPT-2's `Conv1D`
    /// transpose).
    pub fn delta_weight(&self) -> Result<Tensor> {
        (self.b.matmul(&self.a)? * self.scaling)?
            .detach()
            .contiguous()
    }

    /// `w + s·B·A` for the layer's `w [out, in]`, in `w`'s dtype (computed in f32 or f64):
    /// the layer without its adapter.
    ///
    /// PyTorch equivalent: `merge_and_unload()` on one layer.
    pub fn merge(&self, w: &Tensor) -> Result<Tensor> {
        let (out, inp) = w.dims2()?;
        if self.features()? != (inp, out) {
            candle::bail!(
                "LoRA: an adapter of {:?} → {:?} cannot merge into a weight of {:?}",
                self.a.dims(),
                self.b.dims(),
                w.dims()
            )
        }
        let dt = crate::numerics::softmax_dtype(w.dtype());
        let delta = self.delta_weight()?.to_dtype(dt)?;
        (w.to_dtype(dt)?.detach() + delta)?.to_dtype(w.dtype())
    }
}

/// `w + s·B·A` as one op on contiguous CPU tensors of one dtype (f32/f64): as three candle ops
/// the graph would keep `B·A` and `s·B·A` (two weight-sized tensors per adapted layer) until
/// the end of the step. Its backward pass: `dw = g`, `dB = s·g·Aᵀ`, `dA = s·Bᵀ·g`.
struct AdaptedWeight(f64);

const ADAPTED: &str = "LoRA adapted weight";

impl AdaptedWeight {
    fn forward<T: Elem>(&self, [(ws, wl), (as_, al), (bs, bl)]: [CpuArg; 3]) -> Result<Vec<T>> {
        let w = contiguous::<T, _>(ADAPTED, ws, wl)?;
        let (a, b) = (
            contiguous::<T, _>(ADAPTED, as_, al)?,
            contiguous::<T, _>(ADAPTED, bs, bl)?,
        );
        let ((out, inp), (r, _)) = (wl.shape().dims2()?, al.shape().dims2()?);
        if a.len() != r * inp || b.len() != out * r {
            candle::bail!(
                "{ADAPTED}: A {:?} and B {:?} do not chain",
                al.dims(),
                bl.dims()
            )
        }
        let mut y = w.to_vec();
        // SAFETY: y is out×in, B out×r, A r×in, all contiguous (checked above).
        unsafe {
            gemm(
                (out, inp, r),
                (y.as_mut_ptr(), inp, 1),
                true,
                (b.as_ptr(), r, 1),
                (a.as_ptr(), inp, 1),
                T::from_f64(self.0),
                Threads::All,
            )
        }
        Ok(y)
    }

    fn fwd(&self, args: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        let shape = args[0].1.shape().clone();
        let y = match args[0].0 {
            CpuStorage::F32(_) => CpuStorage::F32(self.forward(args)?),
            CpuStorage::F64(_) => CpuStorage::F64(self.forward(args)?),
            other => return Err(unsupported_dtype(ADAPTED, other.dtype())),
        };
        Ok((y, shape))
    }

    fn bwd(&self, [w, a, b]: [&Tensor; 3], _: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        let g = grad.detach();
        let da = a
            .track_op()
            .then(|| b.detach().t()?.matmul(&g)? * self.0)
            .transpose()?;
        let db = b
            .track_op()
            .then(|| g.matmul(&a.detach().t()?)? * self.0)
            .transpose()?;
        Ok([w.track_op().then_some(g), da, db])
    }
}

crate::cpu::custom_op!(CustomOp3 for AdaptedWeight, "lora-adapted-weight", fwd: fwd, bwd: bwd);

/// `y + lora.delta(x)` when there is an adapter, `y` otherwise.
pub(crate) fn add_delta(
    y: Tensor,
    lora: Option<&Lora>,
    x: &Tensor,
    train: Option<(u64, u64)>,
) -> Result<Tensor> {
    match lora {
        Some(l) => y + l.delta(x, train)?,
        None => Ok(y),
    }
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device, Module, Result, Tensor, Var};
    use candle_nn::VarMap;

    use super::{Lora, LoraConfig};
    use crate::nn::Linear;
    use crate::rng::normal;

    fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
        normal(0.0, 1.0, shape, DType::F32, &Device::Cpu, seed)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
        (a - b)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()
    }

    #[test]
    fn config_is_checked_and_scaled_as_peft() {
        let c = LoraConfig::default().with_rank(16).with_alpha(32.0);
        assert_eq!(c.scaling(), 2.0);
        assert_eq!(c.with_use_rslora(true).scaling(), 8.0);
        for bad in [
            c.with_rank(0),
            c.with_alpha(f64::NAN),
            c.with_dropout(1.0),
            c.with_dropout(-0.1),
        ] {
            assert!(bad.validate().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_new_adapter_leaves_the_layer_unchanged_and_a_is_kaiming() -> Result<()> {
        let dev = Device::Cpu;
        let vm = VarMap::new();
        let vb = crate::seeded_var_builder(&vm, 7, DType::F32, &dev);
        let w = randn(&[6, 40], 1)?;
        let base = Linear::from_weights(w, None);
        let lora = Lora::new(40, 6, &LoraConfig::default(), vb.pp("l"))?;
        // U(±1/√in): the bound is 1/√40 ≈ 0.158.
        let a_max = lora.a().abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(
            a_max > 0.1 && a_max <= 1.0 / 40f32.sqrt(),
            "A's largest {a_max}"
        );
        let x = randn(&[3, 5, 40], 2)?;
        let adapted = base.clone().with_lora(lora)?;
        assert_eq!(max_diff(&adapted.forward(&x)?, &base.forward(&x)?)?, 0.0);
        Ok(())
    }

    #[test]
    fn the_update_is_scaled_b_a_and_merges() -> Result<()> {
        let (w, bias) = (randn(&[6, 10], 1)?, randn(&[6], 2)?);
        let (a, b) = (randn(&[3, 10], 3)?, randn(&[6, 3], 4)?);
        let x = randn(&[4, 10], 5)?;
        let lora = Lora::from_weights(a.clone(), b.clone(), 0.5, 0.0)?;
        let layer = Linear::from_weights(w.clone(), Some(bias.clone())).with_lora(lora)?;
        // The same sum from candle's own matmul: x Wᵀ + b + 0.5 · x Aᵀ Bᵀ.
        let expected = (x.matmul(&w.t()?)?.broadcast_add(&bias)?
            + (x.matmul(&a.t()?)?.matmul(&b.t()?)? * 0.5)?)?;
        assert!(max_diff(&layer.forward(&x)?, &expected)? < 1e-5);
        let merged = layer.merged()?;
        assert!(merged.lora().is_none());
        assert!(max_diff(&merged.forward(&x)?, &expected)? < 1e-5);
        // Wrong shapes are refused, not broadcast.
        let other = Lora::from_weights(a, b.narrow(0, 0, 5)?, 0.5, 0.0)?;
        assert!(Linear::from_weights(w, None).with_lora(other).is_err());
        Ok(())
    }

    #[test]
    fn only_the_adapter_gets_gradients() -> Result<()> {
        let w = randn(&[6, 10], 1)?;
        let (a, b) = (
            Var::from_tensor(&randn(&[2, 10], 3)?)?,
            Var::from_tensor(&randn(&[6, 2], 4)?)?,
        );
        let lora = Lora::from_weights(a.as_tensor().clone(), b.as_tensor().clone(), 2.0, 0.0)?;
        let layer = Linear::from_weights(w.clone(), None).with_lora(lora)?;
        let x = randn(&[4, 10], 5)?;
        let grads = layer.forward(&x)?.sqr()?.sum_all()?.backward()?;
        assert!(grads.get(&w).is_none(), "the frozen weight got a gradient");
        // d/dB of Σ y² = 2 · s · yᵀ (x Aᵀ), from candle's matmul.
        let y = layer.forward(&x)?;
        let expected = (y.t()?.matmul(&x.matmul(&a.as_tensor().t()?)?)? * 4.0)?;
        let gb = grads.get(b.as_tensor()).expect("B has a gradient");
        let scale = max_diff(&expected, &expected.zeros_like()?)?;
        assert!(max_diff(gb, &expected)? < 1e-5 * scale);
        assert!(grads.get(a.as_tensor()).is_some());
        Ok(())
    }

    /// The adapted weight's one op against candle's `w + (B·A)·s`: the weight and the
    /// gradients of w, A and B (f32, f64), and no gradient for a frozen w.
    #[test]
    fn the_adapted_weight_op_equals_candle_ops() -> Result<()> {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            let var = |s: &[usize], seed| -> Result<Var> {
                Var::from_tensor(&randn(s, seed)?.to_dtype(dtype)?)
            };
            let (w, a, b) = (var(&[9, 14], 1)?, var(&[3, 14], 2)?, var(&[9, 3], 3)?);
            let r = randn(&[9, 14], 4)?.to_dtype(dtype)?;
            let lora = Lora::from_weights(a.as_tensor().clone(), b.as_tensor().clone(), 0.7, 0.0)?;
            let op = lora.adapted_weight(&w)?;
            let ops = (w.as_tensor() + (b.matmul(&a)? * 0.7)?)?;
            let rel = |x: &Tensor, y: &Tensor| -> Result<f64> {
                Ok(max_diff(x, y)? / max_diff(y, &y.zeros_like()?)?)
            };
            assert!(rel(&op, &ops)? < tol, "{dtype:?} weight");
            let (g1, g2) = (
                (&op * &r)?.sum_all()?.backward()?,
                (&ops * &r)?.sum_all()?.backward()?,
            );
            for (name, v) in [("w", &w), ("A", &a), ("B", &b)] {
                let (x, y) = (g1.get(v).expect("op grad"), g2.get(v).expect("ops grad"));
                assert!(rel(x, y)? < tol, "{dtype:?} d{name}");
            }
            let frozen = lora.adapted_weight(&w.as_tensor().detach())?;
            let g = frozen.sum_all()?.backward()?;
            assert!(g.get(&w).is_none() && g.get(&a).is_some() && g.get(&b).is_some());
        }
        Ok(())
    }

    #[test]
    fn dropout_touches_only_the_update_in_training() -> Result<()> {
        let w = randn(&[6, 10], 1)?;
        let (a, b) = (randn(&[3, 10], 3)?, randn(&[6, 3], 4)?);
        let lora = Lora::from_weights(a, b, 1.0, 0.5)?;
        let layer = Linear::from_weights(w.clone(), None).with_lora(lora.clone())?;
        let x = randn(&[8, 10], 5)?;
        let (t1, t2) = (
            layer.forward_train(&x, (9, 0))?,
            layer.forward_train(&x, (9, 0))?,
        );
        assert_eq!(
            max_diff(&t1, &t2)?,
            0.0,
            "the same seed draws the same mask"
        );
        assert!(max_diff(&t1, &layer.forward(&x)?)? > 1e-3);
        // The base's part of the output is never dropped.
        let base = Linear::from_weights(w, None).forward(&x)?;
        let update = lora.delta(&x, Some((9, 0)))?;
        assert!(max_diff(&(base + update)?, &t1)? < 1e-5);
        Ok(())
    }
}
