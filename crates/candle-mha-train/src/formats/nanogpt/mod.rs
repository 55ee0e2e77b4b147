//! nanoGPT's `ckpt.pt`, read for import (what it says is used, or refused by name, never
//! replaced by a default behind the user's back) and written back ([`export_nanogpt`]: its
//! model, optimizer, step and settings, which nanoGPT's `train.py` resumes).

use candle::Result;
use candle_mha::checkpoint::PickleValue;

use crate::models::{Gelu, NextTokenPredictorConfig};
use candle_mha::io::short_shape;

mod export;
mod read;

pub use export::export_nanogpt;
pub use read::read_nanogpt;

/// A value as a message shows it: `-5`, `400.5`, `"400"`, `None`, "a list of 3 items".
pub(crate) fn shown(v: &PickleValue) -> String {
    match v {
        PickleValue::None => "None".into(),
        PickleValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        PickleValue::Int(i) => i.to_string(),
        // 400.0 as Python shows it, not as 400.
        PickleValue::Float(x) => format!("{x:?}"),
        PickleValue::Str(s) => candle_mha::io::quoted(s, 40),
        PickleValue::List(v) => format!("a list of {} items", v.len()),
        PickleValue::Tuple(v) => format!("a tuple of {} items", v.len()),
        PickleValue::Dict(v) => format!("a dict of {} entries", v.len()),
        PickleValue::Tensor(t) => format!("a tensor of shape {}", short_shape(t.dims())),
        PickleValue::Other(s) => s.clone(),
    }
}

/// Our configuration of nanoGPT's `model_args` (`n_layer`, `n_head`, `n_embd`,
/// `block_size`, `bias`, `vocab_size`, `dropout`): exact GELU, tied head, the one dropout
/// everywhere, MLP `4 n_embd`.
///
/// PyTorch equivalent: `GPTConfig(**checkpoint["model_args"])`.
pub fn config_from_nanogpt(args: &NanoGptArgs) -> Result<NextTokenPredictorConfig> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: args.vocab_size,
        max_len: args.block_size,
        embed_dim: args.n_embd,
        num_heads: args.n_head,
        num_layers: args.n_layer,
        ff_dim: 4 * args.n_embd,
        dropout: args.dropout,
        resid_dropout: args.dropout,
        embed_dropout: Some(args.dropout),
        bias: args.bias,
        tie_embeddings: true,
        head_bias: None,
        gelu: Gelu::Exact,
        layer_norm_eps: 1e-5,
        llama: None,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// nanoGPT's `model_args` (`GPTConfig`'s fields).
#[derive(Clone, Debug, PartialEq)]
pub struct NanoGptArgs {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
    /// Context.
    pub block_size: usize,
    /// Biases in the Linears and LayerNorms.
    pub bias: bool,
    /// Token ids.
    pub vocab_size: usize,
    /// The one dropout rate.
    pub dropout: f64,
}

impl NanoGptArgs {
    /// The `model_args` of `cfg`, when it is one nanoGPT can express (tied head, exact GELU,
    /// MLP `4 E`, eps 1e-5, one dropout); else an error naming what differs.
    pub fn from_config(cfg: &NextTokenPredictorConfig) -> Result<Self> {
        let mut differ = Vec::new();
        if !cfg.tie_embeddings {
            differ.push("an untied head".to_string());
        }
        if cfg.gelu != Gelu::Exact {
            differ.push("the tanh GELU".to_string());
        }
        if cfg.ff_dim != 4 * cfg.embed_dim {
            differ.push(format!("ff_dim {} (nanoGPT: 4 × n_embd)", cfg.ff_dim));
        }
        if cfg.layer_norm_eps != 1e-5 {
            differ.push(format!("layer_norm_eps {}", cfg.layer_norm_eps));
        }
        let pe = cfg.embed_dropout.unwrap_or(cfg.resid_dropout);
        if cfg.dropout != cfg.resid_dropout || pe != cfg.dropout {
            differ.push("three different dropouts (nanoGPT has one)".to_string());
        }
        if !differ.is_empty() {
            candle::bail!(
                "this model is not one nanoGPT's GPT can hold: {}",
                differ.join(", ")
            )
        }
        Ok(Self {
            n_layer: cfg.num_layers,
            n_head: cfg.num_heads,
            n_embd: cfg.embed_dim,
            block_size: cfg.max_len,
            bias: cfg.bias,
            vocab_size: cfg.vocab_size,
            dropout: cfg.dropout,
        })
    }
}
