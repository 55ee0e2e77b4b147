//! [`TransformerDecoder`]: a stack of decoder layers and an optional final layer norm.

use candle::{Result, Tensor};
use candle_nn::VarBuilder;

use super::checks::DECODER_OPTIONS;
use super::parts::Stack;
use super::{DecoderOptions, FinalNorm, TransformerDecoderLayer, TransformerDecoderLayerConfig};

/// `num_layers` decoder layers (each with its own parameters) and, with [`FinalNorm::LayerNorm`], a layer
/// norm after the last.
///
/// PyTorch equivalent: `nn.TransformerDecoder(decoder_layer, num_layers, norm=nn.LayerNorm(d_model,
/// eps=layer_norm_eps, bias=bias) or None)`: parameters `layers.N.*` and `norm.*`.
///
/// # Shapes
/// As [`TransformerDecoderLayer`]: the output has the shape of `tgt`.
#[derive(Clone, Debug)]
pub struct TransformerDecoder {
    stack: Stack<TransformerDecoderLayer>,
}

impl TransformerDecoder {
    /// Creates the stack under `vb` (`layers.0.*`, …, `norm.*`). Each layer's dropout seed is
    /// derived from `layer_cfg.dropout_seed` and its index, so the layers drop differently.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoder(nn.TransformerDecoderLayer(...), num_layers,
    /// norm)`.
    pub fn new(
        layer_cfg: TransformerDecoderLayerConfig,
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
            TransformerDecoderLayer::new(layer_cfg.clone().with_dropout_seed(seed), vb)
        })?;
        Ok(Self { stack })
    }

    /// The layers.
    pub fn layers(&self) -> &[TransformerDecoderLayer] {
        &self.stack.layers
    }

    /// Whether the stack ends in a layer norm (`norm.*`).
    pub fn has_final_norm(&self) -> bool {
        self.stack.norm.is_some()
    }

    /// Every parameter with its state_dict name (relative to the stack), in PyTorch's order.
    ///
    /// PyTorch equivalent: `decoder.named_parameters()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.stack
            .named_parameters(TransformerDecoderLayer::named_parameters)
    }

    /// The layers applied in turn to `tgt` (each attending to `memory`), then the final norm.
    ///
    /// PyTorch equivalent: `decoder(tgt, memory, tgt_mask=…, memory_mask=…,
    /// tgt_key_padding_mask=…, memory_key_padding_mask=…, tgt_is_causal=…,
    /// memory_is_causal=…)`.
    ///
    /// # Errors
    /// As [`TransformerDecoderLayer::forward`].
    pub fn forward(&self, tgt: &Tensor, memory: &Tensor, opts: &DecoderOptions) -> Result<Tensor> {
        if let Some(first) = self.stack.layers.first() {
            first.check("TransformerDecoder", DECODER_OPTIONS, (tgt, memory), opts)?;
        }
        self.stack
            .forward(tgt, opts.dropout_seed, |layer, x, seed| {
                let o = DecoderOptions {
                    dropout_seed: seed,
                    ..opts.clone()
                };
                layer.forward(x, memory, &o)
            })
    }
}
