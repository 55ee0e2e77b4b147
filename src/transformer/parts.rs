//! The pieces every encoder/decoder layer shares: its layer norms, its feed-forward block,
//! its dropout seeds and its input check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle::{DType, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::Activation;
use crate::nn::dropout::{seeded_dropout, seeded_dropout_add};
use crate::nn::Linear;
use crate::rng::derive_seed;

/// The layer norms of encoder and decoder layers: `nn.LayerNorm(d, eps, bias=bias)`.
pub(crate) type Norm = crate::nn::LayerNorm;

/// The layers of a stack (`layers.{i}`) and its final norm (`norm`): what
/// `nn.TransformerEncoder` and `nn.TransformerDecoder` share.
#[derive(Clone, Debug)]
pub(crate) struct Stack<L> {
    pub(crate) layers: Vec<L>,
    pub(crate) norm: Option<Norm>,
}

impl<L> Stack<L> {
    /// Each layer built by `build` under `vb.pp("layers.{i}")` from the stack's dropout seed
    /// derived for its index (so the layers drop differently); the final norm
    /// `(d_model, eps, bias)` when asked for.
    pub(crate) fn new(
        num_layers: usize,
        dropout_seed: u64,
        final_norm: Option<(usize, f64, bool)>,
        vb: &VarBuilder,
        build: impl Fn(u64, VarBuilder) -> Result<L>,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|i| {
                let name = format!("layers.{i}");
                build(derive_seed(dropout_seed, &name), vb.pp(name))
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = match final_norm {
            Some((d, eps, bias)) => Some(Norm::new_with_bias(d, eps, bias, vb.pp("norm"))?),
            None => None,
        };
        Ok(Self { layers, norm })
    }

    /// `layers.{i}.*` from each layer's own names, then `norm.*`.
    pub(crate) fn named_parameters(
        &self,
        layer: impl Fn(&L) -> Vec<(String, Tensor)>,
    ) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            for (n, t) in layer(l) {
                out.push((format!("layers.{i}.{n}"), t));
            }
        }
        if let Some(norm) = &self.norm {
            norm.push_params("norm", &mut out);
        }
        out
    }

    /// `step` through the layers in turn from `x`, each with the call's dropout seed derived
    /// for its index, then the final norm.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        dropout_seed: Option<u64>,
        step: impl Fn(&L, &Tensor, Option<u64>) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let seed = dropout_seed.map(|s| derive_seed(s, &format!("layers.{i}")));
            x = step(layer, &x, seed)?;
        }
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }
}

/// `linear2(dropout(activation(linear1(x))))` (the final dropout is the caller's).
#[derive(Clone, Debug)]
pub(crate) struct FeedForward {
    pub(crate) linear1: Linear,
    pub(crate) linear2: Linear,
    activation: Activation,
}

impl FeedForward {
    pub(crate) fn new(
        d_model: usize,
        dim_ff: usize,
        bias: bool,
        activation: Activation,
        vb: &VarBuilder,
    ) -> Result<Self> {
        Ok(Self {
            linear1: Linear::new(d_model, dim_ff, bias, vb.pp("linear1"))?,
            linear2: Linear::new(dim_ff, d_model, bias, vb.pp("linear2"))?,
            activation,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, drop: &Dropout) -> Result<Tensor> {
        // Without dropout between the layers: the two-op MLP whose hidden activation never
        // becomes a tensor (`nn::mlp`).
        if let (Activation::Gelu, None) = (self.activation, drop.seed) {
            let (l1, l2) = (&self.linear1, &self.linear2);
            return crate::nn::mlp(x, (l1.weight(), l1.bias()), (l2.weight(), l2.bias()));
        }
        let h = match self.activation {
            // One fused op (linear + GELU, with backward) where the CPU has it.
            Activation::Gelu => {
                crate::nn::linear_gelu(x, self.linear1.weight(), self.linear1.bias())?
            }
            Activation::Relu => self.linear1.forward(x)?.relu()?,
        };
        self.linear2.forward(&drop.apply(&h, "dropout")?)
    }

    pub(crate) fn push_params(&self, out: &mut Vec<(String, Tensor)>) {
        for (name, l) in [("linear1", &self.linear1), ("linear2", &self.linear2)] {
            out.push((format!("{name}.weight"), l.weight().clone()));
            if let Some(b) = l.bias() {
                out.push((format!("{name}.bias"), b.clone()));
            }
        }
    }
}

/// The dropout of one forward call: off, or on with a seed from which each dropout module
/// (by its PyTorch name) derives its own mask.
pub(crate) struct Dropout {
    p: f64,
    seed: Option<u64>,
}

impl Dropout {
    pub(crate) fn apply(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        match self.seed {
            Some(seed) => seeded_dropout(x, self.p, derive_seed(seed, name)),
            None => Ok(x.clone()),
        }
    }

    /// `x + dropout(y)`: a residual connection whose branch is the dropout module `name`.
    pub(crate) fn add(&self, x: &Tensor, y: &Tensor, name: &str) -> Result<Tensor> {
        match self.seed {
            Some(seed) => seeded_dropout_add(x, y, self.p, derive_seed(seed, name), 0),
            None => x + y,
        }
    }

    /// The seed for a sub-module (the attention's `dropout_seed`), when dropout is on.
    pub(crate) fn sub_seed(&self, name: &str) -> Option<u64> {
        self.seed.map(|s| derive_seed(s, name))
    }
}

/// A layer's dropout-call counter: each training call without an explicit seed draws fresh
/// masks from `(config seed, call number)`, as the attention module does.
#[derive(Clone, Debug, Default)]
pub(crate) struct DropoutCalls(Arc<AtomicU64>);

impl DropoutCalls {
    pub(crate) fn dropout(
        &self,
        p: f64,
        config_seed: u64,
        train: bool,
        given: Option<u64>,
    ) -> Dropout {
        let seed = match (train && p > 0.0, given) {
            (false, _) => None,
            (true, Some(s)) => Some(s),
            (true, None) => {
                let call = self.0.fetch_add(1, Ordering::Relaxed);
                Some(derive_seed(config_seed, &call.to_string()))
            }
        };
        Dropout { p, seed }
    }
}

/// Checks that `x` (named `name`) is `(L, E)` or 3-D ending in `d_model`, in `dtype`.
pub(crate) fn check_input(
    layer: &str,
    name: &str,
    x: &Tensor,
    d_model: usize,
    dtype: DType,
) -> Result<()> {
    let dims = x.dims();
    if !(dims.len() == 2 || dims.len() == 3) || dims[dims.len() - 1] != d_model {
        candle::bail!(
            "{layer}: {name} has shape {dims:?}; expected (L, N, {d_model}), (N, L, {d_model}) \
             with batch_first, or (L, {d_model}) unbatched (d_model = {d_model})"
        )
    }
    if x.dtype() != dtype {
        candle::bail!(
            "{layer}: {name} has dtype {:?}; expected the parameters' dtype {dtype:?}",
            x.dtype()
        )
    }
    Ok(())
}
