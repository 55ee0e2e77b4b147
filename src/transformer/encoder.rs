//! [`TransformerEncoder`]: a stack of encoder layers and an optional final layer norm.

use candle::{Result, Tensor};
use candle_nn::VarBuilder;

use super::checks::ENCODER_OPTIONS;
use super::parts::Stack;
use super::{EncoderOptions, FinalNorm, TransformerEncoderLayer, TransformerEncoderLayerConfig};

/// `num_layers` encoder layers (each with its own parameters) and, with [`FinalNorm::LayerNorm`], a layer
/// norm after the last.
///
/// PyTorch equivalent: `nn.TransformerEncoder(encoder_layer, num_layers, norm=nn.LayerNorm(d_model,
/// eps=layer_norm_eps, bias=bias) or None)`: parameters `layers.N.*` and `norm.*`.
///
/// # Shapes
/// As [`TransformerEncoderLayer`]: the output has the shape of `src`.
///
/// ```
/// use candle::{DType, Device, Tensor};
/// use candle_mha::candle_nn::VarMap;
/// use candle_mha::transformer::{EncoderOptions, FinalNorm, TransformerEncoder, TransformerEncoderLayerConfig};
/// # fn main() -> candle::Result<()> {
/// let varmap = VarMap::new();
/// let vb = candle_mha::seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
/// let cfg = TransformerEncoderLayerConfig::new(8, 2).with_dim_feedforward(32).with_batch_first(true);
/// let encoder = TransformerEncoder::new(cfg, 2, FinalNorm::LayerNorm, vb)?;
/// let src = Tensor::randn(0f32, 1., (3, 5, 8), &Device::Cpu)?; // (N, S, E)
/// let padding = Tensor::new(&[[0u8, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]], &Device::Cpu)?;
/// let out = encoder.forward(&src, &EncoderOptions::new().with_src_key_padding_mask(padding))?;
/// assert_eq!(out.dims(), [3, 5, 8]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TransformerEncoder {
    stack: Stack<TransformerEncoderLayer>,
}

impl TransformerEncoder {
    /// Creates the stack under `vb` (`layers.0.*`, …, `norm.*`). Each layer's dropout seed is
    /// derived from `layer_cfg.dropout_seed` and its index, so the layers drop differently.
    ///
    /// PyTorch equivalent: `nn.TransformerEncoder(nn.TransformerEncoderLayer(...), num_layers,
    /// norm)`.
    pub fn new(
        layer_cfg: TransformerEncoderLayerConfig,
        num_layers: usize,
        final_norm: FinalNorm,
        vb: VarBuilder,
    ) -> Result<Self> {
        layer_cfg.validate()?;
        let norm = (final_norm == FinalNorm::LayerNorm).then_some((
            layer_cfg.d_model,
            layer_cfg.layer_norm_eps,
            layer_cfg.bias,
        ));
        let stack = Stack::new(num_layers, layer_cfg.dropout_seed, norm, &vb, |seed, vb| {
            TransformerEncoderLayer::new(layer_cfg.clone().with_dropout_seed(seed), vb)
        })?;
        Ok(Self { stack })
    }

    /// The layers.
    pub fn layers(&self) -> &[TransformerEncoderLayer] {
        &self.stack.layers
    }

    /// Whether the stack ends in a layer norm (`norm.*`).
    pub fn has_final_norm(&self) -> bool {
        self.stack.norm.is_some()
    }

    /// Every parameter with its state_dict name (relative to the stack), in PyTorch's order.
    ///
    /// PyTorch equivalent: `encoder.named_parameters()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.stack
            .named_parameters(TransformerEncoderLayer::named_parameters)
    }

    /// The layers applied in turn to `src`, then the final norm.
    ///
    /// PyTorch equivalent: `encoder(src, mask=opts.mask,
    /// src_key_padding_mask=opts.src_key_padding_mask, is_causal=opts.is_causal)` (slow and
    /// fast paths give the same numbers; with a key padding mask PyTorch's fast path zeroes the
    /// padded positions of the output, which this does not).
    ///
    /// # Errors
    /// As [`TransformerEncoderLayer::forward`].
    pub fn forward(&self, src: &Tensor, opts: &EncoderOptions) -> Result<Tensor> {
        if let Some(first) = self.stack.layers.first() {
            first.check("TransformerEncoder", ENCODER_OPTIONS, src, opts)?;
        }
        self.stack
            .forward(src, opts.dropout_seed, |layer, x, seed| {
                let o = EncoderOptions {
                    dropout_seed: seed,
                    ..opts.clone()
                };
                layer.forward(x, &o)
            })
    }
}
