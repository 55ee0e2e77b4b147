//! [`LlamaConfig`]: a Llama-family model's hyper-parameters, read from and written back to
//! Hugging Face's `config.json` (`model_type` `llama`, `qwen2` or `mistral`).

use candle::Result;
use candle_mha::nn::RopeScaling;
use serde_json::{Map, Value};

use crate::limits::{check_range, MAX_CONTEXT, MAX_DIM, MAX_LAYERS, MAX_VOCAB};

/// Which transformers class a [`LlamaConfig`] came from (and is written back as).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaFamily {
    /// `LlamaForCausalLM` (`model_type` `llama`): SmolLM2, TinyLlama, Llama 2/3.
    Llama,
    /// `Qwen2ForCausalLM`: a bias on q, k and v only.
    Qwen2,
    /// `MistralForCausalLM`: no biases, an optional sliding window.
    Mistral,
}

impl LlamaFamily {
    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "llama",
            LlamaFamily::Qwen2 => "qwen2",
            LlamaFamily::Mistral => "mistral",
        }
    }

    /// `config.json`'s `architectures[0]`.
    pub fn architecture(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "LlamaForCausalLM",
            LlamaFamily::Qwen2 => "Qwen2ForCausalLM",
            LlamaFamily::Mistral => "MistralForCausalLM",
        }
    }
}

/// Hyper-parameters of a [`Llama`](super::Llama) model.
///
/// PyTorch equivalent: transformers' `LlamaConfig` / `Qwen2Config` / `MistralConfig`, the keys
/// the model computes with; [`from_hf`](Self::from_hf) refuses by name what it cannot honour.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The transformers class.
    pub family: LlamaFamily,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size` `E`.
    pub hidden_size: usize,
    /// `intermediate_size`: the SwiGLU's hidden width.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads` `H`.
    pub num_heads: usize,
    /// `num_key_value_heads` (a divisor of `H`; `H` when absent).
    pub num_kv_heads: usize,
    /// `head_dim` (`E / H` when absent).
    pub head_dim: usize,
    /// `max_position_embeddings`: the longest context.
    pub max_position_embeddings: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rope_scaling` / `rope_parameters`' type.
    pub rope_scaling: RopeScaling,
    /// A bias on the q, k and v projections (Llama's `attention_bias`; always for Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`; never for Qwen2).
    pub o_bias: bool,
    /// `tie_word_embeddings`: the head is the token embedding.
    pub tie_word_embeddings: bool,
}

fn get<'a>(j: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    j.get(key).filter(|v| !v.is_null())
}

fn int(j: &Map<String, Value>, key: &str, lo: usize, hi: usize) -> Result<usize> {
    let v =
        get(j, key).ok_or_else(|| candle::Error::Msg(format!("config.json: {key} is missing")))?;
    let n = v.as_u64().ok_or_else(|| {
        candle::Error::Msg(format!(
            "config.json: {key} must be a whole number, got {v}"
        ))
    })?;
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    check_range(&format!("config.json: {key}"), n, lo, hi)?;
    Ok(n)
}

fn float(j: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match get(j, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => candle::bail!("config.json: {key} must be a finite number, got {v}"),
        },
    }
}

fn flag(j: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    match get(j, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => candle::bail!("config.json: {key} must be true or false, got {v}"),
    }
}

/// `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (earlier files).
fn rope(j: &Map<String, Value>) -> Result<(f64, RopeScaling)> {
    let params = get(j, "rope_parameters").or_else(|| get(j, "rope_scaling"));
    let params = match params {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => candle::bail!("config.json: rope_parameters must be an object, got {v}"),
    };
    let theta = match params.and_then(|p| get(p, "rope_theta")) {
        Some(_) => float(params.unwrap_or(j), "rope_theta")?,
        None => float(j, "rope_theta")?,
    }
    .unwrap_or(10000.0);
    let Some(p) = params else {
        return Ok((theta, RopeScaling::None));
    };
    if let Some(f) = float(p, "partial_rotary_factor")? {
        if f != 1.0 {
            candle::bail!("config.json: partial_rotary_factor {f} is not supported (only 1.0)")
        }
    }
    let kind = get(p, "rope_type").or_else(|| get(p, "type"));
    let kind = match kind {
        None => "default",
        Some(Value::String(s)) => s.as_str(),
        Some(v) => candle::bail!("config.json: rope_type must be a string, got {v}"),
    };
    let need = |key: &str| -> Result<f64> {
        float(p, key)?.ok_or_else(|| {
            candle::Error::Msg(format!("config.json: rope_type {kind:?} needs {key}"))
        })
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: int(
                p,
                "original_max_position_embeddings",
                1,
                MAX_CONTEXT,
            )?,
        },
        other => candle::bail!(
            "config.json: rope_type {other:?} is not supported (default, linear and llama3 are)"
        ),
    };
    Ok((theta, scaling))
}

impl LlamaConfig {
    /// The configuration a Hugging Face `config.json` describes, or an error naming the key
    /// the model cannot honour: another `model_type` or `hidden_act`, `mlp_bias`, a sliding
    /// window shorter than the context, q/k norms, mixture of experts, a rope type other than
    /// default, linear and llama3.
    pub fn from_hf(json: &Value) -> Result<Self> {
        let Some(j) = json.as_object() else {
            candle::bail!("config.json: expected an object")
        };
        let family = match get(j, "model_type").and_then(Value::as_str) {
            Some("llama") => LlamaFamily::Llama,
            Some("qwen2") => LlamaFamily::Qwen2,
            Some("mistral") => LlamaFamily::Mistral,
            other => candle::bail!(
                "config.json: model_type {} is not a Llama-family model (llama, qwen2, mistral)",
                other.map_or("missing".to_string(), |s| format!("{s:?}"))
            ),
        };
        let act = get(j, "hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            candle::bail!("config.json: hidden_act {act:?} is not supported (only \"silu\")")
        }
        if flag(j, "mlp_bias")? == Some(true) {
            candle::bail!("config.json: mlp_bias true is not supported")
        }
        for key in [
            "num_experts",
            "num_local_experts",
            "n_routed_experts",
            "moe_intermediate_size",
        ] {
            if get(j, key).is_some_and(|v| v.as_u64() != Some(0)) {
                candle::bail!("config.json: {key} (mixture of experts) is not supported")
            }
        }
        for key in ["qk_norm", "use_qk_norm", "q_norm", "k_norm"] {
            if get(j, key).is_some_and(|v| v != &Value::Bool(false)) {
                candle::bail!("config.json: {key} (q/k norms) is not supported")
            }
        }
        let vocab_size = int(j, "vocab_size", 1, MAX_VOCAB)?;
        let hidden_size = int(j, "hidden_size", 1, MAX_DIM)?;
        let intermediate_size = int(j, "intermediate_size", 1, MAX_DIM * 16)?;
        let num_layers = int(j, "num_hidden_layers", 1, MAX_LAYERS)?;
        let num_heads = int(j, "num_attention_heads", 1, MAX_DIM)?;
        let num_kv_heads = match get(j, "num_key_value_heads") {
            Some(_) => int(j, "num_key_value_heads", 1, num_heads)?,
            None => num_heads,
        };
        if num_heads % num_kv_heads != 0 {
            candle::bail!(
                "config.json: num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )
        }
        let head_dim = match get(j, "head_dim") {
            Some(_) => int(j, "head_dim", 2, MAX_DIM)?,
            None => {
                if hidden_size % num_heads != 0 {
                    candle::bail!(
                        "config.json: hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads} and head_dim is missing"
                    )
                }
                hidden_size / num_heads
            }
        };
        if head_dim % 2 != 0 {
            candle::bail!("config.json: head_dim {head_dim} must be even (rotary embeddings)")
        }
        let max_position_embeddings = int(j, "max_position_embeddings", 1, MAX_CONTEXT)?;
        let rms_norm_eps = float(j, "rms_norm_eps")?.unwrap_or(1e-6);
        if rms_norm_eps < 0.0 {
            candle::bail!("config.json: rms_norm_eps must not be negative, got {rms_norm_eps}")
        }
        let (rope_theta, rope_scaling) = rope(j)?;
        let window = |j: &Map<String, Value>| -> Result<()> {
            if get(j, "sliding_window").is_some() {
                let w = int(j, "sliding_window", 1, usize::MAX)?;
                if w < max_position_embeddings {
                    candle::bail!(
                        "config.json: sliding_window {w} is shorter than the context (max_position_embeddings {max_position_embeddings}): not supported"
                    )
                }
            }
            Ok(())
        };
        // transformers 5 writes which layers slide (Qwen2 from `use_sliding_window` and
        // `max_window_layers`).
        if let Some(types) = get(j, "layer_types") {
            let Some(types) = types.as_array() else {
                candle::bail!("config.json: layer_types must be a list, got {types}")
            };
            for t in types {
                match t.as_str() {
                    Some("full_attention") => {}
                    Some("sliding_attention") => window(j)?,
                    _ => candle::bail!("config.json: layer_types holds {t}; supported: \"full_attention\", \"sliding_attention\" with a window of the whole context"),
                }
            }
        }
        let attention_bias = flag(j, "attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            LlamaFamily::Llama => (attention_bias, attention_bias),
            LlamaFamily::Qwen2 => {
                // Without `layer_types`, layers from `max_window_layers` on slide.
                let from = match get(j, "max_window_layers") {
                    Some(_) => int(j, "max_window_layers", 0, usize::MAX)?,
                    None => 28,
                };
                let slides = flag(j, "use_sliding_window")? == Some(true) && from < num_layers;
                if get(j, "layer_types").is_none() && slides {
                    window(j)?;
                }
                (true, false)
            }
            LlamaFamily::Mistral => {
                window(j)?;
                (false, false)
            }
        };
        Ok(Self {
            family,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            tie_word_embeddings: flag(j, "tie_word_embeddings")?.unwrap_or(false),
        })
    }

    /// A Hugging Face `config.json` of this configuration (transformers 5's keys).
    pub fn to_hf(&self) -> Value {
        let mut rope = Map::new();
        rope.insert("rope_theta".into(), self.rope_theta.into());
        match self.rope_scaling {
            RopeScaling::None => {
                rope.insert("rope_type".into(), "default".into());
            }
            RopeScaling::Linear { factor } => {
                rope.insert("rope_type".into(), "linear".into());
                rope.insert("factor".into(), factor.into());
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                rope.insert("rope_type".into(), "llama3".into());
                rope.insert("factor".into(), factor.into());
                rope.insert("low_freq_factor".into(), low_freq_factor.into());
                rope.insert("high_freq_factor".into(), high_freq_factor.into());
                rope.insert(
                    "original_max_position_embeddings".into(),
                    original_max_position_embeddings.into(),
                );
            }
        }
        let mut j = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tie_word_embeddings,
        });
        if self.family == LlamaFamily::Llama {
            j["attention_bias"] = self.qkv_bias.into();
            j["mlp_bias"] = false.into();
        }
        j
    }

    /// Checks the sizes the model is built from (a configuration made in code, not read).
    pub fn validate(&self) -> Result<()> {
        check_range("vocab_size", self.vocab_size, 1, MAX_VOCAB)?;
        check_range("hidden_size", self.hidden_size, 1, MAX_DIM)?;
        check_range("intermediate_size", self.intermediate_size, 1, MAX_DIM * 16)?;
        check_range("num_layers", self.num_layers, 1, MAX_LAYERS)?;
        check_range("num_heads", self.num_heads, 1, MAX_DIM)?;
        check_range("num_kv_heads", self.num_kv_heads, 1, self.num_heads)?;
        check_range("head_dim", self.head_dim, 2, MAX_DIM)?;
        check_range(
            "max_position_embeddings",
            self.max_position_embeddings,
            1,
            MAX_CONTEXT,
        )?;
        if !self.num_heads.is_multiple_of(self.num_kv_heads) || !self.head_dim.is_multiple_of(2) {
            candle::bail!(
                "Llama config: num_heads {} must be a multiple of num_kv_heads {} and head_dim {} even",
                self.num_heads,
                self.num_kv_heads,
                self.head_dim
            )
        }
        if self.family == LlamaFamily::Qwen2 && (!self.qkv_bias || self.o_bias) {
            candle::bail!("Llama config: a qwen2 model has a bias on q, k, v and none on o")
        }
        if self.family == LlamaFamily::Mistral && (self.qkv_bias || self.o_bias) {
            candle::bail!("Llama config: a mistral model has no attention biases")
        }
        if self.family == LlamaFamily::Llama && self.qkv_bias != self.o_bias {
            candle::bail!(
                "Llama config: a llama model has attention_bias on all four projections or none"
            )
        }
        Ok(())
    }
}

/// The ids of an `eos_token_id` (a number or a list, `what` the file it is in), `None` when
/// absent or null.
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
