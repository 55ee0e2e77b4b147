//! `nn.Embedding`: a lookup table initialised N(0, 1).

use candle::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

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
        crate::threads::tune_candle_threads();
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
