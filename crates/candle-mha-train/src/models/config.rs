//! [`NextTokenPredictorConfig`]: the model's hyper-parameters, also stored as `config.json`.

use std::path::Path;

use candle::{DType, Result};
use serde::{Deserialize, Serialize};

use super::llama::LlamaConfig;
use crate::limits::{
    check_range, dtype_bytes, MemoryEstimate, MAX_CONFIG_BYTES, MAX_CONTEXT, MAX_DIM, MAX_LAYERS,
    MAX_VOCAB,
};

/// Hyper-parameters of a [`NextTokenPredictor`](super::NextTokenPredictor).
///
/// PyTorch equivalent: the constructor arguments of `NextTokenPredictor` in
/// `scripts/reference_model.py`; `config.json` holds exactly these keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NextTokenPredictorConfig {
    /// Number of token ids `V`.
    pub vocab_size: usize,
    /// Context length: the longest sequence the position table covers. Default 64.
    pub max_len: usize,
    /// Model width `E`. Default 64.
    pub embed_dim: usize,
    /// Attention heads per block. Default 4.
    pub num_heads: usize,
    /// Transformer blocks. Default 2.
    pub num_layers: usize,
    /// Hidden width of each block's MLP. Default `4 E`.
    pub ff_dim: usize,
    /// Dropout on the attention weights (training only). Default 0.
    pub dropout: f64,
    /// Dropout on the embeddings and on each block's attention and MLP outputs before they
    /// are added to the residual stream (training only; nanoGPT's `dropout`). Default 0.
    /// Older `config.json` files without it read as 0.
    #[serde(default)]
    pub resid_dropout: f64,
    /// Dropout on the sum of the token and position embeddings (training only; nanoGPT's
    /// `transformer.drop`). `None`: [`resid_dropout`](Self::resid_dropout), as before the field
    /// existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed_dropout: Option<f64>,
    /// Whether the attention projections, the MLP's layers and every LayerNorm have a bias
    /// (and the head, when it is not tied). Default true; nanoGPT's `bias`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub bias: bool,
    /// Whether the output head is the token embedding itself (one parameter, used twice, its
    /// gradient the sum of both uses; no head bias), as in GPT-2 and nanoGPT. Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tie_embeddings: bool,
    /// Whether an untied head has a bias. `None` (the default, and `scripts/reference_model.py`'s
    /// model): [`bias`](Self::bias), as before the field existed. Hugging Face's untied GPT-2
    /// (`tie_word_embeddings: false`) has `Some(false)`: its `lm_head` is
    /// `nn.Linear(n_embd, vocab_size, bias=False)`; so do the runs `mha train` makes, which
    /// therefore export to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_bias: Option<bool>,
    /// The MLP's GELU. Default [`Gelu::Exact`].
    #[serde(default, skip_serializing_if = "is_exact")]
    pub gelu: Gelu,
    /// The LayerNorms' epsilon. Default 1e-5 (PyTorch's and GPT-2's).
    #[serde(default = "default_eps", skip_serializing_if = "is_default_eps")]
    pub layer_norm_eps: f64,
    /// A Llama-family model (grouped-query attention, rotary positions, RMSNorm, SwiGLU, Hugging
    /// Face's parameter names) in place of the GPT blocks. `None` (the default, and every
    /// `config.json` before the field existed): the GPT blocks. The sizes above then mirror
    /// the Llama configuration's (checked when read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama: Option<LlamaRecord>,
}

/// What a Llama-family run keeps of its Hugging Face model: what the export writes back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaRecord {
    /// Hugging Face's `config.json`, as read (or made by `mha train --arch llama`): the
    /// architecture is read from it ([`LlamaConfig::from_hf`]).
    pub hf_config: serde_json::Value,
    /// `generation_config.json`, when the source had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_config: Option<serde_json::Value>,
    /// The dtype of each weight in the source files (`"f32"`, `"f16"`, `"bf16"`; f32 when not
    /// listed): the export writes each back in it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dtypes: std::collections::BTreeMap<String, String>,
}

/// The GELU of a [`NextTokenPredictor`](super::NextTokenPredictor)'s MLP.
///
/// PyTorch equivalent: `F.gelu(x, approximate="none" | "tanh")`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gelu {
    /// `x·Φ(x)` with the exact (erf) Φ: PyTorch's `nn.GELU()`, nanoGPT's.
    #[default]
    Exact,
    /// The tanh approximation: `F.gelu(approximate="tanh")`, Hugging Face's `gelu_new`
    /// (GPT-2's `activation_function`).
    Tanh,
}

impl Gelu {
    /// The core's name for it.
    pub fn approximate(self) -> candle_mha::nn::GeluApproximate {
        match self {
            Gelu::Exact => candle_mha::nn::GeluApproximate::None,
            Gelu::Tanh => candle_mha::nn::GeluApproximate::Tanh,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_exact(g: &Gelu) -> bool {
    *g == Gelu::Exact
}

fn default_eps() -> f64 {
    1e-5
}

fn is_default_eps(e: &f64) -> bool {
    *e == 1e-5
}

impl NextTokenPredictorConfig {
    /// A small model for `vocab_size` tokens: E = 64, 4 heads, 2 blocks, context 64; the
    /// default of `mha train` on token sequences (with the data's longest sequence as context).
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            max_len: 64,
            embed_dim: 64,
            num_heads: 4,
            num_layers: 2,
            ff_dim: 256,
            dropout: 0.0,
            resid_dropout: 0.0,
            embed_dropout: None,
            bias: true,
            tie_embeddings: false,
            head_bias: None,
            gelu: Gelu::Exact,
            layer_norm_eps: 1e-5,
            llama: None,
        }
    }

    /// The configuration of a Llama-family model: the GPT sizes mirror `llama`'s,
    /// `hf_config` is its Hugging Face `config.json` (`llama.to_hf()` when `None`).
    pub fn from_llama(llama: &LlamaConfig, record: Option<LlamaRecord>) -> Result<Self> {
        let cfg = Self::llama_mirror(llama, record);
        cfg.validate()?;
        Ok(cfg)
    }

    /// [`from_llama`](Self::from_llama) without the checks ([`validate`](Self::validate)
    /// makes them where the model is built).
    pub fn llama_mirror(llama: &LlamaConfig, record: Option<LlamaRecord>) -> Self {
        let record = record.unwrap_or_else(|| LlamaRecord {
            hf_config: llama.to_hf(),
            generation_config: None,
            dtypes: Default::default(),
        });
        Self {
            vocab_size: llama.vocab_size,
            max_len: llama.max_position_embeddings,
            embed_dim: llama.hidden_size,
            num_heads: llama.num_heads,
            num_layers: llama.num_layers,
            ff_dim: llama.intermediate_size,
            bias: false,
            tie_embeddings: llama.tie_word_embeddings,
            layer_norm_eps: llama.rms_norm_eps.max(f64::MIN_POSITIVE),
            llama: Some(record),
            ..Self::new(llama.vocab_size)
        }
    }

    /// The ids that end generation besides the tokenizer's: a Llama-family model's
    /// `generation_config.json` `eos_token_id` (a number or a list), else its `config.json`'s.
    pub fn eos_token_ids(&self) -> Result<Vec<u32>> {
        let Some(r) = &self.llama else {
            return Ok(Vec::new());
        };
        let gen = r
            .generation_config
            .as_ref()
            .and_then(|g| g.get("eos_token_id"));
        match super::llama::eos_ids(gen, "generation_config.json")? {
            Some(ids) => Ok(ids),
            None => Ok(
                super::llama::eos_ids(r.hf_config.get("eos_token_id"), "config.json")?
                    .unwrap_or_default(),
            ),
        }
    }

    /// The Llama-family configuration, when the model is one.
    pub fn llama_config(&self) -> Result<Option<LlamaConfig>> {
        match &self.llama {
            None => Ok(None),
            Some(r) => Ok(Some(LlamaConfig::from_hf(&r.hf_config)?)),
        }
    }

    /// The model `mha train` builds for text by default: E = 128, 4 heads, 3 blocks,
    /// context 128, attention dropout 0.1, residual dropout 0.2. With the training schedule
    /// `training::TrainConfig::for_text` it ends well below a bigram model's validation loss
    /// on a few hundred KB of English in a few minutes on 2 cores.
    /// [`NextTokenPredictorConfig::new`] is the default for token sequences.
    ///
    /// PyTorch equivalent: `NextTokenPredictor(vocab_size, max_len=128, embed_dim=128,
    /// num_heads=4, num_layers=3, ff_dim=512, dropout=0.1, resid_dropout=0.2)` in
    /// `scripts/reference_model.py`.
    pub fn for_text(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            max_len: 128,
            embed_dim: 128,
            num_heads: 4,
            num_layers: 3,
            ff_dim: 512,
            dropout: 0.1,
            resid_dropout: 0.2,
            ..Self::new(vocab_size)
        }
    }

    /// Checks sizes against the crate's [limits](crate::limits) (the same as the command
    /// line's options); names the field and the value on error.
    pub fn validate(&self) -> Result<()> {
        for (name, v, hi) in [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("max_len", self.max_len, MAX_CONTEXT),
            ("embed_dim", self.embed_dim, MAX_DIM),
            ("num_heads", self.num_heads, MAX_DIM),
            ("num_layers", self.num_layers, MAX_LAYERS),
            ("ff_dim", self.ff_dim, MAX_CONTEXT),
        ] {
            if v == 0 {
                candle::bail!("model config: {name} must be greater than 0, got 0")
            }
            check_range(&format!("model config: {name}"), v, 1, hi)?;
        }
        if let Some(llama) = self.llama_config()? {
            let mirrored = [
                ("vocab_size", self.vocab_size, llama.vocab_size),
                ("max_len", self.max_len, llama.max_position_embeddings),
                ("embed_dim", self.embed_dim, llama.hidden_size),
                ("num_heads", self.num_heads, llama.num_heads),
                ("num_layers", self.num_layers, llama.num_layers),
                ("ff_dim", self.ff_dim, llama.intermediate_size),
            ];
            for (name, ours, theirs) in mirrored {
                if ours != theirs {
                    candle::bail!(
                        "model config: {name} {ours} differs from the Llama config's {theirs}"
                    )
                }
            }
            if self.tie_embeddings != llama.tie_word_embeddings || self.bias {
                candle::bail!("model config: tie_embeddings and bias must be the Llama config's (tie_word_embeddings {}, no bias)", llama.tie_word_embeddings)
            }
            for (name, d) in self.llama.iter().flat_map(|r| &r.dtypes) {
                if !matches!(d.as_str(), "f32" | "f16" | "bf16") {
                    candle::bail!(
                        "model config: the dtype of {name} is {d:?}; expected f32, f16 or bf16"
                    )
                }
            }
            return Ok(());
        }
        if !self.embed_dim.is_multiple_of(self.num_heads) {
            candle::bail!(
                "model config: embed_dim ({}) must be divisible by num_heads ({})",
                self.embed_dim,
                self.num_heads
            )
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite()) {
            candle::bail!(
                "model config: layer_norm_eps must be a positive number, got {}",
                self.layer_norm_eps
            )
        }
        if let Some(p) = self.embed_dropout {
            if !(0.0..1.0).contains(&p) {
                candle::bail!("model config: embed_dropout must be in [0, 1), got {p}")
            }
        }
        if !(0.0..1.0).contains(&self.resid_dropout) {
            candle::bail!(
                "model config: resid_dropout must be in [0, 1), got {}",
                self.resid_dropout
            )
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            candle::bail!(
                "model config: dropout must be in [0, 1], got {}",
                self.dropout
            )
        }
        Ok(())
    }

    /// Whether the model has a `head.bias`: an untied head, with [`head_bias`](Self::head_bias)
    /// (default [`bias`](Self::bias)).
    pub fn head_has_bias(&self) -> bool {
        !self.tie_embeddings && self.head_bias.unwrap_or(self.bias)
    }

    /// The number of parameters.
    ///
    /// PyTorch equivalent: `sum(p.numel() for p in model.parameters())`.
    pub fn parameter_count(&self) -> u128 {
        if let Ok(Some(llama)) = self.llama_config() {
            return super::llama::parameter_shapes(&llama)
                .iter()
                .map(|(_, s)| s.iter().map(|&d| d as u128).product::<u128>())
                .sum();
        }
        let [v, l, e, f, n] = [
            self.vocab_size,
            self.max_len,
            self.embed_dim,
            self.ff_dim,
            self.num_layers,
        ]
        .map(|x| x as u128);
        let b = u128::from(self.bias);
        // Embeddings; per block the attention (4 E² + 4 E biases), two layer norms (E
        // weights, E biases each), the MLP; the final norm and the head (none when tied).
        let block = 4 * e * e + b * 4 * e + 2 * e * (1 + b) + 2 * e * f + b * (f + e);
        let head = match self.tie_embeddings {
            true => 0,
            false => e * v + u128::from(self.head_has_bias()) * v,
        };
        v * e + l * e + n * block + e * (1 + b) + head
    }

    /// About how much memory the model needs in `dtype` for batches of `batch_tokens`
    /// positions (sequences × context): for `training`, the parameters four times
    /// (weights, gradients, AdamW's two moments) and every block's activations; else the
    /// weights and one block's activations. A rough upper estimate, meant to refuse sizes far
    /// beyond a machine before allocating them.
    pub fn memory(&self, dtype: DType, batch_tokens: u128, training: bool) -> MemoryEstimate {
        let bytes = u128::from(dtype_bytes(dtype));
        let [v, l, e, f, h, n] = [
            self.vocab_size,
            self.max_len,
            self.embed_dim,
            self.ff_dim,
            self.num_heads,
            self.num_layers,
        ]
        .map(|x| x as u128);
        // Per position and block: the projections, norms and residuals (~20 E), the MLP's
        // hidden layer (~4 F), each head's scores and probabilities (~4 H L); the logits.
        let per_block = 20 * e + 4 * f + 4 * h * l;
        // Training keeps every block's activations and the logits' gradient; inference one
        // block's, the logits and their softmax.
        let (copies, blocks, logits) = if training { (4, n, 4) } else { (1, 1, 2) };
        MemoryEstimate {
            parameters: copies * self.parameter_count() * bytes,
            activations: batch_tokens
                .saturating_mul(blocks * per_block + logits * v)
                .saturating_mul(bytes),
        }
    }

    /// Reads `config.json` (at most [`MAX_CONFIG_BYTES`]); its sizes are checked as
    /// [`validate`](Self::validate) does.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = candle_mha::io::read_input_string(path, MAX_CONFIG_BYTES)
            .map_err(|e| candle::Error::Msg(format!("cannot read model config: {e}")))?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!("invalid model config {}: {e}", path.display()))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The JSON text of `config.json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count the memory check uses is the model's own.
    #[test]
    fn parameter_count_is_the_models() -> Result<()> {
        let cfg = NextTokenPredictorConfig {
            ff_dim: 24,
            ..NextTokenPredictorConfig::new(11)
        };
        let varmap = candle_nn::VarMap::new();
        let vb = candle_mha::seeded_var_builder(&varmap, 0, DType::F32, &candle::Device::Cpu);
        super::super::NextTokenPredictor::new(cfg.clone(), vb)?;
        let built: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
        assert_eq!(cfg.parameter_count(), built as u128);
        let m = cfg.memory(DType::F64, 10, true);
        assert_eq!(m.parameters, 4 * 8 * built as u128);
        let e = NextTokenPredictorConfig {
            embed_dim: 1 << 17,
            ..cfg
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("embed_dim 131072"), "{e}");
        Ok(())
    }
}
