//! [`TransformerDecoderLayer`]: self-attention, cross-attention over the encoder's output and
//! a feed-forward block, each with a residual connection and a layer norm.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::checks::{decoder_masks, Layout, DECODER_OPTIONS};
use super::parts::{check_input, Dropout, DropoutCalls, FeedForward, Norm};
use super::{DecoderOptions, TransformerDecoderLayerConfig};
use crate::{AttentionOptions, MultiheadAttention};

/// One decoder layer.
///
/// PyTorch equivalent: `nn.TransformerDecoderLayer(d_model, nhead, ...)`, parameters
/// `self_attn.*`, `multihead_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*`,
/// `norm3.*`. Post-norm: `x = norm1(x + sa(x)); x = norm2(x + mha(x, mem)); x = norm3(x +
/// ff(x))`; pre-norm: `x = x + sa(norm1(x)); x = x + mha(norm2(x), mem); x = x + ff(norm3(x))`.
///
/// # Shapes
/// `tgt`: `(T, N, E)`, `(N, T, E)` with `batch_first`, or `(T, E)` unbatched; `memory`:
/// `(S, N, E)` / `(N, S, E)` / `(S, E)` likewise. The output has the shape of `tgt`.
#[derive(Clone, Debug)]
pub struct TransformerDecoderLayer {
    config: TransformerDecoderLayerConfig,
    self_attn: MultiheadAttention,
    multihead_attn: MultiheadAttention,
    ff: FeedForward,
    norm1: Norm,
    norm2: Norm,
    norm3: Norm,
    calls: DropoutCalls,
}

impl TransformerDecoderLayer {
    /// Creates the layer, taking (or creating with PyTorch's initialisation) its parameters
    /// under `vb` by PyTorch's names.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoderLayer(...)`, or `load_state_dict` when `vb`
    /// reads a checkpoint.
    pub fn new(config: TransformerDecoderLayerConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let (e, bias, eps) = (config.d_model, config.bias, config.layer_norm_eps);
        let attn = config.attention_config();
        Ok(Self {
            self_attn: MultiheadAttention::new(attn.clone(), vb.pp("self_attn"))?,
            multihead_attn: MultiheadAttention::new(
                attn.with_dropout_seed(crate::rng::derive_seed(config.dropout_seed, "cross")),
                vb.pp("multihead_attn"),
            )?,
            ff: FeedForward::new(e, config.dim_feedforward, bias, config.activation, &vb)?,
            norm1: Norm::new_with_bias(e, eps, bias, vb.pp("norm1"))?,
            norm2: Norm::new_with_bias(e, eps, bias, vb.pp("norm2"))?,
            norm3: Norm::new_with_bias(e, eps, bias, vb.pp("norm3"))?,
            calls: DropoutCalls::default(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerDecoderLayerConfig {
        &self.config
    }

    /// The self-attention (`self_attn`).
    pub fn self_attn(&self) -> &MultiheadAttention {
        &self.self_attn
    }

    /// The cross-attention over the memory (`multihead_attn`).
    pub fn multihead_attn(&self) -> &MultiheadAttention {
        &self.multihead_attn
    }

    /// `linear1` (`d_model → dim_feedforward`).
    pub fn linear1(&self) -> &crate::nn::Linear {
        &self.ff.linear1
    }

    /// `linear2` (`dim_feedforward → d_model`).
    pub fn linear2(&self) -> &crate::nn::Linear {
        &self.ff.linear2
    }

    /// Every parameter with its state_dict name (relative to the layer), in PyTorch's order.
    ///
    /// PyTorch equivalent: `layer.named_parameters()`.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (prefix, attn) in [
            ("self_attn", &self.self_attn),
            ("multihead_attn", &self.multihead_attn),
        ] {
            for (n, t) in attn.named_parameters() {
                out.push((format!("{prefix}.{n}"), t));
            }
        }
        self.ff.push_params(&mut out);
        self.norm1.push_params("norm1", &mut out);
        self.norm2.push_params("norm2", &mut out);
        self.norm3.push_params("norm3", &mut out);
        out
    }

    /// The layer applied to `tgt` attending to `memory`.
    ///
    /// PyTorch equivalent: `layer(tgt, memory, tgt_mask=…, memory_mask=…,
    /// tgt_key_padding_mask=…, memory_key_padding_mask=…, tgt_is_causal=…,
    /// memory_is_causal=…)` with `layer.train(opts.train)`.
    ///
    /// # Errors
    /// `tgt` or `memory` not 2-/3-D ending in `d_model`, or in another dtype; bad masks or
    /// mismatched batch sizes (from the attention).
    pub fn forward(&self, tgt: &Tensor, memory: &Tensor, opts: &DecoderOptions) -> Result<Tensor> {
        let cfg = &self.config;
        self.check(
            "TransformerDecoderLayer",
            DECODER_OPTIONS,
            (tgt, memory),
            opts,
        )?;
        let drop = self
            .calls
            .dropout(cfg.dropout, cfg.dropout_seed, opts.train, opts.dropout_seed);
        let mut x = tgt.clone();
        if cfg.norm_first {
            let sa = self.sa_block(&self.norm1.forward(&x)?, opts, &drop)?;
            x = drop.add(&x, &sa, "dropout1")?;
            let mha = self.mha_block(&self.norm2.forward(&x)?, memory, opts, &drop)?;
            x = drop.add(&x, &mha, "dropout2")?;
            let ff = self.ff.forward(&self.norm3.forward(&x)?, &drop)?;
            x = drop.add(&x, &ff, "dropout3")?;
        } else {
            let sa = self.sa_block(&x, opts, &drop)?;
            x = self.norm1.forward(&drop.add(&x, &sa, "dropout1")?)?;
            let mha = self.mha_block(&x, memory, opts, &drop)?;
            x = self.norm2.forward(&drop.add(&x, &mha, "dropout2")?)?;
            let ff = self.ff.forward(&x, &drop)?;
            x = self.norm3.forward(&drop.add(&x, &ff, "dropout3")?)?;
        }
        Ok(x)
    }

    /// Checks `tgt`, `memory` and the masks of `opts` before any computation, naming `who`
    /// (the layer or stack the user called) and the mask options as `names` calls them.
    pub(crate) fn check(
        &self,
        who: &str,
        names: [&str; 4],
        (tgt, memory): (&Tensor, &Tensor),
        opts: &DecoderOptions,
    ) -> Result<()> {
        let cfg = &self.config;
        let dtype = self.norm1.dtype();
        check_input(who, "tgt", tgt, cfg.d_model, dtype)?;
        check_input(who, "memory", memory, cfg.d_model, dtype)?;
        let layout = Layout {
            batch_first: cfg.batch_first,
            nhead: cfg.nhead,
        };
        let masks = [
            opts.tgt_mask.as_ref(),
            opts.memory_mask.as_ref(),
            opts.tgt_key_padding_mask.as_ref(),
            opts.memory_key_padding_mask.as_ref(),
        ];
        decoder_masks(who, names, (tgt, memory), masks, layout)
    }

    fn sa_block(&self, x: &Tensor, opts: &DecoderOptions, drop: &Dropout) -> Result<Tensor> {
        let mut a = AttentionOptions::new()
            .with_need_weights(false)
            .with_is_causal(opts.tgt_is_causal)
            .with_train(opts.train);
        a.attn_mask = opts.tgt_mask.clone();
        a.key_padding_mask = opts.tgt_key_padding_mask.clone();
        a.dropout_seed = drop.sub_seed("self_attn");
        Ok(self.self_attn.forward(x, x, x, &a)?.output)
    }

    fn mha_block(
        &self,
        x: &Tensor,
        memory: &Tensor,
        opts: &DecoderOptions,
        drop: &Dropout,
    ) -> Result<Tensor> {
        let mut a = AttentionOptions::new()
            .with_need_weights(false)
            .with_is_causal(opts.memory_is_causal)
            .with_train(opts.train);
        a.attn_mask = opts.memory_mask.clone();
        a.key_padding_mask = opts.memory_key_padding_mask.clone();
        a.dropout_seed = drop.sub_seed("multihead_attn");
        Ok(self.multihead_attn.forward(x, memory, memory, &a)?.output)
    }
}
