//! [`TransformerDecoder`]: a stack of decoder layers and an optional final layer norm.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::checks::DECODER_OPTIONS;
use super::parts::{stack, Norm};
use super::{DecoderOptions, FinalNorm, TransformerDecoderLayer, TransformerDecoderLayerConfig};
use crate::rng::derive_seed;

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
    layers: Vec<TransformerDecoderLayer>,
    norm: Option<Norm>,
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
        let (layers, norm) = stack(num_layers, layer_cfg.dropout_seed, norm, &vb, |seed, vb| {
            TransformerDecoderLayer::new(layer_cfg.clone().with_dropout_seed(seed), vb)
        })?;
        Ok(Self { layers, norm })
    }

    /// The layers.
    pub fn layers(&self) -> &[TransformerDecoderLayer] {
        &self.layers
    }

    /// Whether the stack ends in a layer norm (`norm.*`).
    pub fn has_final_norm(&self) -> bool {
        self.norm.is_some()
    }

    /// Every parameter with its state_dict name (relative to the stack), in PyTorch's order.
    ///
    /// PyTorch equivalent: `decoder.named_parameters()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (n, t) in layer.named_parameters() {
                out.push((format!("layers.{i}.{n}"), t));
            }
        }
        if let Some(norm) = &self.norm {
            norm.push_params("norm", &mut out);
        }
        out
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
        if let Some(first) = self.layers.first() {
            first.check("TransformerDecoder", DECODER_OPTIONS, (tgt, memory), opts)?;
        }
        let mut x = tgt.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let mut o = opts.clone();
            o.dropout_seed = opts
                .dropout_seed
                .map(|s| derive_seed(s, &format!("layers.{i}")));
            x = layer.forward(&x, memory, &o)?;
        }
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }
}
