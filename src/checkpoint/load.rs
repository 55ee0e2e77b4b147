//! Loading a [`StateDict`] into the variables of any model tree held in a [`VarMap`].

use candle::{Result, Tensor};
use candle_nn::VarMap;

use super::report::{DtypeCast, LoadReport, ShapeMismatch};
use super::state_dict::{normalize_prefix, StateDict};

/// How [`load_into_varmap`] matches names.
///
/// PyTorch equivalent: the arguments of `module.load_state_dict(state_dict, strict)`, where the
/// module is the submodule at `prefix`.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Where the model's parameters sit in the checkpoint (`"layers.0.self_attn"`); `""` for
    /// the root. Default `""`.
    pub prefix: String,
    /// Fail on any missing key, unexpected key or shape mismatch. Default `true`.
    pub strict: bool,
    /// The model's name in the report. Default `"model"`.
    pub module: String,
    /// Where the state_dict came from, for the report. Default `"state_dict"`.
    pub source: String,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            prefix: String::new(),
            strict: true,
            module: "model".into(),
            source: "state_dict".into(),
        }
    }
}

impl LoadOptions {
    /// Strict loading at the root.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`prefix`](Self::prefix).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// Sets [`strict`](Self::strict).
    pub fn with_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Sets [`module`](Self::module).
    pub fn with_module(mut self, module: &str) -> Self {
        self.module = module.to_string();
        self
    }

    /// Sets [`source`](Self::source).
    pub fn with_source(mut self, source: &str) -> Self {
        self.source = source.to_string();
        self
    }
}

/// Sets every variable of `varmap` from `state_dict` at `opts.prefix`, casting dtypes, and
/// reports what matched. Strict mode changes nothing and returns the report as the error when
/// a key is missing or unexpected or a shape differs; otherwise mismatched variables keep their
/// values.
///
/// The `VarMap` holds the whole model tree with its full names, so this works for one module
/// or a model of many.
///
/// PyTorch equivalent: `model.load_state_dict(state_dict, strict=…)`; unlike PyTorch,
/// non-strict mode skips size mismatches instead of raising.
pub fn load_into_varmap(
    varmap: &VarMap,
    state_dict: &StateDict,
    opts: &LoadOptions,
) -> Result<LoadReport> {
    load_owned(varmap, state_dict.clone(), opts)
}

/// [`load_into_varmap`] that takes the state_dict and lets go of each tensor once its
/// variable holds it. With a model built by [`crate::zeroed_var_builder`] (whose variables take
/// no memory until written) a checkpoint loads in about the model's size plus its largest
/// tensor, not twice the model's size. The same checks and report; nothing is written unless
/// they pass.
///
/// PyTorch equivalent: `model.load_state_dict(torch.load(path, mmap=True), assign=True)`.
pub fn load_into_varmap_owned(
    varmap: &VarMap,
    state_dict: StateDict,
    opts: &LoadOptions,
) -> Result<LoadReport> {
    load_owned(varmap, state_dict, opts)
}

fn load_owned(varmap: &VarMap, state_dict: StateDict, opts: &LoadOptions) -> Result<LoadReport> {
    let prefix = normalize_prefix(&opts.prefix);
    let stored = state_dict.under(&prefix);
    drop(state_dict);
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle::Error::Msg("the VarMap's lock is poisoned".into()))?;
    // Natural name order, for a stable report.
    let model_order =
        StateDict::from_tensors(data.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())));

    let mut report = LoadReport {
        module: opts.module.clone(),
        source: opts.source.clone(),
        prefix: prefix.clone(),
        ..LoadReport::default()
    };
    let mut updates: Vec<(String, Tensor)> = Vec::new();
    for (name, var) in model_order.tensors() {
        let Some(value) = stored.get(name) else {
            report.missing.push(name.clone());
            continue;
        };
        if value.dims() != var.dims() {
            report.shape_mismatches.push(ShapeMismatch {
                name: name.clone(),
                checkpoint: value.dims().to_vec(),
                model: var.dims().to_vec(),
            });
            continue;
        }
        if value.dtype().is_float() != var.dtype().is_float() {
            // An integer tensor where a float parameter belongs (or the reverse) is not a
            // precision change but the wrong tensor: never cast it.
            report.dtype_mismatches.push(DtypeCast {
                name: name.clone(),
                from: value.dtype(),
                to: var.dtype(),
            });
            continue;
        }
        if value.dtype() != var.dtype() {
            report.casts.push(DtypeCast {
                name: name.clone(),
                from: value.dtype(),
                to: var.dtype(),
            });
        }
        updates.push((
            name.clone(),
            super::cast(value, var.dtype())?.to_device(var.device())?,
        ));
        report.loaded.push(name.clone());
    }
    report.unexpected = stored
        .tensors()
        .iter()
        .filter(|(n, _)| !data.contains_key(n))
        .map(|(n, _)| format!("{prefix}{n}"))
        .collect();
    // From here on `updates` holds the only references the loader keeps: each tensor is freed
    // once its variable holds it (when the caller gave its state_dict away).
    drop(stored);
    if opts.strict && !report.is_clean() {
        return Err(report.strict_error(""));
    }
    for (name, value) in updates {
        data[&name].set(&value)?;
    }
    Ok(report)
}
