//! The attention core: [`MultiheadAttention`] and its configuration, options and output, and
//! the key/value caches of incremental decoding ([`KvCache`], [`StackKvCache`], [`MemoryCache`]).
//!
//! PyTorch equivalent: `torch.nn.MultiheadAttention` and `F.multi_head_attention_forward`.

mod checks;
mod config;
/// Seeded dropout lives with the layers (LoRA uses it too); its attention-era path stays.
pub use crate::nn::dropout;
pub(crate) mod fused;
mod kv_cache;
pub mod mask;
mod mha;
mod options;
mod sdpa;
pub mod softmax;

pub(crate) use checks::is_float;
pub use config::MultiheadAttentionConfig;
pub use kv_cache::{IncrementalOptions, KvCache, MemoryCache, StackKvCache};
pub use mha::{multihead_attention, MultiheadAttention};
pub use options::{AttentionKernel, AttentionOptions, AttentionOutput};
pub use sdpa::{scaled_dot_product_attention, SdpaOptions, MAX_SDPA_HEADS};
