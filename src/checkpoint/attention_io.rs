//! Loading and saving [`MultiheadAttention`] modules with PyTorch's state_dict names.

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_nn::VarMap;

use super::discover::InferredAttention;
use super::load::{load_into_varmap, LoadOptions};
use super::report::LoadReport;
use super::state_dict::{normalize_prefix, StateDict};
use crate::attention::MultiheadAttention;
use crate::init::seeded_var_builder;

/// Anything with PyTorch-named parameters: a module or a tree of modules.
///
/// PyTorch equivalent: `nn.Module.named_parameters()`.
pub trait NamedParameters {
    /// Every parameter with its name relative to the module, in PyTorch's order.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;
}

impl NamedParameters for MultiheadAttention {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        MultiheadAttention::named_parameters(self)
    }
}

impl NamedParameters for VarMap {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        // A poisoned lock still holds valid tensors.
        let data = self.data().lock().unwrap_or_else(|p| p.into_inner());
        data.iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    }
}

/// The state_dict of several modules, each under its prefix.
///
/// PyTorch equivalent: `model.state_dict()` of a model holding these modules at these paths.
pub fn state_dict_of(modules: &[(&str, &dyn NamedParameters)]) -> StateDict {
    let tensors = modules.iter().flat_map(|(prefix, module)| {
        let prefix = normalize_prefix(prefix);
        module
            .named_parameters()
            .into_iter()
            .map(move |(n, t)| (format!("{prefix}{n}"), t))
    });
    StateDict::from_tensors(tensors)
}

/// Saves modules at their prefixes to a safetensors file PyTorch loads with
/// `load_state_dict(load_file(path), strict=True)`: PyTorch's names, shapes, contiguous data,
/// `{"format": "pt"}`, written atomically.
///
/// PyTorch equivalent: `safetensors.torch.save_file(model.state_dict(), path, {"format": "pt"})`.
pub fn save_modules(
    path: impl AsRef<Path>,
    modules: &[(&str, &dyn NamedParameters)],
) -> Result<()> {
    state_dict_of(modules).save_safetensors(path)
}

/// What the checkpoint cannot tell about an attention module, and how strictly to load it.
///
/// PyTorch equivalent: the constructor arguments that are not stored in the state_dict, and
/// `load_state_dict`'s `strict`.
#[derive(Clone, Debug)]
pub struct AttentionLoadOptions {
    /// Number of heads (not stored in a state_dict).
    pub num_heads: usize,
    /// `batch_first` layout. Default `false`.
    pub batch_first: bool,
    /// `add_zero_attn`. Default `false`.
    pub add_zero_attn: bool,
    /// Dropout on the weights. Default `0.0`.
    pub dropout: f64,
    /// Fail on missing or unexpected keys under the prefix. Default `true`.
    pub strict: bool,
}

impl AttentionLoadOptions {
    /// PyTorch's defaults with `num_heads`, strict.
    pub fn new(num_heads: usize) -> Self {
        Self {
            num_heads,
            batch_first: false,
            add_zero_attn: false,
            dropout: 0.0,
            strict: true,
        }
    }
}

crate::setters! {
    AttentionLoadOptions {
        with_batch_first(batch_first: bool);
        with_add_zero_attn(add_zero_attn: bool);
        with_dropout(dropout: f64);
        with_strict(strict: bool);
    }
}

/// A module loaded from a checkpoint, its trainable variables and the load report.
pub struct LoadedAttention {
    /// The module.
    pub module: MultiheadAttention,
    /// Its parameters as trainable variables (names relative to the module).
    pub varmap: VarMap,
    /// What matched.
    pub report: LoadReport,
}

/// Loads the attention module at `prefix` of `state_dict` in `dtype` on `device`, inferring
/// `embed_dim`, `kdim`, `vdim`, `bias` and `add_bias_kv` from the tensors.
///
/// PyTorch equivalent: `mha = nn.MultiheadAttention(E, H, …); mha.load_state_dict({k[len(prefix):]: v
/// for k, v in sd.items() if k.startswith(prefix)}, strict=True)`.
pub fn load_attention(
    state_dict: &StateDict,
    prefix: &str,
    opts: &AttentionLoadOptions,
    dtype: DType,
    device: &Device,
) -> Result<LoadedAttention> {
    // A tensor of the module that the file holds but the reader could not represent: say so,
    // rather than report it missing.
    let under = super::normalize_prefix(prefix);
    if let Some((name, why)) = state_dict
        .skipped()
        .iter()
        .find(|(n, _)| n.starts_with(&under))
    {
        candle::bail!("attention module at \"{prefix}\": {name} cannot be read: {why}")
    }
    let inferred = InferredAttention::infer(state_dict, prefix)?;
    let config = inferred
        .config(opts.num_heads)
        .with_batch_first(opts.batch_first)
        .with_add_zero_attn(opts.add_zero_attn)
        .with_dropout(opts.dropout);
    config.validate().map_err(|e| {
        candle::Error::Msg(format!(
            "attention module at \"{}\": {e} (valid num_heads: {:?})",
            inferred.prefix,
            inferred.possible_num_heads()
        ))
    })?;
    let varmap = VarMap::new();
    let module = MultiheadAttention::new(config, seeded_var_builder(&varmap, 0, dtype, device))?;
    let load = LoadOptions::new()
        .with_prefix(&inferred.prefix)
        .with_strict(opts.strict)
        .with_module("MultiheadAttention")
        .with_source(state_dict.source());
    let report = load_into_varmap(&varmap, state_dict, &load)?;
    Ok(LoadedAttention {
        module,
        varmap,
        report,
    })
}

/// [`load_attention`] from a checkpoint file (safetensors or PyTorch pickle).
pub fn load_attention_file(
    path: impl AsRef<Path>,
    prefix: &str,
    opts: &AttentionLoadOptions,
    dtype: DType,
    device: &Device,
) -> Result<LoadedAttention> {
    let path = path.as_ref();
    let sd = StateDict::load(path)?.with_metadata("source", &path.display().to_string());
    load_attention(&sd, prefix, opts, dtype, device)
}
