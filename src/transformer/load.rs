//! Loading PyTorch's Transformer layers, stacks and whole `nn.Transformer`s from a state_dict
//! or a checkpoint file, inferring their sizes from the tensors.
//!
//! Every loader returns the module and its [`LoadReport`]. The module is trainable: its
//! `named_parameters()` are candle variables, which `Var::from_tensor` hands to an optimizer
//! without copying.
//!
//! It lives in `nn` (above `checkpoint`, whose state_dicts, reports and size inference it
//! uses), as `load_attention` lives in `checkpoint` above `attention`.

use std::path::Path;

use candle::{DType, Device, Result};
use candle_nn::{VarBuilder, VarMap};

use super::{
    Activation, FinalNorm, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayer, TransformerDecoderLayerConfig, TransformerEncoder,
    TransformerEncoderLayer, TransformerEncoderLayerConfig,
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

    /// The encoder layer config for what the tensors told, after checking `nhead`.
    fn encoder_layer(&self, l: &InferredTransformerLayer) -> Result<TransformerEncoderLayerConfig> {
        self.check_nhead(l)?;
        Ok(TransformerEncoderLayerConfig::new(l.d_model, self.nhead)
            .with_dim_feedforward(l.dim_feedforward)
            .with_dropout(self.dropout)
            .with_activation(self.activation)
            .with_layer_norm_eps(self.layer_norm_eps)
            .with_batch_first(self.batch_first)
            .with_norm_first(self.norm_first)
            .with_bias(l.bias))
    }

    /// The decoder layer config for what the tensors told, after checking `nhead`.
    fn decoder_layer(&self, l: &InferredTransformerLayer) -> Result<TransformerDecoderLayerConfig> {
        self.check_nhead(l)?;
        Ok(TransformerDecoderLayerConfig::new(l.d_model, self.nhead)
            .with_dim_feedforward(l.dim_feedforward)
            .with_dropout(self.dropout)
            .with_activation(self.activation)
            .with_layer_norm_eps(self.layer_norm_eps)
            .with_batch_first(self.batch_first)
            .with_norm_first(self.norm_first)
            .with_bias(l.bias))
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

    /// Loads the module at `prefix` of `state_dict` in `dtype` on `device`; strict unless
    /// `opts.strict` is false (the report lists what did not match).
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)>;

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
        .with_source(
            state_dict
                .metadata()
                .get("source")
                .map(String::as_str)
                .unwrap_or("state_dict"),
        );
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

    /// Loads the encoder layer at `prefix` of `state_dict` in `dtype` on `device`, inferring
    /// `d_model`, `dim_feedforward` and `bias` from the tensors.
    ///
    /// PyTorch equivalent: `layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, …);
    /// layer.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})`.
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let cfg = opts.encoder_layer(&InferredTransformerLayer::infer(state_dict, prefix)?)?;
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| TransformerEncoderLayer::new(cfg, vb),
        )
    }
}

impl LoadTransformer for TransformerDecoderLayer {
    const MODULE: &'static str = "TransformerDecoderLayer";

    /// Loads the decoder layer at `prefix` of `state_dict`, inferring `d_model`,
    /// `dim_feedforward` and `bias` from the tensors.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoderLayer(d_model, nhead, …).load_state_dict(…)`.
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let cfg = opts.decoder_layer(&InferredTransformerLayer::infer(state_dict, prefix)?)?;
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| TransformerDecoderLayer::new(cfg, vb),
        )
    }
}

impl LoadTransformer for TransformerEncoder {
    const MODULE: &'static str = "TransformerEncoder";

    /// Loads the encoder stack at `prefix` (`layers.N.*`, `norm.*`), inferring the layer sizes,
    /// `bias`, the number of layers and whether it has a final norm from the tensors.
    ///
    /// PyTorch equivalent: `nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, nhead, …),
    /// num_layers, norm).load_state_dict(…)`.
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let s = InferredTransformerStack::infer(state_dict, prefix)?;
        let cfg = opts.encoder_layer(&s.layer)?;
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| TransformerEncoder::new(cfg, s.num_layers, final_norm(s.final_norm), vb),
        )
    }
}

impl LoadTransformer for TransformerDecoder {
    const MODULE: &'static str = "TransformerDecoder";

    /// Loads the decoder stack at `prefix` (`layers.N.*`, `norm.*`), inferring its sizes as
    /// [`TransformerEncoder::load`] does.
    ///
    /// PyTorch equivalent: `nn.TransformerDecoder(nn.TransformerDecoderLayer(d_model, nhead, …),
    /// num_layers, norm).load_state_dict(…)`.
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let s = InferredTransformerStack::infer(state_dict, prefix)?;
        let cfg = opts.decoder_layer(&s.layer)?;
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| TransformerDecoder::new(cfg, s.num_layers, final_norm(s.final_norm), vb),
        )
    }
}

impl LoadTransformer for Transformer {
    const MODULE: &'static str = "Transformer";

    /// Loads the whole encoder-decoder model at `prefix` (`encoder.*`, `decoder.*`), inferring
    /// `d_model`, `dim_feedforward`, `bias` and the numbers of layers from the tensors.
    ///
    /// PyTorch equivalent: `nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
    /// dim_feedforward, …).load_state_dict(…)`.
    fn load(
        state_dict: &StateDict,
        prefix: &str,
        opts: &TransformerLoadOptions,
        dtype: DType,
        device: &Device,
    ) -> Result<(Self, LoadReport)> {
        let t = InferredTransformer::infer(state_dict, prefix)?;
        opts.check_nhead(&t.encoder.layer)?;
        let cfg = TransformerConfig::new(t.encoder.layer.d_model, opts.nhead)
            .with_num_encoder_layers(t.encoder.num_layers)
            .with_num_decoder_layers(t.decoder.num_layers)
            .with_dim_feedforward(t.encoder.layer.dim_feedforward)
            .with_dropout(opts.dropout)
            .with_activation(opts.activation)
            .with_layer_norm_eps(opts.layer_norm_eps)
            .with_batch_first(opts.batch_first)
            .with_norm_first(opts.norm_first)
            .with_bias(t.encoder.layer.bias);
        load_module(
            state_dict,
            prefix,
            Self::MODULE,
            opts.strict,
            dtype,
            device,
            |vb| Transformer::new(cfg, vb),
        )
    }
}
