//! Small layers with PyTorch's names, initialisation and a full backward: `nn.Linear`,
//! `nn.Embedding`, `nn.LayerNorm`.
//!
//! candle-nn's `linear` uses another initialisation and its fused `LayerNorm` has no backward,
//! so these are written out. On the CPU in f32/f64, `Linear` and `LayerNorm` run as single ops
//! with their own backward (no broadcast adds and reductions through candle's autograd).

use candle::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

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

/// A lookup table of `num_embeddings` vectors.
///
/// PyTorch equivalent: `nn.Embedding(num_embeddings, dim)`: `weight [num, dim]` ~ N(0, 1).
#[derive(Clone, Debug)]
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// Takes (or creates, N(0, 1)) `weight` under `vb`.
    pub fn new(num_embeddings: usize, dim: usize, vb: VarBuilder) -> Result<Self> {
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        };
        Ok(Self {
            weight: vb.get_with_hints((num_embeddings, dim), "weight", init)?,
        })
    }

    /// `weight [num, dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for Embedding {
    /// `ids` of any shape (u32/i64) → `(*ids.shape, dim)`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut dims = ids.dims().to_vec();
        dims.push(self.weight.dim(1)?);
        self.weight
            .index_select(&ids.flatten_all()?, 0)?
            .reshape(dims)
    }
}

/// Layer normalisation over the last dimension, with a backward: one op on the CPU in
/// f32/f64 (row statistics in f64), candle's generic ops elsewhere.
///
/// PyTorch equivalent: `nn.LayerNorm(dim, eps=1e-5)`: `weight` ones, `bias` zeros; biased
/// variance. candle-nn's `LayerNorm` takes a fused path without backward.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Takes (or creates) `weight` and `bias` under `vb`.
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(dim, "weight", Init::Const(1.0))?,
            bias: vb.get_with_hints(dim, "bias", Init::Const(0.0))?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::fused::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}
