//! Hugging Face Llama-family directories in and out: `config.json`, the weights
//! (`model.safetensors` or shards; f32, f16 or bf16), `generation_config.json`.

use std::path::Path;

use candle::{DType, Result, Tensor};
use candle_mha::checkpoint::StateDict;
use serde_json::Value;

use super::LlamaConfig;
use crate::models::hf_dir::{hugging_face_weights, json};
use crate::staged_dir::StagedDir;

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

/// Every parameter of a model of `cfg`: Hugging Face's name and shape, in the model's order.
pub fn parameter_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (v, e, i) = (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, e])];
    for l in 0..cfg.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        out.push((p("input_layernorm.weight"), vec![e]));
        for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            out.push((p(&format!("self_attn.{name}.weight")), vec![rows, e]));
            if cfg.qkv_bias {
                out.push((p(&format!("self_attn.{name}.bias")), vec![rows]));
            }
        }
        out.push((p("self_attn.o_proj.weight"), vec![e, q]));
        if cfg.o_bias {
            out.push((p("self_attn.o_proj.bias"), vec![e]));
        }
        out.push((p("post_attention_layernorm.weight"), vec![e]));
        out.push((p("mlp.gate_proj.weight"), vec![i, e]));
        out.push((p("mlp.up_proj.weight"), vec![i, e]));
        out.push((p("mlp.down_proj.weight"), vec![e, i]));
    }
    out.push(("model.norm.weight".to_string(), vec![e]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, e]));
    }
    out
}

pub(crate) fn eos_ids(v: Option<&Value>, what: &str) -> Result<Option<Vec<u32>>> {
    let one = |x: &Value| -> Result<u32> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                candle::Error::Msg(format!("{what}: eos_token_id {x} is not a token id"))
            })
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() <= 1024 => {
            Ok(Some(a.iter().map(one).collect::<Result<_>>()?))
        }
        Some(Value::Array(a)) => candle::bail!("{what}: {} eos_token_ids, at most 1024", a.len()),
        Some(x) => Ok(Some(vec![one(x)?])),
    }
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
        if !crate::trainer::all_finite(&f)? {
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
