//! What a cache agrees on with the module that uses it, and the error when it does not.

use candle::{DType, Device, Result};

use crate::attention::{MultiheadAttention, MultiheadAttentionConfig};

/// What a cache must agree on with the module that uses it.
#[derive(Clone, Debug)]
pub(crate) struct CacheGeometry {
    pub embed_dim: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    /// `bias_k` and zero-attention rows appended after the keys.
    pub extra: usize,
    pub dtype: DType,
    pub device: Device,
}

impl CacheGeometry {
    pub(crate) fn of(mha: &MultiheadAttention) -> Self {
        let cfg: &MultiheadAttentionConfig = mha.config();
        let w = mha.out_proj().weight();
        Self {
            embed_dim: cfg.embed_dim,
            num_heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
            extra: usize::from(cfg.add_bias_kv) + usize::from(cfg.add_zero_attn),
            dtype: w.dtype(),
            device: w.device().clone(),
        }
    }

    /// An error naming `what` (the cache or memory) when it was made for another module.
    pub(crate) fn check(&self, module: &CacheGeometry, what: &str) -> Result<()> {
        let field_err = |field: &str, got: String, want: String| -> Result<()> {
            candle::bail!(
                "{what} was made for a module with {field} {got}, but this module has {field} {want}: a cache belongs to the module that made it"
            )
        };
        if self.embed_dim != module.embed_dim {
            field_err(
                "embed_dim",
                self.embed_dim.to_string(),
                module.embed_dim.to_string(),
            )?
        }
        if self.num_heads != module.num_heads {
            field_err(
                "num_heads",
                self.num_heads.to_string(),
                module.num_heads.to_string(),
            )?
        }
        if self.extra != module.extra {
            field_err(
                "extra key rows (add_bias_kv + add_zero_attn)",
                self.extra.to_string(),
                module.extra.to_string(),
            )?
        }
        if self.dtype != module.dtype {
            field_err(
                "dtype",
                format!("{:?}", self.dtype),
                format!("{:?}", module.dtype),
            )?
        }
        if !self.device.same_device(&module.device) {
            field_err(
                "device",
                format!("{:?}", self.device.location()),
                format!("{:?}", module.device.location()),
            )?
        }
        Ok(())
    }
}
