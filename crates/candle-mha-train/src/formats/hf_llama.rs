//! Hugging Face Llama-family directories (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
//! `MistralForCausalLM`) in and out: `config.json`, the weights (`model.safetensors` or shards;
//! f32, f16 or bf16) under their own names, `generation_config.json`, the tokenizer.

use std::path::Path;

use candle::{DType, Result, Tensor};
use candle_mha::checkpoint::StateDict;
use serde_json::Value;

use super::gpt2_names::Gpt2Report;
use super::hf_dir::{hugging_face_weights, json};
use super::{codec_for, hugging_face_tokenizer, Imported};
use crate::data::Codec;
use crate::models::llama::{eos_ids, parameter_shapes, LlamaConfig};
use crate::models::{LlamaRecord, NextTokenPredictorConfig};
use crate::run::staged_dir::StagedDir;

/// What a Hugging Face Llama-family directory holds, checked against its `config.json`.
///
/// PyTorch equivalent: what `AutoModelForCausalLM.from_pretrained(dir)` reads.
#[derive(Debug)]
pub struct HfWeights {
    /// The model's configuration.
    pub config: LlamaConfig,
    /// `config.json` as it was (written back by [`write_hf_dir`]).
    pub config_json: Value,
    /// `generation_config.json`, when present.
    pub generation_config: Option<Value>,
    /// The weights under Hugging Face's names, in f32.
    pub weights: StateDict,
    /// Each weight's dtype in the files (the export writes it back in it).
    pub dtypes: Vec<(String, DType)>,
    /// The ids that end generation: `generation_config.json`'s `eos_token_id` (a number or a
    /// list), else `config.json`'s.
    pub eos_token_ids: Vec<u32>,
}

/// Reads a Hugging Face `LlamaForCausalLM` / `Qwen2ForCausalLM` / `MistralForCausalLM`
/// directory: the configuration (what the model cannot honour refused by name), the weights
/// (exactly the model's: missing, extra and misshapen ones named; finite), the end ids.
pub fn read_hf_dir(dir: &Path) -> Result<HfWeights> {
    let at = |e: candle::Error| candle::Error::Msg(format!("{}: {e}", dir.display()));
    let config_json = json(&dir.join("config.json"))?;
    let config = LlamaConfig::from_hf(&config_json).map_err(at)?;
    let generation_config = match dir.join("generation_config.json") {
        p if p.exists() => Some(json(&p)?),
        _ => None,
    };
    let eos_token_ids = match eos_ids(
        generation_config
            .as_ref()
            .and_then(|g| g.get("eos_token_id")),
        "generation_config.json",
    )? {
        Some(ids) => ids,
        None => eos_ids(config_json.get("eos_token_id"), "config.json")?.unwrap_or_default(),
    };
    let sd = hugging_face_weights(dir)?;
    let want = parameter_shapes(&config);
    let wanted: std::collections::HashSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    // Older checkpoints saved the rotary frequencies as buffers; the model recomputes them.
    let is_buffer = |n: &str| n.ends_with(".rotary_emb.inv_freq");
    let extra: Vec<&str> = sd
        .tensors()
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !wanted.contains(n) && !is_buffer(n))
        .collect();
    let missing: Vec<&str> = want
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| sd.get(n).is_none())
        .collect();
    let list = |v: &[&str]| {
        let mut s = v.iter().take(4).copied().collect::<Vec<_>>().join(", ");
        if v.len() > 4 {
            s.push_str(&format!(", … ({} in all)", v.len()));
        }
        s
    };
    if !missing.is_empty() {
        candle::bail!(
            "{}: config.json describes weights the files lack: {}",
            dir.display(),
            list(&missing)
        )
    }
    if !extra.is_empty() {
        let hint = match (
            config.tie_word_embeddings,
            extra.contains(&"lm_head.weight"),
        ) {
            (true, true) => " (tie_word_embeddings is true, yet the files hold lm_head.weight)",
            _ => "",
        };
        candle::bail!(
            "{}: the files hold weights config.json does not describe: {}{hint}",
            dir.display(),
            list(&extra)
        )
    }
    let mut tensors = Vec::with_capacity(want.len());
    let mut dtypes = Vec::with_capacity(want.len());
    for (name, shape) in &want {
        let t = sd.get(name).expect("checked above");
        if t.dims() != shape.as_slice() {
            candle::bail!(
                "{}: {name} has shape {:?}, config.json says {shape:?}",
                dir.display(),
                t.dims()
            )
        }
        match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => {}
            dt => candle::bail!(
                "{}: {name} is {dt:?}; expected f32, f16 or bf16",
                dir.display()
            ),
        }
        let f = t.to_dtype(DType::F32)?;
        if !crate::run::trainer::all_finite(&f)? {
            candle::bail!("{}: {name} holds NaN or infinite values", dir.display())
        }
        dtypes.push((name.clone(), t.dtype()));
        tensors.push((name.clone(), f));
    }
    drop(sd);
    Ok(HfWeights {
        config,
        config_json,
        generation_config,
        weights: StateDict::from_tensors(tensors),
        dtypes,
        eos_token_ids,
    })
}

/// Writes a Hugging Face directory at `dir` (new or empty; written as a unit): `config.json`
/// (`config_json`, or the configuration's own), `generation_config.json` when given, and
/// `model.safetensors` with `weights` (Hugging Face's names) cast to `dtypes` (f32 for a name
/// not listed). A directory read by [`read_hf_dir`] and written back unchanged gives the same
/// `model.safetensors`, byte for byte.
///
/// PyTorch equivalent: `model.save_pretrained(dir)` (one file, `{"format": "pt"}`).
pub fn write_hf_dir(
    dir: &Path,
    config: &LlamaConfig,
    config_json: Option<&Value>,
    generation_config: Option<&Value>,
    weights: &[(String, Tensor)],
    dtypes: &[(String, DType)],
) -> Result<()> {
    let staged = StagedDir::new(dir, "mha export")?;
    write_hf_files(
        staged.path(),
        config,
        config_json,
        generation_config,
        weights,
        dtypes,
    )?;
    staged.finish()
}

/// [`write_hf_dir`]'s files, into the existing directory `dir` (a staged one).
pub(crate) fn write_hf_files(
    dir: &Path,
    config: &LlamaConfig,
    config_json: Option<&Value>,
    generation_config: Option<&Value>,
    weights: &[(String, Tensor)],
    dtypes: &[(String, DType)],
) -> Result<()> {
    config.validate()?;
    let want = parameter_shapes(config);
    if want.len() != weights.len()
        || want
            .iter()
            .zip(weights)
            .any(|((n, s), (m, t))| n != m || s.as_slice() != t.dims())
    {
        candle::bail!(
            "Hugging Face export: the weights are not the {} parameters of the configuration",
            want.len()
        )
    }
    let dtype_of = |name: &str| {
        dtypes
            .iter()
            .find(|(n, _)| n == name)
            .map_or(DType::F32, |(_, d)| *d)
    };
    let tensors = weights
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_dtype(dtype_of(n))?)))
        .collect::<Result<Vec<_>>>()?;
    let config_json = match config_json {
        Some(j) => {
            // The configuration the weights belong to, whatever else the file says.
            if LlamaConfig::from_hf(j)? != *config {
                candle::bail!("Hugging Face export: config.json does not describe the model")
            }
            j.clone()
        }
        None => config.to_hf(),
    };
    let pretty = |v: &Value| -> Result<Vec<u8>> {
        let mut s =
            serde_json::to_string_pretty(v).map_err(|e| candle::Error::Msg(e.to_string()))?;
        s.push('\n');
        Ok(s.into_bytes())
    };
    candle_mha::io::write_atomic(&dir.join("config.json"), &pretty(&config_json)?)?;
    if let Some(g) = generation_config {
        candle_mha::io::write_atomic(&dir.join("generation_config.json"), &pretty(g)?)?;
    }
    StateDict::from_tensors(tensors).save_safetensors(dir.join("model.safetensors"))
}

/// Reads a Hugging Face `LlamaForCausalLM` / `Qwen2ForCausalLM` / `MistralForCausalLM`
/// directory ([`read_hf_dir`]: what the model cannot honour is refused by name) with its
/// `tokenizer.json` (or `tokenizer`); the weights keep Hugging Face's names, and what the export
/// writes back (the source's `config.json`, `generation_config.json`, each weight's dtype) is
/// kept in the run's `config.json`.
pub fn read_llama(dir: &Path, tokenizer: Option<&Path>) -> Result<Imported> {
    let hf = read_hf_dir(dir)?;
    let dtypes = hf
        .dtypes
        .iter()
        .map(|(n, d)| (n.clone(), dtype_name(*d).to_string()))
        .collect();
    let record = LlamaRecord {
        hf_config: hf.config_json,
        generation_config: hf.generation_config,
        dtypes,
    };
    let config = NextTokenPredictorConfig::from_llama(&hf.config, Some(record))?;
    let mut notes = Vec::new();
    let found = hugging_face_tokenizer(dir)?;
    let codec = codec_for(tokenizer, found, config.vocab_size, &mut notes)?;
    let report = Gpt2Report {
        mapped: hf
            .weights
            .tensors()
            .iter()
            .map(|(n, _)| n.clone())
            .collect(),
        ..Gpt2Report::default()
    };
    let source = format!(
        "{} (Hugging Face {})",
        dir.display(),
        hf.config.family.architecture()
    );
    Ok(Imported::hugging_face(
        source, config, hf.weights, codec, report, notes,
    ))
}

/// `"f32"`, `"f16"`, `"bf16"` (what a Llama record stores).
fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Writes the Llama-family run `run` (its configuration `cfg`, `llama` and `record`) into the
/// staged directory `dir` as its Hugging Face class: the source's `config.json` and
/// `generation_config.json`, the weights under their names in their source dtypes
/// ([`write_hf_dir`]'s files), the tokenizer.
pub(super) fn write_export(
    run: &crate::Checkpoint,
    llama: &LlamaConfig,
    record: &LlamaRecord,
    dir: &Path,
) -> Result<()> {
    // The names are Hugging Face's already; each weight goes back in its source dtype.
    let ours = run.weights()?;
    let weights = parameter_shapes(llama)
        .into_iter()
        .map(|(name, _)| match ours.get(&name) {
            Some(t) => Ok((name, t.clone())),
            None => candle::bail!("{}: model.safetensors lacks {name}", run.dir.display()),
        })
        .collect::<Result<Vec<_>>>()?;
    let dtypes: Vec<(String, DType)> = record
        .dtypes
        .iter()
        .map(|(n, d)| {
            let d = match d.as_str() {
                "f16" => DType::F16,
                "bf16" => DType::BF16,
                _ => DType::F32,
            };
            (n.clone(), d)
        })
        .collect();
    write_hf_files(
        dir,
        llama,
        Some(&record.hf_config),
        record.generation_config.as_ref(),
        &weights,
        &dtypes,
    )?;
    if let Codec::Text(_) = run.codec {
        run.codec.save_dir(dir)?;
    }
    Ok(())
}
