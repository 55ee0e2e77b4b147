//! [`TransformerEncoderLayer`]: self-attention and a feed-forward block, each with a residual
//! connection and a layer norm.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::checks::{encoder_masks, Layout, ENCODER_OPTIONS};
use super::parts::{check_input, Dropout, DropoutCalls, FeedForward, Norm};
use super::{EncoderOptions, TransformerEncoderLayerConfig};
use crate::{AttentionOptions, MultiheadAttention};

/// One encoder layer.
///
/// PyTorch equivalent: `nn.TransformerEncoderLayer(d_model, nhead, ...)`, parameters
/// `self_attn.*` (an `nn.MultiheadAttention`), `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*`.
/// Post-norm: `x = norm1(x + sa(x)); x = norm2(x + ff(x))`; pre-norm (`norm_first`):
/// `x = x + sa(norm1(x)); x = x + ff(norm2(x))`.
///
/// # Shapes
/// `src`: `(S, N, E)`, `(N, S, E)` with `batch_first`, or `(S, E)` unbatched; the output has
/// the shape of `src`.
#[derive(Clone, Debug)]
pub struct TransformerEncoderLayer {
    config: TransformerEncoderLayerConfig,
    self_attn: MultiheadAttention,
    ff: FeedForward,
    norm1: Norm,
    norm2: Norm,
    calls: DropoutCalls,
}

impl TransformerEncoderLayer {
    /// Creates the layer, taking (or creating with PyTorch's initialisation) its parameters
    /// under `vb` by PyTorch's names.
    ///
    /// PyTorch equivalent: `nn.TransformerEncoderLayer(...)`, or `load_state_dict` when `vb`
    /// reads a checkpoint.
    pub fn new(config: TransformerEncoderLayerConfig, vb: VarBuilder) -> Result<Self> {
        config.validate()?;
        let (e, bias, eps) = (config.d_model, config.bias, config.layer_norm_eps);
        Ok(Self {
            self_attn: MultiheadAttention::new(config.attention_config(), vb.pp("self_attn"))?,
            ff: FeedForward::new(e, config.dim_feedforward, bias, config.activation, &vb)?,
            norm1: Norm::new_with_bias(e, eps, bias, vb.pp("norm1"))?,
            norm2: Norm::new_with_bias(e, eps, bias, vb.pp("norm2"))?,
            calls: DropoutCalls::default(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerEncoderLayerConfig {
        &self.config
    }

    /// The self-attention (`self_attn`).
    pub fn self_attn(&self) -> &MultiheadAttention {
        &self.self_attn
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
        let mut out: Vec<(String, Tensor)> = self
            .self_attn
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (format!("self_attn.{n}"), t))
            .collect();
        self.ff.push_params(&mut out);
        self.norm1.push_params("norm1", &mut out);
        self.norm2.push_params("norm2", &mut out);
        out
    }

    /// The layer applied to `src`.
    ///
    /// PyTorch equivalent: `layer(src, src_mask=opts.mask,
    /// src_key_padding_mask=opts.src_key_padding_mask, is_causal=opts.is_causal)` with
    /// `layer.train(opts.train)`.
    ///
    /// # Errors
    /// `src` not 2-/3-D ending in `d_model`, or in another dtype; bad masks (from the attention).
    pub fn forward(&self, src: &Tensor, opts: &EncoderOptions) -> Result<Tensor> {
        let cfg = &self.config;
        self.check("TransformerEncoderLayer", ENCODER_OPTIONS, src, opts)?;
        let drop = self
            .calls
            .dropout(cfg.dropout, cfg.dropout_seed, opts.train, opts.dropout_seed);
        let mut x = src.clone();
        if cfg.norm_first {
            let sa = self.sa_block(&self.norm1.forward(&x)?, opts, &drop)?;
            x = drop.add(&x, &sa, "dropout1")?;
            let ff = self.ff.forward(&self.norm2.forward(&x)?, &drop)?;
            x = drop.add(&x, &ff, "dropout2")?;
        } else {
            let sa = self.sa_block(&x, opts, &drop)?;
            x = self.norm1.forward(&drop.add(&x, &sa, "dropout1")?)?;
            let ff = self.ff.forward(&x, &drop)?;
            x = self.norm2.forward(&drop.add(&x, &ff, "dropout2")?)?;
        }
        Ok(x)
    }

    /// Checks `src` and the masks of `opts` before any computation, naming `who` (the layer
    /// or stack the user called) and the mask options as `names` calls them.
    pub(crate) fn check(
        &self,
        who: &str,
        names: [&str; 2],
        src: &Tensor,
        opts: &EncoderOptions,
    ) -> Result<()> {
        let cfg = &self.config;
        check_input(who, "src", src, cfg.d_model, self.norm1.dtype())?;
        let layout = Layout {
            batch_first: cfg.batch_first,
            nhead: cfg.nhead,
        };
        let masks = (opts.mask.as_ref(), opts.src_key_padding_mask.as_ref());
        encoder_masks(who, names, src, masks, layout)
    }

    fn sa_block(&self, x: &Tensor, opts: &EncoderOptions, drop: &Dropout) -> Result<Tensor> {
        let mut a = AttentionOptions::new()
            .with_need_weights(false)
            .with_is_causal(opts.is_causal)
            .with_train(opts.train);
        a.attn_mask = opts.mask.clone();
        a.key_padding_mask = opts.src_key_padding_mask.clone();
        a.dropout_seed = drop.sub_seed("self_attn");
        Ok(self.self_attn.forward(x, x, x, &a)?.output)
    }
}
