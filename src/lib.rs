//! # candle-mha
//!
//! PyTorch's [`torch.nn.MultiheadAttention`] on [candle]: the same numbers, the same gradients
//! and the same checkpoint names (`in_proj_weight`, `in_proj_bias`, `out_proj.weight`, …), on
//! any candle [`Device`](candle::Device) and in f32, f64, f16 and bf16.
//!
//! ```
//! use candle::{DType, Device, Tensor};
//! use candle_mha::{seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
//! # fn main() -> candle::Result<()> {
//! let varmap = candle_nn::VarMap::new();
//! let vb = seeded_var_builder(&varmap, 42, DType::F32, &Device::Cpu);
//! let mha = MultiheadAttention::new(MultiheadAttentionConfig::new(16, 4), vb)?;
//! let x = Tensor::randn(0f32, 1., (5, 2, 16), &Device::Cpu)?; // (L, N, E): batch_first = false
//! let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
//! assert_eq!(out.output.dims(), &[5, 2, 16]);
//! assert_eq!(out.weights.unwrap().dims(), &[2, 5, 5]); // (N, L, S), averaged over heads
//! # Ok(())
//! # }
//! ```
//!
//! Layering, from the bottom (a module imports only from its own floor or below; the test
//! `tests/layering.rs` checks every `crate::` path of `src/`):
//!
//! 0. Foundations: [`error`] (typed errors carried through `candle::Error`), [`rng`] (seeded,
//!    portable randomness), [`init`] (PyTorch's initialisers),
//!    [`autograd`] (backward from a given gradient), [`device`] (a device from a string),
//!    [`io`] (atomic file writes), [`autocast`] (bf16 products in a scope), [`runtime`] (the process settings a program may opt into;
//!    the library sets none), `numerics` (the dtype a reduction computes in) and `cpu`, the
//!    crate-private CPU kernel layer every fused op shares.
//! 1. [`nn`]: plain layers ([`nn::Linear`], [`nn::LayerNorm`], [`nn::Embedding`], the fused
//!    GELU, MLP and cross-entropy ops).
//! 2. [`attention`]: the module itself, its key/value caches and fused kernels; beside it, with
//!    the `bench-internals` feature only, `bench_internals` (the CPU products and attention
//!    tiles, for `benches/products.rs`).
//! 3. [`checkpoint`]: PyTorch state_dicts in and out; [`optim`]: AdamW and clipping.
//! 4. [`transformer`]: PyTorch's Transformer layers, stacks and `nn.Transformer`, with their
//!    loaders from checkpoints.
//!
//! Beside this crate, in the same workspace: `candle-mha-train` (data, the next-token
//! predictor, training), `candle-mha-viz` (reading attention) and `candle-mha-cli` (`mha`).
//!
//! [`torch.nn.MultiheadAttention`]: https://pytorch.org/docs/stable/generated/torch.nn.MultiheadAttention.html
//! [candle]: https://github.com/huggingface/candle

#![warn(missing_docs)]

/// The candle-core crate this one is built on (re-exported so users match its version).
pub use candle;
/// The candle-nn crate this one is built on (`VarMap`, `VarBuilder`, `Optimizer`; re-exported
/// so users match its version).
pub use candle_nn;

pub mod attention;
pub mod autocast;
pub mod autograd;
#[cfg(feature = "bench-internals")]
pub mod bench_internals;
pub mod checkpoint;
mod cpu;
pub mod device;
pub mod error;
pub mod init;
pub mod io;
pub mod nn;
mod numerics;
pub mod optim;
pub mod rng;
pub mod runtime;
mod setters;
pub mod transformer;

pub use attention::{
    multihead_attention, scaled_dot_product_attention, AttentionKernel, AttentionOptions,
    AttentionOutput, IncrementalOptions, KvCache, MemoryCache, MultiheadAttention,
    MultiheadAttentionConfig, SdpaOptions, StackKvCache,
};
pub use init::{seeded_var_builder, zeroed_var_builder};
pub use transformer::{
    Activation, DecoderOptions, EncoderOptions, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayer, TransformerDecoderLayerConfig, TransformerEncoder,
    TransformerEncoderLayer, TransformerEncoderLayerConfig, TransformerLayerConfig,
    TransformerOptions,
};

/// The guides' examples of this crate's API, compiled and run as doctests.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../docs/checkpoints.md")]
    pub struct Checkpoints;
    #[doc = include_str!("../docs/masks-and-differences.md")]
    pub struct Masks;
}
