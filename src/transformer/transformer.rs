//! [`Transformer`]: an encoder stack and a decoder stack, both with final norms, with its
//! config ([`TransformerConfig`]) and per-call arguments ([`TransformerOptions`]).

use candle::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::{
    Activation, DecoderOptions, EncoderOptions, FinalNorm, TransformerDecoder,
    TransformerDecoderLayerConfig, TransformerEncoder, TransformerEncoderLayerConfig,
};
use crate::init::xavier_uniform;
use crate::rng::derive_seed;

/// The configuration of a [`Transformer`].
///
/// PyTorch equivalent: the arguments of `nn.Transformer(d_model=512, nhead=8,
/// num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048, dropout=0.1,
/// activation="relu", layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True)`
/// with the same defaults for everything but `d_model` and `nhead`, which are required here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    /// Model width `E`.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub nhead: usize,
    /// Encoder layers. Default 6.
    pub num_encoder_layers: usize,
    /// Decoder layers. Default 6.
    pub num_decoder_layers: usize,
    /// Width of the feed-forward blocks. Default 2048.
    pub dim_feedforward: usize,
    /// Dropout probability (training mode only). Default 0.1.
    pub dropout: f64,
    /// Feed-forward activation. Default [`Activation::Relu`].
    pub activation: Activation,
    /// `eps` of the layer norms. Default 1e-5.
    pub layer_norm_eps: f64,
    /// `(N, L, E)` inputs and outputs when `true`, `(L, N, E)` when `false`. Default `false`.
    pub batch_first: bool,
    /// Pre-norm layers when `true`. Default `false`.
    pub norm_first: bool,
    /// Biases in the linear layers, attention and layer norms. Default `true`.
    pub bias: bool,
    /// Seed of the dropout masks. Default 0. Not in PyTorch.
    pub dropout_seed: u64,
}

impl TransformerConfig {
    /// PyTorch's defaults, with `d_model` and `nhead` given.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        Self {
            d_model,
            nhead,
            num_encoder_layers: 6,
            num_decoder_layers: 6,
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

    /// The config of each encoder layer.
    pub fn encoder_layer_config(&self) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig {
            d_model: self.d_model,
            nhead: self.nhead,
            dim_feedforward: self.dim_feedforward,
            dropout: self.dropout,
            activation: self.activation,
            layer_norm_eps: self.layer_norm_eps,
            batch_first: self.batch_first,
            norm_first: self.norm_first,
            bias: self.bias,
            dropout_seed: derive_seed(self.dropout_seed, "encoder"),
        }
    }

    /// The config of each decoder layer.
    pub fn decoder_layer_config(&self) -> TransformerDecoderLayerConfig {
        TransformerDecoderLayerConfig {
            dropout_seed: derive_seed(self.dropout_seed, "decoder"),
            ..self.encoder_layer_config()
        }
    }

    /// The config with each stack's layers as `layer` says (`d_model`, `nhead`, the
    /// feed-forward width, dropout, activation, layout, norms, bias, dropout seed) and
    /// PyTorch's six layers per stack.
    pub fn from_layer(layer: &TransformerEncoderLayerConfig) -> Self {
        Self {
            dim_feedforward: layer.dim_feedforward,
            dropout: layer.dropout,
            activation: layer.activation,
            layer_norm_eps: layer.layer_norm_eps,
            batch_first: layer.batch_first,
            norm_first: layer.norm_first,
            bias: layer.bias,
            dropout_seed: layer.dropout_seed,
            ..Self::new(layer.d_model, layer.nhead)
        }
    }
}

crate::setters! {
    TransformerConfig {
        with_num_encoder_layers(num_encoder_layers: usize);
        with_num_decoder_layers(num_decoder_layers: usize);
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

/// The per-call arguments of [`Transformer::forward`].
///
/// PyTorch equivalent: the keyword arguments of `nn.Transformer.forward(src, tgt,
/// src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
/// tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None,
/// tgt_is_causal=None, memory_is_causal=False)`, plus `train`. Masks as in [`EncoderOptions`]
/// and [`DecoderOptions`].
#[derive(Clone, Debug, Default)]
pub struct TransformerOptions {
    /// The encoder's self-attention mask `(S, S)` / `(N·nhead, S, S)`.
    pub src_mask: Option<Tensor>,
    /// The decoder's self-attention mask `(T, T)` / `(N·nhead, T, T)`.
    pub tgt_mask: Option<Tensor>,
    /// The decoder's cross-attention mask `(T, S)` / `(N·nhead, T, S)`.
    pub memory_mask: Option<Tensor>,
    /// Source keys to ignore, `(N, S)`.
    pub src_key_padding_mask: Option<Tensor>,
    /// Target keys to ignore, `(N, T)`.
    pub tgt_key_padding_mask: Option<Tensor>,
    /// Memory keys to ignore, `(N, S)`.
    pub memory_key_padding_mask: Option<Tensor>,
    /// Causal encoder self-attention.
    pub src_is_causal: bool,
    /// Causal decoder self-attention.
    pub tgt_is_causal: bool,
    /// Causal cross-attention.
    pub memory_is_causal: bool,
    /// Training mode: dropout on. Default `false`.
    pub train: bool,
    /// Seed of this call's dropout masks. Not in PyTorch.
    pub dropout_seed: Option<u64>,
}

crate::setters! {
    TransformerOptions {
        with_src_mask(src_mask: Some(Tensor));
        with_tgt_mask(tgt_mask: Some(Tensor));
        with_memory_mask(memory_mask: Some(Tensor));
        with_src_key_padding_mask(src_key_padding_mask: Some(Tensor));
        with_tgt_key_padding_mask(tgt_key_padding_mask: Some(Tensor));
        with_memory_key_padding_mask(memory_key_padding_mask: Some(Tensor));
        with_src_is_causal(src_is_causal: bool);
        with_tgt_is_causal(tgt_is_causal: bool);
        with_memory_is_causal(memory_is_causal: bool);
        with_train(train: bool);
        with_dropout_seed(dropout_seed: Some(u64));
    }
}

impl TransformerOptions {
    /// No masks, not causal, eval mode.
    pub fn new() -> Self {
        Self::default()
    }

    /// The encoder's share of the arguments.
    pub fn encoder_options(&self) -> EncoderOptions {
        EncoderOptions {
            mask: self.src_mask.clone(),
            src_key_padding_mask: self.src_key_padding_mask.clone(),
            is_causal: self.src_is_causal,
            train: self.train,
            dropout_seed: self.dropout_seed.map(|s| derive_seed(s, "encoder")),
        }
    }

    /// The decoder's share of the arguments.
    pub fn decoder_options(&self) -> DecoderOptions {
        DecoderOptions {
            tgt_mask: self.tgt_mask.clone(),
            memory_mask: self.memory_mask.clone(),
            tgt_key_padding_mask: self.tgt_key_padding_mask.clone(),
            memory_key_padding_mask: self.memory_key_padding_mask.clone(),
            tgt_is_causal: self.tgt_is_causal,
            memory_is_causal: self.memory_is_causal,
            train: self.train,
            dropout_seed: self.dropout_seed.map(|s| derive_seed(s, "decoder")),
        }
    }
}

/// The encoder-decoder model of "Attention Is All You Need": `encoder.*` and `decoder.*`, each
/// stack with its final layer norm.
///
/// PyTorch equivalent: `nn.Transformer(...)`. Created fresh, every matrix is drawn
/// `xavier_uniform` as `nn.Transformer._reset_parameters` does (vectors keep their layers'
/// init).
///
/// # Shapes
/// `src`: `(S, N, E)` (`(N, S, E)` with `batch_first`, `(S, E)` unbatched); `tgt`: `(T, N, E)`
/// likewise; output: the shape of `tgt`.
///
/// ```
/// use candle::{DType, Device, Tensor};
/// use candle_mha::candle_nn::VarMap;
/// use candle_mha::transformer::{Transformer, TransformerConfig, TransformerOptions};
/// # fn main() -> candle::Result<()> {
/// let varmap = VarMap::new();
/// let vb = candle_mha::seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
/// let cfg = TransformerConfig::new(8, 2)
///     .with_num_encoder_layers(1)
///     .with_num_decoder_layers(1)
///     .with_dim_feedforward(16);
/// let model = Transformer::new(cfg, vb)?;
/// let src = Tensor::randn(0f32, 1., (5, 2, 8), &Device::Cpu)?; // (S, N, E)
/// let tgt = Tensor::randn(0f32, 1., (4, 2, 8), &Device::Cpu)?; // (T, N, E)
/// let out = model.forward(&src, &tgt, &TransformerOptions::new().with_tgt_is_causal(true))?;
/// assert_eq!(out.dims(), [4, 2, 8]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Transformer {
    config: TransformerConfig,
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
}

impl Transformer {
    /// Creates the model under `vb` (`encoder.*`, `decoder.*`).
    ///
    /// PyTorch equivalent: `nn.Transformer(...)`, or `load_state_dict` when `vb` reads a
    /// checkpoint.
    pub fn new(config: TransformerConfig, vb: VarBuilder) -> Result<Self> {
        let (enc_cfg, dec_cfg) = (config.encoder_layer_config(), config.decoder_layer_config());
        enc_cfg.validate()?;
        let (e, ff) = (config.d_model, config.dim_feedforward);
        // Asking for the matrices first with xavier hints makes a VarMap create them so; the
        // layers then get the same variables (a checkpoint's tensors ignore hints).
        let matrices = |prefix: String, attns: &[&str]| -> Result<()> {
            for a in attns {
                vb.get_with_hints(
                    (e, e),
                    &format!("{prefix}.{a}.out_proj.weight"),
                    xavier_uniform(e, e),
                )?;
            }
            vb.get_with_hints(
                (ff, e),
                &format!("{prefix}.linear1.weight"),
                xavier_uniform(e, ff),
            )?;
            vb.get_with_hints(
                (e, ff),
                &format!("{prefix}.linear2.weight"),
                xavier_uniform(ff, e),
            )?;
            Ok(())
        };
        for i in 0..config.num_encoder_layers {
            matrices(format!("encoder.layers.{i}"), &["self_attn"])?;
        }
        for i in 0..config.num_decoder_layers {
            matrices(
                format!("decoder.layers.{i}"),
                &["self_attn", "multihead_attn"],
            )?;
        }
        let encoder = TransformerEncoder::new(
            enc_cfg,
            config.num_encoder_layers,
            FinalNorm::LayerNorm,
            vb.pp("encoder"),
        )?;
        let decoder = TransformerDecoder::new(
            dec_cfg,
            config.num_decoder_layers,
            FinalNorm::LayerNorm,
            vb.pp("decoder"),
        )?;
        Ok(Self {
            config,
            encoder,
            decoder,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// The encoder stack (`encoder`).
    pub fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    /// The decoder stack (`decoder`).
    pub fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    /// Every parameter with its state_dict name, in PyTorch's order.
    ///
    /// PyTorch equivalent: `model.named_parameters()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let enc = self.encoder.named_parameters().into_iter();
        let dec = self.decoder.named_parameters().into_iter();
        enc.map(|(n, t)| (format!("encoder.{n}"), t))
            .chain(dec.map(|(n, t)| (format!("decoder.{n}"), t)))
            .collect()
    }

    /// Encodes `src`, then decodes `tgt` attending to the encoding.
    ///
    /// PyTorch equivalent: `model(src, tgt, src_mask=…, tgt_mask=…, memory_mask=…,
    /// src_key_padding_mask=…, tgt_key_padding_mask=…, memory_key_padding_mask=…,
    /// src_is_causal=…, tgt_is_causal=…, memory_is_causal=…)`.
    ///
    /// # Errors
    /// `src`/`tgt` of different ranks or batch sizes, or not ending in `d_model`; anything the
    /// layers reject.
    pub fn forward(&self, src: &Tensor, tgt: &Tensor, opts: &TransformerOptions) -> Result<Tensor> {
        let d = self.config.d_model;
        let (sd, td) = (src.dims(), tgt.dims());
        if sd.last() != Some(&d) || td.last() != Some(&d) {
            candle::bail!("Transformer: src {sd:?} and tgt {td:?} must both end in d_model = {d}")
        }
        if sd.len() != td.len() {
            candle::bail!("Transformer: src {sd:?} and tgt {td:?} must have the same rank")
        }
        if sd.len() == 3 {
            let b = usize::from(!self.config.batch_first);
            if sd[b] != td[b] {
                candle::bail!(
                    "Transformer: the batch sizes of src {sd:?} and tgt {td:?} (dim {b}) must be equal"
                )
            }
        }
        // Every mask checked first, under the names of `TransformerOptions`.
        let (enc, dec) = (opts.encoder_options(), opts.decoder_options());
        if let Some(first) = self.encoder.layers().first() {
            let names = [
                "TransformerOptions::src_mask",
                "TransformerOptions::src_key_padding_mask",
            ];
            first.check("Transformer", names, src, &enc)?;
        }
        if let Some(first) = self.decoder.layers().first() {
            let names = [
                "TransformerOptions::tgt_mask",
                "TransformerOptions::memory_mask",
                "TransformerOptions::tgt_key_padding_mask",
                "TransformerOptions::memory_key_padding_mask",
            ];
            // The memory has the source's batch and length.
            first.check("Transformer", names, (tgt, src), &dec)?;
        }
        let memory = self.encoder.forward(src, &enc)?;
        self.decoder.forward(tgt, &memory, &dec)
    }
}
