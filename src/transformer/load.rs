//! Loading PyTorch's Transformer layers, stacks and whole `nn.Transformer`s from a state_dict
//! or a checkpoint file, inferring their sizes from the tensors.
//!
//! Every loader returns the module and its [`LoadReport`]. The module is trainable: its
//! `named_parameters()` are candle variables, which `Var::from_tensor` hands to an optimizer
//! without copying.
//!
//! It lives in `transformer` (above `checkpoint`, whose state_dicts, reports and size inference it
//! uses), as `load_attention` lives in `checkpoint` above `attention`.

use std::path::Path;

use candle::{DType, Device, Result};
use candle_nn::{VarBuilder, VarMap};

use super::{
    Activation, FinalNorm, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
    TransformerEncoderLayerConfig,
};
use crate::checkpoint::{
    load_into_varmap, normalize_prefix, InferredTransformer, InferredTransformerLayer,
    InferredTransformerStack, LoadOptions, LoadReport, StateDict,
};
use crate::init::seeded_var_builder;

/// What a checkpoint cannot tell about a Transformer model, and how strictly to load it.
///
/// The sizes (`d_model`, `dim_feedforward`, the number of layers), `bias` and whether the
/// stacks end in a layer norm come from the tensors; the rest from here, with PyTorch's
/// defaults.
///
/// PyTorch equivalent: the constructor arguments of `nn.TransformerEncoderLayer` & co. that are
/// not stored in the state_dict, and `load_state_dict`'s `strict`.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerLoadOptions {
    /// Attention heads (not stored in a state_dict); must divide `d_model`.
    pub nhead: usize,
    /// Feed-forward activation. Default [`Activation::Relu`].
    pub activation: Activation,
    /// Pre-norm layers. Default `false`.
    pub norm_first: bool,
    /// `(N, L, E)` inputs. Default `false`.
    pub batch_first: bool,
    /// `eps` of the layer norms. Default 1e-5.
    pub layer_norm_eps: f64,
    /// Dropout probability (used in training mode only). Default 0.1.
    pub dropout: f64,
    /// Fail on missing or unexpected keys under the prefix, or a size mismatch. Default `true`.
    pub strict: bool,
}

impl TransformerLoadOptions {
    /// PyTorch's defaults with `nhead`, strict.
    pub fn new(nhead: usize) -> Self {
        Self {
            nhead,
            activation: Activation::Relu,
            norm_first: false,
            batch_first: false,
            layer_norm_eps: 1e-5,
            dropout: 0.1,
            strict: true,
        }
    }

    /// The layer config for what the tensors told, after checking `nhead` (an encoder's; a
    /// decoder layer takes the same arguments, through `into()`).
    fn layer(&self, l: &InferredTransformerLayer) -> Result<TransformerEncoderLayerConfig> {
        self.check_nhead(l)?;
        Ok(TransformerEncoderLayerConfig {
            dim_feedforward: l.dim_feedforward,
            dropout: self.dropout,
            activation: self.activation,
            layer_norm_eps: self.layer_norm_eps,
            batch_first: self.batch_first,
            norm_first: self.norm_first,
            bias: l.bias,
            ..TransformerEncoderLayerConfig::new(l.d_model, self.nhead)
        })
    }

    fn check_nhead(&self, l: &InferredTransformerLayer) -> Result<()> {
        if self.nhead == 0 || !l.d_model.is_multiple_of(self.nhead) {
            candle::bail!(
                "Transformer layer at \"{}\": nhead = {} does not divide d_model = {} (from {}self_attn.in_proj_weight); valid nhead: {:?}",
                l.prefix,
                self.nhead,
                l.d_model,
                l.prefix,
                l.possible_nhead()
            )
        }
        Ok(())
    }
}

crate::setters! {
    TransformerLoadOptions {
        with_activation(activation: Activation);
        with_norm_first(norm_first: bool);
        with_batch_first(batch_first: bool);
        with_layer_norm_eps(layer_norm_eps: f64);
        with_dropout(dropout: f64);
        with_strict(strict: bool);
    }
}

/// A Transformer module loaded from a PyTorch state_dict, its sizes (`d_model`,
/// `dim_feedforward`, `bias`, the number of layers) inferred from the tensors and the rest
/// taken from [`TransformerLoadOptions`]. Implemented by [`TransformerEncoderLayer`],
/// [`TransformerDecoderLayer`], [`TransformerEncoder`], [`TransformerDecoder`] and
/// [`Transformer`].
///
/// PyTorch equivalent: constructing the module, then `load_state_dict` with the keys under
/// `prefix`.
pub trait LoadTransformer: Sized {
    /// PyTorch's class name, as reports and errors say it.
    const MODULE: &'static str;

    /// A fresh module sized for what `state_dict` holds at `prefix`, its variables made
    /// through `vb` (the loaders then fill them from the checkpoint).
    ///
    /// PyTorch equivalent: the module's constructor with the sizes read off the tensors.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self>;

    /// Loads the module at `prefix` of `state_dict` in `dtype` on `device`; strict unless
    /// `opts.strict` is false (the report lists what did not match).
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| Self::build(state_dict, prefix, opts, vb),
        )
    }

    /// [`load`](Self::load) from a checkpoint file: safetensors, or a `torch.save` pickle (a
    /// state_dict, one nested under `state_dict`/`model`, or a whole pickled module).
    fn load_file(
        path: impl AsRef<Path>,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let path = path.as_ref();
        let sd = StateDict::load(path)?.with_metadata("source", &path.display().to_string());
        Self::load(&sd, prefix, opts, dtype, device)
    }
}

/// Builds a module into a fresh `VarMap` and loads its parameters from `state_dict` at
/// `prefix`.
fn load_module<M>(
    state_dict: &StateDict,
    prefix: &str,
    module: &str,
    strict: bool,
    dtype: DType,
    device: &Device,
    build: impl FnOnce(VarBuilder) -> Result<M>,
) -> Result<(M, LoadReport)> {
    let under = normalize_prefix(prefix);
    // A tensor of the module that the file holds but the reader could not represent: say so,
    // rather than report it missing.
    if let Some((name, why)) = state_dict
        .skipped()
        .iter()
        .find(|(n, _)| n.starts_with(&under))
    {
        candle::bail!("{module} at \"{under}\": {name} cannot be read: {why}")
    }
    let varmap = VarMap::new();
    let m = build(seeded_var_builder(&varmap, 0, dtype, device))?;
    // Loaded leniently, so that a strict failure can say which loader the keys fit; the
    // module is dropped on that error, so nothing reaches the caller.
    let load = LoadOptions::new()
        .with_prefix(&under)
        .with_strict(false)
        .with_module(module)
        .with_source(state_dict.source());
    let report = load_into_varmap(&varmap, state_dict, &load)?;
    if strict && !report.is_clean() {
        return Err(report.strict_error(&other_loader_hint(module, &report)));
    }
    Ok((m, report))
}

/// The stack's end as the checkpoint has it (whether it holds `norm.*`).
fn final_norm(present: bool) -> FinalNorm {
    match present {
        true => FinalNorm::LayerNorm,
        false => FinalNorm::None,
    }
}

/// A sentence naming the loader whose module the keys of a failed load fit, when they fit
/// another one: a decoder's keys (`multihead_attn.*`) given to an encoder loader, the reverse,
/// or a stack's (`layers.N.*`) given to a layer loader.
fn other_loader_hint(module: &str, report: &LoadReport) -> String {
    // Names relative to the module (the unexpected ones carry the checkpoint's prefix).
    let has = |keys: &[String], part: &str| {
        keys.iter()
            .any(|k| k.strip_prefix(&report.prefix).unwrap_or(k).contains(part))
    };
    let stack = has(&report.unexpected, "layers.");
    let fits = match module {
        "TransformerEncoderLayer" | "TransformerEncoder"
            if has(&report.unexpected, "multihead_attn.") =>
        {
            Some(if stack {
                "TransformerDecoder::load"
            } else {
                "TransformerDecoderLayer::load"
            })
        }
        "TransformerDecoderLayer" | "TransformerDecoder"
            if has(&report.missing, "multihead_attn.")
                && !has(&report.unexpected, "multihead_attn.") =>
        {
            Some(if stack || module == "TransformerDecoder" {
                "TransformerEncoder::load"
            } else {
                "TransformerEncoderLayer::load"
            })
        }
        "TransformerEncoderLayer" if stack => Some("TransformerEncoder::load"),
        "TransformerDecoderLayer" if stack => Some("TransformerDecoder::load"),
        _ => None,
    };
    match fits {
        Some(loader) => format!(" The keys fit another module: load them with {loader}."),
        None => String::new(),
    }
}

impl LoadTransformer for TransformerEncoderLayer {
    const MODULE: &'static str = "TransformerEncoderLayer";

    /// Infers `d_model`, `dim_feedforward` and `bias` from the tensors.
    ///
    /// PyTorch equivalent: `nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, …)`.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self> {
        let layer = InferredTransformerLayer::infer(state_dict, prefix)?;
        Self::new(opts.layer(&layer)?, vb)
    }
}

impl LoadTransformer for TransformerDecoderLayer {
    const MODULE: &'static str = "TransformerDecoderLayer";

    /// Infers `d_model`, `dim_feedforward` and `bias` from the tensors.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward, …)`.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self> {
        let layer = InferredTransformerLayer::infer(state_dict, prefix)?;
        Self::new(opts.layer(&layer)?, vb)
    }
}

impl LoadTransformer for TransformerEncoder {
    const MODULE: &'static str = "TransformerEncoder";

    /// Infers the layer sizes, `bias`, the number of layers (`layers.N.*`) and whether the
    /// stack ends in a layer norm (`norm.*`) from the tensors.
    ///
    /// PyTorch equivalent: `nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, nhead, …),
    /// num_layers, norm)`.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self> {
        let s = InferredTransformerStack::infer(state_dict, prefix)?;
        Self::new(
            opts.layer(&s.layer)?,
            s.num_layers,
            final_norm(s.final_norm),
            vb,
        )
    }
}

impl LoadTransformer for TransformerDecoder {
    const MODULE: &'static str = "TransformerDecoder";

    /// Infers its sizes as [`TransformerEncoder`]'s loader does.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoder(nn.TransformerDecoderLayer(d_model, nhead, …),
    /// num_layers, norm)`.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self> {
        let s = InferredTransformerStack::infer(state_dict, prefix)?;
        Self::new(
            opts.layer(&s.layer)?,
            s.num_layers,
            final_norm(s.final_norm),
            vb,
        )
    }
}

impl LoadTransformer for Transformer {
    const MODULE: &'static str = "Transformer";

    /// Infers `d_model`, `dim_feedforward`, `bias` and the numbers of layers (`encoder.*`,
    /// `decoder.*`) from the tensors.
    ///
    /// PyTorch equivalent: `nn.Transformer(d_model, nhead, num_encoder_layers,
    /// num_decoder_layers, dim_feedforward, …)`.
    fn build(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        vb: VarBuilder,
    ) -> Result<Self> {
        let t = InferredTransformer::infer(state_dict, prefix)?;
        let cfg = TransformerConfig {
            num_encoder_layers: t.encoder.num_layers,
            num_decoder_layers: t.decoder.num_layers,
            ..TransformerConfig::from_layer(&opts.layer(&t.encoder.layer)?)
        };
        Self::new(cfg, vb)
    }
}
