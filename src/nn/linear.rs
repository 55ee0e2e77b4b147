//! `nn.Linear` with PyTorch's initialisation; on the CPU in f32/f64 one op with its own
//! backward (`crate::cpu::linear`: the bias is the product's starting value).
//!
//! candle-nn's `linear` uses another initialisation, so this one is written out.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::init::linear_weight;

/// `y = x Wᵀ + b` over the last dimension, for inputs of any rank.
///
/// PyTorch equivalent: `nn.Linear(in_features, out_features)`: `weight [out, in]`, `bias [out]`,
/// both initialised U(±1/√in).
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
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
        Ok(Self { weight, bias })
    }

    /// A layer of the given parameters as they are (no copy, no check): `weight [out, in]`,
    /// `bias [out]`.
    ///
    /// PyTorch equivalent: assigning `linear.weight` / `linear.bias`.
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// `weight [out, in]`.
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
        crate::cpu::linear(x, &self.weight, self.bias.as_ref())
    }
}
