//! Finding `nn.MultiheadAttention` modules in a checkpoint and inferring their configuration.

use std::fmt;

use candle::{DType, Result};

use super::state_dict::{normalize_prefix, StateDict};
use crate::attention::MultiheadAttentionConfig;

/// An attention module found in a checkpoint: its prefix and what its tensors tell.
///
/// The tensors cannot tell `num_heads`, `batch_first`, `add_zero_attn` or `dropout`: the caller
/// gives them to [`config`](Self::config).
#[derive(Clone, Debug, PartialEq)]
pub struct InferredAttention {
    /// The prefix in the checkpoint (`""` or ending with `.`).
    pub prefix: String,
    /// `E`, from `in_proj_weight [3E, E]` or `q_proj_weight [E, E]`.
    pub embed_dim: usize,
    /// Key feature size (from `k_proj_weight`; `E` when packed).
    pub kdim: usize,
    /// Value feature size (from `v_proj_weight`; `E` when packed).
    pub vdim: usize,
    /// Whether `in_proj_bias` / `out_proj.bias` are stored.
    pub bias: bool,
    /// Whether `bias_k` / `bias_v` are stored.
    pub add_bias_kv: bool,
    /// The stored dtype of the projection weight.
    pub dtype: DType,
}

fn dim(sd: &StateDict, name: &str, axis: usize) -> Option<usize> {
    sd.get(name).and_then(|t| t.dims().get(axis).copied())
}

impl InferredAttention {
    /// Reads the attention module at `prefix` of `state_dict`.
    ///
    /// PyTorch equivalent: none; PyTorch needs the constructor arguments up front.
    pub fn infer(state_dict: &StateDict, prefix: &str) -> Result<Self> {
        let prefix = normalize_prefix(prefix);
        let sd = state_dict.under(&prefix);
        let weight = sd.get("in_proj_weight").or_else(|| sd.get("q_proj_weight"));
        let Some(weight) = weight else {
            let found: Vec<String> = find_attention_modules(state_dict)
                .into_iter()
                .map(|a| a.prefix)
                .collect();
            candle::bail!(
                "no attention module at prefix \"{prefix}\": expected \"{prefix}in_proj_weight\" or \"{prefix}q_proj_weight\"; attention modules in this checkpoint: {found:?}"
            )
        };
        // The projection weight decides E: a wrong out_proj then shows as one size mismatch.
        let embed_dim = dim(&sd, "in_proj_weight", 1)
            .or_else(|| dim(&sd, "q_proj_weight", 0))
            .unwrap_or(0);
        let separate = sd.get("in_proj_weight").is_none();
        Ok(Self {
            embed_dim,
            kdim: if separate {
                dim(&sd, "k_proj_weight", 1).unwrap_or(embed_dim)
            } else {
                embed_dim
            },
            vdim: if separate {
                dim(&sd, "v_proj_weight", 1).unwrap_or(embed_dim)
            } else {
                embed_dim
            },
            bias: sd.get("in_proj_bias").is_some() || sd.get("out_proj.bias").is_some(),
            add_bias_kv: sd.get("bias_k").is_some() || sd.get("bias_v").is_some(),
            dtype: weight.dtype(),
            prefix,
        })
    }

    /// The module's configuration with the caller's `num_heads` (other settings at PyTorch's
    /// defaults).
    pub fn config(&self, num_heads: usize) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig::new(self.embed_dim, num_heads)
            .with_kdim(self.kdim)
            .with_vdim(self.vdim)
            .with_bias(self.bias)
            .with_add_bias_kv(self.add_bias_kv)
    }

    /// The head counts that divide `embed_dim`.
    pub fn possible_num_heads(&self) -> Vec<usize> {
        (1..=self.embed_dim)
            .filter(|h| self.embed_dim.is_multiple_of(*h))
            .collect()
    }
}

impl fmt::Display for InferredAttention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.prefix.is_empty() {
            "(root)"
        } else {
            self.prefix.trim_end_matches('.')
        };
        write!(f, "{name}: embed_dim={}", self.embed_dim)?;
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim) {
            write!(f, " kdim={} vdim={}", self.kdim, self.vdim)?;
        }
        write!(
            f,
            " bias={} add_bias_kv={} dtype={:?}",
            self.bias, self.add_bias_kv, self.dtype
        )?;
        write!(
            f,
            " (num_heads not stored: any divisor of {})",
            self.embed_dim
        )
    }
}

/// Every attention module in `state_dict`: each prefix that carries `in_proj_weight` or
/// `q_proj_weight`, in natural order.
///
/// PyTorch equivalent: `[n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]`.
pub fn find_attention_modules(state_dict: &StateDict) -> Vec<InferredAttention> {
    state_dict
        .tensors()
        .iter()
        .filter_map(|(name, _)| {
            name.strip_suffix("in_proj_weight")
                .or_else(|| name.strip_suffix("q_proj_weight"))
        })
        .filter(|p| p.is_empty() || p.ends_with('.'))
        .filter_map(|p| InferredAttention::infer(state_dict, p).ok())
        .collect()
}
