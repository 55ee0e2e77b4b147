//! A LoRA run's checkpoint: `lora.json` ([`LoraRecord`]: the adapter's [`LoraSpec`] and the
//! base run it adapts, found by path and verified by the SHA-256 of its weights, never
//! copied), `model.safetensors` holding the adapter alone (our names,
//! `blocks.0.attn.in_proj.lora_A.weight`, …) and `optimizer.safetensors` its moments alone.
//!
//! [`model_weights`] is what every reader of a checkpoint's model calls (export, `eval`,
//! `generate`, a run started from it): a LoRA run's base with the adapter merged in, any other
//! run's own weights.
//!
//! PyTorch equivalent: PEFT's `adapter_config.json` (`base_model_name_or_path`) and
//! `PeftModel.from_pretrained(base, dir)`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle::{DType, Device, Result};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions, StateDict};
use candle_mha::zeroed_var_builder;
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use crate::models::lora::{merge_into, LoraSpec};
use crate::models::{NextTokenPredictor, NextTokenPredictorConfig};
use crate::run_dir::{CONFIG_FILE, LORA_FILE, MODEL_FILE};

/// Largest `lora.json` read (a spec and a path: a few hundred bytes).
const MAX_LORA_RECORD_BYTES: u64 = 1 << 16;

/// What `lora.json` records: the adapter and its base.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraRecord {
    /// The adapter's rank, alpha, dropout and targets (resolved: never empty).
    pub spec: LoraSpec,
    /// The run whose weights the adapter updates.
    pub base: BaseRef,
}

/// A base run: where it is and what its weights hash to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaseRef {
    /// The base run's directory (absolute; a LoRA run moved keeps finding it, a base moved
    /// is an error naming this path).
    pub dir: PathBuf,
    /// The SHA-256 of its `model.safetensors`, hex.
    pub model_sha256: String,
}

fn sha256_of(path: &Path) -> Result<String> {
    // The path comes from an untrusted lora.json: a device or FIFO is refused, not read.
    let file = candle_mha::io::open_input(path)?;
    let (_, hash) = crate::checksum::size_and_sha256(file)
        .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))?;
    Ok(hash)
}

impl LoraRecord {
    /// The record of an adapter `spec` (resolved against `cfg`) on the run in `base`,
    /// hashing its weights now.
    pub fn new(spec: &LoraSpec, cfg: &NextTokenPredictorConfig, base: &Path) -> Result<Self> {
        let dir = std::path::absolute(base)
            .map_err(|e| candle::Error::Msg(format!("LoRA base {}: {e}", base.display())))?;
        if dir.to_str().is_none() {
            candle::bail!(
                "LoRA base {}: its path is not UTF-8 and cannot be recorded in {LORA_FILE}",
                dir.display()
            )
        }
        Ok(Self {
            spec: spec.resolved(cfg)?,
            base: BaseRef {
                model_sha256: sha256_of(&dir.join(MODEL_FILE))?,
                dir,
            },
        })
    }

    /// `dir`'s `lora.json` when it has one (a LoRA run), checked: a spec valid for `cfg`
    /// (the run's own `config.json`).
    pub fn load(dir: &Path, cfg: &NextTokenPredictorConfig) -> Result<Option<Self>> {
        let path = dir.join(LORA_FILE);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(None);
        }
        let text = candle_mha::io::read_input_string(&path, MAX_LORA_RECORD_BYTES)?;
        let record: Self = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!("invalid LoRA record {}: {e}", path.display()))
        })?;
        let spec = record
            .spec
            .resolved(cfg)
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))?;
        if spec != record.spec {
            candle::bail!("{}: the LoRA spec names no targets", path.display())
        }
        Ok(Some(record))
    }

    /// The JSON text of `lora.json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The base's weights, after checking that its `config.json` is `cfg` and its
    /// `model.safetensors` hashes to the recorded SHA-256 (which is what makes the base
    /// trusted: no manifest of its own is needed).
    pub fn base_weights(&self, cfg: &NextTokenPredictorConfig) -> Result<StateDict> {
        let dir = &self.base.dir;
        let gone = |what: &str| {
            candle::Error::Msg(format!(
                "the LoRA run's base {} {what} (the adapter needs the run it was trained on, unchanged, at that path)",
                dir.display()
            ))
        };
        let base_cfg = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))
            .map_err(|e| gone(&format!("cannot be read: {e}")))?;
        if &base_cfg != cfg {
            return Err(gone("has another model configuration"));
        }
        let model = dir.join(MODEL_FILE);
        if sha256_of(&model).map_err(|e| gone(&e.to_string()))? != self.base.model_sha256 {
            return Err(gone(&format!(
                "has other weights: {MODEL_FILE} does not hash to the recorded SHA-256"
            )));
        }
        StateDict::load(model)
    }
}

/// The model's weights of the checkpoint in `dir` (its files already verified by the
/// caller), our names: a LoRA run's base with its adapter merged in (`W + s·B·A`), any other
/// run's `model.safetensors`.
///
/// PyTorch equivalent: `PeftModel.from_pretrained(base, dir).merge_and_unload().state_dict()`.
pub fn model_weights(dir: &Path, cfg: &NextTokenPredictorConfig) -> Result<StateDict> {
    merged_weights(dir, cfg, LoraRecord::load(dir, cfg)?.as_ref())
}

/// [`model_weights`] of the checkpoint in `dir` whose `lora.json` was already read (`lora`).
pub(crate) fn merged_weights(
    dir: &Path,
    cfg: &NextTokenPredictorConfig,
    lora: Option<&LoraRecord>,
) -> Result<StateDict> {
    let own = StateDict::load(dir.join(MODEL_FILE))?;
    match lora {
        Some(record) => merge_into(record.base_weights(cfg)?, &own, cfg, &record.spec)
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", dir.display()))),
        None => Ok(own),
    }
}

/// A model of `cfg` holding `weights` (checked strictly: every parameter present, of its
/// shape, nothing else) as plain tensors, not variables: frozen, no gradient computed for
/// them. Each weight is let go once the model holds it.
pub fn frozen_model(
    cfg: &NextTokenPredictorConfig,
    weights: StateDict,
    dtype: DType,
    device: &Device,
    source: &str,
) -> Result<NextTokenPredictor> {
    let varmap = VarMap::new();
    NextTokenPredictor::new(cfg.clone(), zeroed_var_builder(&varmap, dtype, device))?;
    let opts = LoadOptions::new()
        .with_module("NextTokenPredictor")
        .with_source(source);
    load_into_varmap_owned(&varmap, weights, &opts)?;
    // The variables' storage, detached: the same memory, no longer leading to a gradient.
    let tensors: HashMap<String, candle::Tensor> = varmap
        .data()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().detach()))
        .collect();
    drop(varmap);
    NextTokenPredictor::new(
        cfg.clone(),
        VarBuilder::from_tensors(tensors, dtype, device),
    )
}

impl crate::Trainer {
    /// The run as a LoRA run of `record` (its `lora.json` written with every checkpoint):
    /// the model's adapters are its variables, its base weights plain tensors.
    pub fn with_lora_record(mut self, record: LoraRecord) -> Self {
        self.lora = Some(record);
        self
    }

    /// A LoRA run's record.
    pub fn lora_record(&self) -> Option<&LoraRecord> {
        self.lora.as_ref()
    }
}

/// A new LoRA run's model on the checkpoint `base` (its configuration `cfg` and weights):
/// the base frozen, adapters of `spec` drawn from `seed` as PEFT initialises them (B zeros:
/// step 0 is the base exactly) and the variables they are, and the run's record. Errors when
/// `base` is itself a LoRA run (adapt its merged export instead).
pub(crate) fn start_model(
    base: &super::Checkpoint,
    weights: StateDict,
    spec: &LoraSpec,
    (dtype, device, seed): (DType, &Device, u64),
) -> Result<(NextTokenPredictor, VarMap, LoraRecord)> {
    if base.lora.is_some() {
        candle::bail!(
            "{} is a LoRA run: a LoRA run adapts a run of full weights (export this one with --format hf and import it, or fine-tune it without LoRA)",
            base.dir.display()
        )
    }
    let cfg = &base.config;
    let record = LoraRecord::new(spec, cfg, &base.dir)?;
    let source = base.weights_file.display().to_string();
    let model = frozen_model(cfg, weights, dtype, device, &source)?;
    let varmap = VarMap::new();
    let vb = candle_mha::seeded_var_builder(&varmap, seed, dtype, device);
    let model = model.with_lora(&record.spec, vb)?;
    Ok((model, varmap, record))
}

/// The model of the run saved in `dir` (configuration `cfg`) and the variables its
/// `model.safetensors` fills (zeros until loaded): a LoRA run's base, verified by hash and
/// frozen, with its adapters as the variables; any other run's every parameter.
///
/// PyTorch equivalent: `PeftModel.from_pretrained(base, dir, is_trainable=True)`.
pub fn resume_model(
    dir: &Path,
    cfg: &NextTokenPredictorConfig,
    dtype: DType,
    device: &Device,
) -> Result<(NextTokenPredictor, VarMap)> {
    let varmap = VarMap::new();
    let vb = zeroed_var_builder(&varmap, dtype, device);
    let model = match LoraRecord::load(dir, cfg)? {
        Some(record) => {
            let base = record.base_weights(cfg)?;
            let source = record.base.dir.join(MODEL_FILE).display().to_string();
            frozen_model(cfg, base, dtype, device, &source)?.with_lora(&record.spec, vb)?
        }
        None => NextTokenPredictor::new(cfg.clone(), vb)?,
    };
    Ok((model, varmap))
}
