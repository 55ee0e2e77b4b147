//! `nn.Linear` with PyTorch's initialisation; on the CPU in f32/f64 one op with its own
//! backward (`crate::cpu::linear`: the bias is the product's starting value).
//!
//! candle-nn's `linear` uses another initialisation, so this one is written out. A layer may
//! carry a LoRA adapter ([`Linear::with_lora`]), added to its output.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::lora::{add_delta, Lora};
use super::lora_linear::lora_linear;
use crate::init::linear_weight;

/// `y = x Wᵀ + b` over the last dimension, for inputs of any rank.
///
/// PyTorch equivalent: `nn.Linear(in_features, out_features)`: `weight [out, in]`, `bias [out]`,
/// both initialised U(±1/√in). With an adapter, PEFT's `lora.Linear` around it.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<Lora>,
}

impl Linear {
    /// Takes (or creates, with PyTorch's init) `weight` and `bias` under `vb`.
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        let weight = vb.get_with_hints(
            (out_features, in_features),
            "weight",
            linear_weight(in_features),
        )?;
        let bias = match bias {
            true => Some(vb.get_with_hints(out_features, "bias", linear_weight(in_features))?),
            false => None,
        };
        Ok(Self {
            weight,
            bias,
            lora: None,
        })
    }

    /// A layer of the given parameters as they are (no copy, no check): `weight [out, in]`,
    /// `bias [out]`.
    ///
    /// PyTorch equivalent: assigning `linear.weight` / `linear.bias`.
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self {
            weight,
            bias,
            lora: None,
        }
    }

    /// The layer with `lora`'s update added to its output: `x Wᵀ + b + s·B(A(dropout(x)))`.
    /// Errors when the adapter's features are not the layer's.
    ///
    /// PyTorch equivalent: PEFT's `lora.Linear(base_layer, ...)`.
    pub fn with_lora(mut self, lora: Lora) -> Result<Self> {
        let (out, inp) = self.weight.dims2()?;
        if lora.features()? != (inp, out) {
            candle::bail!(
                "LoRA: an adapter of {:?} features (in, out) on a linear layer of {:?}",
                lora.features()?,
                (inp, out)
            )
        }
        self.lora = Some(lora);
        Ok(self)
    }

    /// The adapter, if any.
    pub fn lora(&self) -> Option<&Lora> {
        self.lora.as_ref()
    }

    /// The layer with its adapter merged into the weight (the same layer without one).
    ///
    /// PyTorch equivalent: `merge_and_unload()`.
    pub fn merged(&self) -> Result<Self> {
        Ok(match &self.lora {
            Some(l) => Self::from_weights(l.merge(&self.weight)?, self.bias.clone()),
            None => self.clone(),
        })
    }

    /// The output in training mode: the adapter's dropout drawn from `(seed, offset)` (see
    /// [`Lora::delta`]); the same as `forward` without an adapter or dropout.
    pub fn forward_train(&self, x: &Tensor, dropout: (u64, u64)) -> Result<Tensor> {
        self.forward_with(x, Some(dropout))
    }

    /// The output, the adapter in one op with the frozen layer where it can be.
    fn forward_with(&self, x: &Tensor, train: Option<(u64, u64)>) -> Result<Tensor> {
        if let Some(l) = &self.lora {
            let dropout_now = train.is_some() && l.dropout() > 0.0;
            let bias = self.bias.as_ref();
            if let Some(y) = lora_linear(x, &self.weight, bias, l, dropout_now)? {
                return Ok(y);
            }
        }
        let y = crate::cpu::linear(x, &self.weight, self.bias.as_ref())?;
        add_delta(y, self.lora.as_ref(), x, train)
    }

    /// `weight [out, in]` (without the adapter's update).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `bias [out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
    }
}
