//! [`Activation`] and the constructor arguments of the encoder and decoder layers
//! ([`TransformerLayerConfig`], named [`TransformerEncoderLayerConfig`] and
//! [`TransformerDecoderLayerConfig`] at each layer's constructor: PyTorch's two layer classes
//! take the same arguments).

use candle::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// The activation of the feed-forward block.
///
/// PyTorch equivalent: the `activation` argument, `"relu"` (`F.relu`) or `"gelu"` (`F.gelu`,
/// exact erf form).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(x, 0)`. PyTorch equivalent: `F.relu`.
    #[default]
    Relu,
    /// `x·Φ(x)` (erf, not tanh). PyTorch equivalent: `F.gelu` (`approximate="none"`).
    Gelu,
}

impl Activation {
    /// Applies the activation to a tensor of any shape (with backward).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => crate::nn::gelu_erf(x),
        }
    }
}

/// What ends a Transformer stack: PyTorch's `norm=` argument of `nn.TransformerEncoder` and
/// `nn.TransformerDecoder` (`nn.Transformer` always gives each stack a layer norm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FinalNorm {
    /// `norm=None`: the last layer's output as it is.
    #[default]
    None,
    /// `norm=nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)`: parameters `norm.*`.
    LayerNorm,
}

/// `"relu"` or `"gelu"`, the strings PyTorch's `activation=` argument takes.
///
/// ```
/// use candle_mha::transformer::Activation;
/// assert_eq!("gelu".parse::<Activation>().unwrap(), Activation::Gelu);
/// assert!("tanh".parse::<Activation>().unwrap_err().to_string().contains("relu or gelu"));
/// ```
impl std::str::FromStr for Activation {
    type Err = candle::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            other => candle::bail!("activation \"{other}\": expected relu or gelu"),
        }
    }
}

/// The name [`FromStr`](std::str::FromStr) reads: `"relu"` or `"gelu"`.
impl std::fmt::Display for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
        })
    }
}

/// The constructor arguments of an encoder or a decoder layer, which PyTorch's two layer
/// classes share ([`TransformerEncoderLayerConfig`] and [`TransformerDecoderLayerConfig`] are
/// its names at each layer's constructor).
///
/// PyTorch equivalent: the arguments of `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer(d_model,
/// nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
/// batch_first=False, norm_first=False, bias=True)`, with the same defaults.
///
/// ```
/// use candle_mha::transformer::{Activation, TransformerEncoderLayerConfig};
/// let cfg = TransformerEncoderLayerConfig::new(16, 2)
///     .with_dim_feedforward(32)
///     .with_activation(Activation::Gelu)
///     .with_norm_first(true);
/// assert_eq!((cfg.dropout, cfg.layer_norm_eps, cfg.bias), (0.1, 1e-5, true));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerLayerConfig {
    /// Model width `E` (the last dimension of the inputs).
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub nhead: usize,
    /// Width of the feed-forward block. Default 2048.
    pub dim_feedforward: usize,
    /// Dropout probability (attention weights and every residual branch), applied only in
    /// training mode. Default 0.1.
    pub dropout: f64,
    /// The feed-forward activation. Default [`Activation::Relu`].
    pub activation: Activation,
    /// `eps` of the layer norms. Default 1e-5.
    pub layer_norm_eps: f64,
    /// Inputs and outputs `(N, L, E)` when `true`, `(L, N, E)` when `false`. Default `false`.
    pub batch_first: bool,
    /// Layer norm before each block (pre-norm) when `true`, after the residual sum
    /// (post-norm) when `false`. Default `false`.
    pub norm_first: bool,
    /// Biases in the linear layers, the attention and the layer norms. Default `true`.
    pub bias: bool,
    /// Seed of the dropout masks (candle's generator cannot be seeded). Default 0. Not in
    /// PyTorch, where dropout uses the global generator.
    pub dropout_seed: u64,
}

/// The configuration of a [`TransformerEncoderLayer`](super::TransformerEncoderLayer).
///
/// PyTorch equivalent: the arguments of `nn.TransformerEncoderLayer`.
pub type TransformerEncoderLayerConfig = TransformerLayerConfig;

/// The configuration of a [`TransformerDecoderLayer`](super::TransformerDecoderLayer).
///
/// PyTorch equivalent: the arguments of `nn.TransformerDecoderLayer`.
pub type TransformerDecoderLayerConfig = TransformerLayerConfig;

impl TransformerLayerConfig {
    /// PyTorch's defaults for `d_model` and `nhead`.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        Self {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
            dropout_seed: 0,
        }
    }

    /// The attention's config: same width, heads, dropout, bias and layout.
    pub fn attention_config(&self) -> crate::MultiheadAttentionConfig {
        crate::MultiheadAttentionConfig::new(self.d_model, self.nhead)
            .with_dropout(self.dropout)
            .with_bias(self.bias)
            .with_batch_first(self.batch_first)
            .with_dropout_seed(self.dropout_seed)
    }

    /// Checks the sizes and the dropout probability, naming the bad argument.
    pub fn validate(&self) -> Result<()> {
        if self.d_model == 0 || self.nhead == 0 || !self.d_model.is_multiple_of(self.nhead) {
            candle::bail!(
                "transformer layer: nhead ({}) must be positive and divide d_model ({})",
                self.nhead,
                self.d_model
            )
        }
        if self.dim_feedforward == 0 {
            candle::bail!("transformer layer: dim_feedforward must be positive, got 0")
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            candle::bail!(
                "transformer layer: dropout must be in [0, 1], got {}",
                self.dropout
            )
        }
        Ok(())
    }
}

crate::setters! {
    TransformerLayerConfig {
        with_dim_feedforward(dim_feedforward: usize);
        with_dropout(dropout: f64);
        with_activation(activation: Activation);
        with_layer_norm_eps(layer_norm_eps: f64);
        with_batch_first(batch_first: bool);
        with_norm_first(norm_first: bool);
        with_bias(bias: bool);
        with_dropout_seed(dropout_seed: u64);
    }
}
