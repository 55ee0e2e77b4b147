//! [`RmsNorm`]: root-mean-square normalisation over the last dimension, as `torch.nn.RMSNorm`
//! computes it and as Llama's `LlamaRMSNorm` does (in f32, then cast back), built from
//! candle's differentiable ops (candle-nn's `rms_norm` is fused without a backward).

use candle::{DType, Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};

/// Where an [`RmsNorm`] computes and where its weight multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RmsNormKind {
    /// `torch.nn.RMSNorm`: `x · rsqrt(mean(x²) + eps) · weight`, all in the input's dtype.
    Torch,
    /// Hugging Face's `LlamaRMSNorm` (Qwen2's and Mistral's too): normalised in f32, cast back
    /// to the input's dtype, then multiplied by the weight (in the weight's dtype).
    #[default]
    Llama,
}

/// RMS normalisation over the last dimension, with a learned scale.
///
/// PyTorch equivalent: `torch.nn.RMSNorm(dim, eps)` ([`RmsNormKind::Torch`]; `eps=None` is
/// the dtype's machine epsilon, [`RmsNorm::torch_default_eps`]) or transformers'
/// `LlamaRMSNorm(dim, eps)` ([`RmsNormKind::Llama`]); parameter `weight [D]`, initialised to
/// ones.
///
/// # Shapes
/// `x (…, D)` → `(…, D)`.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    kind: RmsNormKind,
}

impl RmsNorm {
    /// Takes (or creates, as ones) `weight [dim]` under `vb`.
    pub fn new(dim: usize, eps: f64, kind: RmsNormKind, vb: VarBuilder) -> Result<Self> {
        check_eps(eps)?;
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        Ok(Self { weight, eps, kind })
    }

    /// A layer of the given weight as it is.
    pub fn from_weight(weight: Tensor, eps: f64, kind: RmsNormKind) -> Result<Self> {
        check_eps(eps)?;
        if weight.rank() != 1 {
            candle::bail!("RmsNorm: weight must be 1-D, got dims {:?}", weight.dims())
        }
        Ok(Self { weight, eps, kind })
    }

    /// `torch.finfo(dtype).eps`: `torch.nn.RMSNorm`'s epsilon when given `eps=None`.
    pub fn torch_default_eps(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => f64::EPSILON,
            DType::F16 => 0.0009765625,
            DType::BF16 => 0.0078125,
            _ => f64::from(f32::EPSILON),
        }
    }

    /// `weight [D]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

fn check_eps(eps: f64) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        candle::bail!("RmsNorm: eps must be finite and not negative, got {eps}")
    }
    Ok(())
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.weight.dims1()?;
        if x.dims().last() != Some(&d) {
            candle::bail!(
                "RmsNorm: input of dims {:?}, expected a last dim of {d}",
                x.dims()
            )
        }
        let dtype = x.dtype();
        let compute = match self.kind {
            RmsNormKind::Llama if dtype != DType::F64 => DType::F32,
            _ => dtype,
        };
        let x32 = x.to_dtype(compute)?;
        let inv = (x32.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?
            .sqrt()?
            .recip()?;
        let y = x32.broadcast_mul(&inv)?.to_dtype(dtype)?;
        match self.kind {
            RmsNormKind::Torch => y.broadcast_mul(&self.weight.to_dtype(dtype)?),
            // PyTorch's type promotion of `weight * x`: the wider of the two dtypes.
            RmsNormKind::Llama => {
                let w = &self.weight;
                let out = match (w.dtype(), dtype) {
                    (a, b) if a == b => a,
                    (DType::F64, _) | (_, DType::F64) => DType::F64,
                    _ => DType::F32,
                };
                y.to_dtype(out)?.broadcast_mul(&w.to_dtype(out)?)
            }
        }
    }
}
