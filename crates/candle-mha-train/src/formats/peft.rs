//! Hugging Face PEFT's LoRA adapter directory: `adapter_config.json` and
//! `adapter_model.safetensors` (`base_model.model.{module}.lora_A.weight [r, in]`,
//! `….lora_B.weight [out, r]`, with `module` Hugging Face's name: GPT-2's
//! `transformer.h.{i}.attn.c_attn`, Llama's `model.layers.{i}.self_attn.q_proj`), written
//! from a LoRA run ([`export_peft`]) and read into one on its base ([`import_peft`]).
//!
//! PyTorch equivalent: `peft_model.save_pretrained(dir)` and
//! `PeftModel.from_pretrained(base, dir)`.

use std::collections::HashMap;
use std::path::Path;

use candle::{DType, Device, Result};
use candle_mha::checkpoint::{load_into_varmap_owned, CheckpointError, LoadOptions, StateDict};
use serde_json::{json, Value};

use super::hf_dir::json;
use crate::models::lora::{check_adapter, lora_names, LoraSite, LoraSpec};
use crate::run::lora::{frozen_model, LoraRecord};
use crate::run::staged_dir::StagedDir;
use crate::run_dir::MODEL_FILE;
use crate::{TrainConfig, Trainer, Unverified};

/// PEFT's adapter configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's name of an adapter tensor (`A` or `B`) of `site`.
fn peft_name(site: &LoraSite, which: char) -> String {
    format!("base_model.model.{}.lora_{which}.weight", site.hf_module)
}

/// Writes the LoRA run (or checkpoint) `run` into `out` (new or empty, written as a unit)
/// as PEFT's adapter directory, which `PeftModel.from_pretrained(base, out)` loads onto the
/// base run's `--format hf` export. Errors for a run without an adapter.
pub fn export_peft(run: &Path, out: &Path, unverified: Unverified) -> Result<()> {
    let staged = StagedDir::new(out, "mha export")?;
    let ckpt = crate::Checkpoint::open(run, unverified)?;
    let cfg = ckpt.config;
    let Some(record) = ckpt.lora else {
        candle::bail!(
            "{} is not a LoRA run (no lora.json): export its model with --format hf",
            run.display()
        )
    };
    let spec = &record.spec;
    let adapter = StateDict::load(run.join(MODEL_FILE))?;
    let sites = spec.sites(&cfg)?;
    check_adapter(&adapter, &sites, spec.rank)?;
    let mut tensors = Vec::with_capacity(2 * sites.len());
    for site in &sites {
        let (a, b) = lora_names(&site.module);
        for (name, which) in [(a, 'A'), (b, 'B')] {
            // Present: checked above.
            if let Some(t) = adapter.get(&name) {
                tensors.push((peft_name(site, which), t.clone()));
            }
        }
    }
    StateDict::from_tensors(tensors)
        .with_metadata("format", "pt")
        .save_safetensors(staged.path().join(ADAPTER_WEIGHTS_FILE))?;
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": record.base.dir.display().to_string(),
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "use_rslora": spec.use_rslora,
        "target_modules": spec.targets,
        // GPT-2's Conv1D stores its weight (in, out); the adapter is the same either way.
        "fan_in_fan_out": cfg.llama.is_none(),
        "bias": "none",
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
    });
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| candle::Error::Msg(format!("writing {ADAPTER_CONFIG_FILE}: {e}")))?;
    std::fs::write(staged.path().join(ADAPTER_CONFIG_FILE), text).map_err(|e| {
        candle::Error::Msg(format!(
            "writing {ADAPTER_CONFIG_FILE} in {}: {e}",
            out.display()
        ))
    })?;
    staged.finish()
}

/// The spec `adapter_config.json` describes, refusing what a plain LoRA adapter of ours
/// cannot hold (another PEFT method, DoRA, trained biases or modules, per-layer ranks).
fn spec_of(config: &Value, path: &Path) -> Result<LoraSpec> {
    let bad = |what: String| candle::Error::Msg(format!("{}: {what}", path.display()));
    let field = |k: &str| config.get(k).filter(|v| !v.is_null());
    match field("peft_type").and_then(Value::as_str) {
        Some("LORA") => {}
        other => {
            return Err(CheckpointError::Unsupported {
                path: path.to_path_buf(),
                key: "peft_type".into(),
                reason: format!("{other:?}; expected \"LORA\""),
            }
            .into_candle())
        }
    }
    let rank = field("r")
        .and_then(Value::as_u64)
        .and_then(|r| usize::try_from(r).ok())
        .ok_or_else(|| bad("no rank r (a whole number)".into()))?;
    let number = |k: &str, default: f64| match field(k) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| bad(format!("{k} is {v}; expected a number"))),
    };
    let unsupported = |k: &str, ok: &dyn Fn(&Value) -> bool| match field(k) {
        Some(v) if !ok(v) => Err(CheckpointError::Unsupported {
            path: path.to_path_buf(),
            key: k.to_string(),
            reason: format!("{v} is not supported (plain LoRA only)"),
        }
        .into_candle()),
        _ => Ok(()),
    };
    let empty = |v: &Value| {
        v.as_object().is_some_and(|o| o.is_empty()) || v.as_array().is_some_and(|a| a.is_empty())
    };
    unsupported("bias", &|v| v == "none")?;
    unsupported("use_dora", &|v| v == &Value::Bool(false))?;
    unsupported("modules_to_save", &empty)?;
    unsupported("rank_pattern", &empty)?;
    unsupported("alpha_pattern", &empty)?;
    unsupported("layers_to_transform", &empty)?;
    for k in [
        "exclude_modules",
        "trainable_token_indices",
        "target_parameters",
        "layer_replication",
    ] {
        unsupported(k, &empty)?;
    }
    for k in ["lora_bias", "use_qalora"] {
        unsupported(k, &|v| v == &Value::Bool(false))?;
    }
    let targets = match field("target_modules") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("target_modules holds {t}; expected names")))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Value::String(s)) => s.split(',').map(|t| t.trim().to_string()).collect(),
        _ => return Err(bad("no target_modules".into())),
    };
    Ok(LoraSpec {
        rank,
        alpha: number("lora_alpha", 8.0)?,
        dropout: number("lora_dropout", 0.0)?,
        use_rslora: field("use_rslora")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        targets,
    })
}

/// Reads PEFT's adapter directory `dir` (trained elsewhere on the base run's `--format hf`
/// export) into a new LoRA run `out` on the run `base`: its tensors under our names, the
/// spec from `adapter_config.json`, a fresh optimizer at step 0, the base's tokenizer.
/// Errors, naming the file and tensor, for an adapter of other shapes or layers than the
/// base has, or settings a LoRA run cannot hold.
pub fn import_peft(dir: &Path, base: &Path, out: &Path, unverified: Unverified) -> Result<()> {
    let staged = StagedDir::new(out, "mha import")?;
    let base_ckpt = crate::Checkpoint::open(base, unverified)?;
    let cfg = base_ckpt.config.clone();
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let spec = spec_of(&json(&config_path)?, &config_path)?.resolved(&cfg)?;
    let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
    let theirs = StateDict::load(&weights_path)?;
    let sites = spec.sites(&cfg)?;
    let ours_of: HashMap<String, String> = sites
        .iter()
        .flat_map(|s| {
            let (a, b) = lora_names(&s.module);
            [(peft_name(s, 'A'), a), (peft_name(s, 'B'), b)]
        })
        .collect();
    let mut tensors = Vec::with_capacity(theirs.len());
    for (name, t) in theirs.tensors() {
        // A file saved with its adapter's name in it (`lora_A.default.weight`) reads the same.
        let plain = name.replace(".default.weight", ".weight");
        let Some(ours) = ours_of.get(&plain) else {
            candle::bail!(
                "{}: {} is no LoRA tensor of the layers {:?} of this base",
                weights_path.display(),
                candle_mha::io::quoted(name, 120),
                spec.targets
            )
        };
        if !crate::run::trainer::all_finite(t)? {
            candle::bail!(
                "{}: {name} holds NaN or infinite values",
                weights_path.display()
            )
        }
        tensors.push((ours.clone(), t.to_dtype(DType::F32)?));
    }
    let adapter = StateDict::from_tensors(tensors);
    check_adapter(&adapter, &sites, spec.rank)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", weights_path.display())))?;
    if LoraRecord::load(base, &cfg)?.is_some() {
        candle::bail!(
            "{} is a LoRA run; give the run it adapts as --base",
            base.display()
        )
    }
    let record = LoraRecord::new(&spec, &cfg, base)?;
    let (dev, source) = (Device::Cpu, base.join(MODEL_FILE).display().to_string());
    // Hashed just now by the record: read once more, not hashed again.
    let base_weights = StateDict::load(base.join(MODEL_FILE))?;
    let model = frozen_model(&cfg, base_weights, DType::F32, &dev, &source)?;
    let varmap = candle_nn::VarMap::new();
    let vb = candle_mha::zeroed_var_builder(&varmap, DType::F32, &dev);
    let model = model.with_lora(&spec, vb)?;
    let opts = LoadOptions::new()
        .with_module("LoRA adapter")
        .with_source(&weights_path.display().to_string());
    load_into_varmap_owned(&varmap, adapter, &opts)?;
    let train = TrainConfig {
        decay_matrices_only: true,
        ..TrainConfig::for_text()
    };
    let trainer = Trainer::from_imported(model, varmap, train, None, 0, None)?
        .with_codec(base_ckpt.codec.clone())
        .with_lora_record(record);
    trainer.save(staged.path())?;
    staged.finish()
}
