//! Hugging Face's `GPT2LMHeadModel` directories, read and written: `config.json` (GPT-2's keys
//! for our configuration), the weights under GPT-2's names (`Conv1D` layout,
//! [`gpt2_names`](super::gpt2_names)), the tokenizer.

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::StateDict;

use super::gpt2_names::{from_gpt2, nanogpt_parameters, to_gpt2, Gpt2Format};
use super::hf_dir::{hugging_face_weights, json};
use super::{codec_for, hugging_face_tokenizer, Imported};
use crate::data::Codec;
use crate::models::{Gelu, NextTokenPredictorConfig};

/// Reads a Hugging Face `GPT2LMHeadModel` directory (a Llama-family one goes to
/// [`read_llama`](super::read_llama)): `config.json`, the weights (`Conv1D`
/// transposed, buffers skipped), `tokenizer.json` when present (or `tokenizer`).
pub fn read_hugging_face(dir: &Path, tokenizer: Option<&Path>) -> Result<Imported> {
    let config_json = json(&dir.join("config.json"))?;
    let model_type = config_json.get("model_type").and_then(|v| v.as_str());
    if matches!(model_type, Some("llama" | "qwen2" | "mistral")) {
        return super::hf_llama::read_llama(dir, tokenizer);
    }
    let config = config_from_hf(&config_json)?;
    let sd = hugging_face_weights(dir)?;
    let (weights, report) = from_gpt2(&sd, Gpt2Format::HuggingFace, &config)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", dir.display())))?;
    let mut notes = Vec::new();
    let found = hugging_face_tokenizer(dir)?;
    let codec = codec_for(tokenizer, found, config.vocab_size, &mut notes)?;
    let source = format!("{} (Hugging Face GPT-2)", dir.display());
    Ok(Imported::hugging_face(
        source, config, weights, codec, report, notes,
    ))
}

/// Writes the model of the run (or checkpoint) directory `run` (its configuration `cfg`) into
/// the staged directory `dir` as a Hugging Face GPT-2 directory: `config.json`
/// ([`config_to_hf`]), `model.safetensors` (GPT-2's names, `Conv1D` weights stored `(in, out)`, the tied head left to `tie_word_embeddings`
/// as `save_pretrained` does; an untied one written as `lm_head.weight`) and the run's
/// `tokenizer.json` when it has one. A model without biases (nanoGPT's `bias=False`) is
/// written with zero biases, which GPT-2 always has: the same function, exactly. Errors,
/// before anything is written, for a model with an untied head that has a bias (GPT-2's
/// `lm_head` has none).
///
/// PyTorch equivalent: `model.save_pretrained(out)`.
pub(super) fn write_export(run: &crate::Checkpoint, dir: &Path) -> Result<()> {
    let cfg = &run.config;
    if cfg.head_has_bias() {
        candle::bail!(
            "{}: the model's head is not tied to the token embedding and has a bias (a run made before heads lost theirs by default); GPT2LMHeadModel's lm_head has none",
            run.dir.display()
        )
    }
    let ours = run.weights()?;
    let theirs = to_gpt2(&ours, Gpt2Format::HuggingFace, cfg)?;
    // GPT-2 has a bias in every Conv1D and LayerNorm: zeros add nothing.
    let with_biases = NextTokenPredictorConfig {
        bias: true,
        ..cfg.clone()
    };
    let zero_biases = match cfg.bias {
        true => Vec::new(),
        false => nanogpt_parameters(&with_biases)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".bias"))
            .map(|(name, shape)| Ok((name, Tensor::zeros(shape, DType::F32, &Device::Cpu)?)))
            .collect::<Result<Vec<_>>>()?,
    };
    let weights = StateDict::from_tensors(
        theirs
            .tensors()
            .iter()
            .filter(|(n, _)| !cfg.tie_embeddings || n != "lm_head.weight")
            .cloned()
            .chain(zero_biases),
    );
    let mut config = config_to_hf(cfg);
    let codec = &run.codec;
    // Written even when unknown (null): GPT2Config's defaults (50256) lie outside a smaller
    // vocabulary, which transformers warns about.
    config["bos_token_id"] = codec.bos_id().into();
    config["eos_token_id"] = codec.eos_id().into();
    let config = serde_json::to_string_pretty(&config)
        .map_err(|e| candle::Error::Msg(format!("serializing config.json: {e}")))?;
    candle_mha::io::write_atomic(&dir.join("config.json"), config.as_bytes())?;
    weights.save_safetensors(dir.join("model.safetensors"))?;
    if let Codec::Text(_) = codec {
        codec.save_dir(dir)?;
    }
    Ok(())
}

/// Our configuration of a Hugging Face GPT-2 `config.json` (`model_type` `gpt2`): `n_embd`,
/// `n_head`, `n_layer`, `n_positions`, `vocab_size`, `n_inner` (default `4 n_embd`),
/// `activation_function` (`gelu_new`, `gelu_pytorch_tanh` or `gelu`), `layer_norm_epsilon`,
/// the three dropouts and `tie_word_embeddings`. Options this model cannot honour
/// (`scale_attn_by_inverse_layer_idx`, `reorder_and_upcast_attn`, `scale_attn_weights: false`,
/// cross-attention, another activation) are refused by name.
///
/// PyTorch equivalent: `transformers.GPT2Config.from_pretrained(dir)`.
pub fn config_from_hf(json: &serde_json::Value) -> Result<NextTokenPredictorConfig> {
    let field = |k: &str| json.get(k).filter(|v| !v.is_null());
    let count = |k: &str| -> Result<usize> {
        field(k)
            .and_then(|v| v.as_u64())
            .map(|n| n as usize)
            .ok_or_else(|| candle::Error::Msg(format!("config.json: {k} must be a whole number")))
    };
    let rate = |k: &str| field(k).and_then(|v| v.as_f64()).unwrap_or(0.1);
    let flag = |k: &str, default: bool| field(k).and_then(|v| v.as_bool()).unwrap_or(default);
    match field("model_type") {
        Some(v) if v.as_str() == Some("gpt2") => {}
        Some(other) => {
            candle::bail!("config.json: model_type {other} is not supported; expected \"gpt2\" (GPT2LMHeadModel), \"llama\", \"qwen2\" or \"mistral\"")
        }
        None => candle::bail!("config.json: no model_type; expected \"gpt2\" (GPT2LMHeadModel)"),
    }
    for (key, ok) in [
        (
            "scale_attn_by_inverse_layer_idx",
            !flag("scale_attn_by_inverse_layer_idx", false),
        ),
        (
            "reorder_and_upcast_attn",
            !flag("reorder_and_upcast_attn", false),
        ),
        ("scale_attn_weights", flag("scale_attn_weights", true)),
        ("add_cross_attention", !flag("add_cross_attention", false)),
    ] {
        if !ok {
            candle::bail!("config.json: {key} = {} is not supported (this model scales attention by 1/sqrt(head_dim), in the query's dtype, with no cross-attention)", json[key])
        }
    }
    let gelu = match field("activation_function").and_then(|v| v.as_str()) {
        None | Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => Gelu::Tanh,
        Some("gelu") => Gelu::Exact,
        Some(other) => candle::bail!(
            "config.json: activation_function {} is not supported; expected gelu_new, gelu_pytorch_tanh or gelu",
            candle_mha::io::quoted(other, 40)
        ),
    };
    let e = count("n_embd")?;
    let tied = flag("tie_word_embeddings", true);
    let cfg = NextTokenPredictorConfig {
        vocab_size: count("vocab_size")?,
        max_len: count("n_positions")?,
        embed_dim: e,
        num_heads: count("n_head")?,
        num_layers: count("n_layer")?,
        ff_dim: match field("n_inner") {
            None => 4 * e,
            Some(_) => count("n_inner")?,
        },
        dropout: rate("attn_pdrop"),
        resid_dropout: rate("resid_pdrop"),
        embed_dropout: Some(rate("embd_pdrop")),
        bias: true,
        tie_embeddings: tied,
        // GPT-2's lm_head has no bias; it is a parameter of its own only when untied.
        head_bias: (!tied).then_some(false),
        gelu,
        layer_norm_eps: field("layer_norm_epsilon")
            .and_then(|v| v.as_f64())
            .unwrap_or(1e-5),
        llama: None,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// A Hugging Face GPT-2 `config.json` for `cfg` (the inverse of [`config_from_hf`]).
pub fn config_to_hf(cfg: &NextTokenPredictorConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_len,
        "n_embd": cfg.embed_dim,
        "n_head": cfg.num_heads,
        "n_layer": cfg.num_layers,
        "n_inner": cfg.ff_dim,
        "activation_function": match cfg.gelu {
            Gelu::Tanh => "gelu_new",
            Gelu::Exact => "gelu",
        },
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "attn_pdrop": cfg.dropout,
        "resid_pdrop": cfg.resid_dropout,
        "embd_pdrop": cfg.embed_dropout.unwrap_or(cfg.resid_dropout),
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
    })
}
