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
//! Layering (lower layers never import higher ones; the folder names say which is which):
//!
//! 1. Foundations, importing nothing of the crate but each other: [`rng`] (seeded, portable
//!    randomness), [`init`] (PyTorch's initialisers, drawn from `rng`), [`autograd`] (backward
//!    from a given gradient), [`device`] (a device from a string), [`io`] (atomic file writes),
//!    [`alloc`] (keeping freed memory between steps), and `cpu`, the crate-private CPU kernel
//!    layer every fused op shares (one element trait, the SIMD math, one storage-slice helper,
//!    one gemm wrapper, the fused linear, one dtype error, one side channel).
//! 2. [`attention`]: the module itself, with its fused CPU kernels (`attention/fused/`).
//! 3. [`checkpoint`]: PyTorch state_dicts in and out.
//! 4. [`nn`]: layers with PyTorch's names and the models' fused CPU ops, PyTorch's Transformer
//!    encoder/decoder layers around the attention and their loaders from checkpoints (on
//!    `attention` and `checkpoint`); [`models`]: the next-token predictor, its key/value cache
//!    and generation, on `attention` and `nn`.
//! 5. [`data`] (vocabularies, token files, batching), [`training`] (AdamW, the trainer),
//!    [`analysis`] (reading attention, pictures, interactive HTML pages).
//! 6. The `mha` binary (`src/main.rs`, `src/cli/`; the default `cli` feature), on the public
//!    API only.
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
pub mod autograd;
pub mod checkpoint;
mod cpu;
pub mod device;
pub mod init;
pub mod io;
pub mod nn;
pub mod optim;
pub mod rng;
pub mod runtime;

pub use attention::{
    multihead_attention, AttentionKernel, AttentionOptions, AttentionOutput, IncrementalOptions,
    KvCache, MemoryCache, MultiheadAttention, MultiheadAttentionConfig, StackKvCache,
};
pub use init::seeded_var_builder;
pub use nn::{
    Activation, DecoderOptions, EncoderOptions, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayer, TransformerDecoderLayerConfig, TransformerEncoder,
    TransformerEncoderLayer, TransformerEncoderLayerConfig, TransformerOptions,
};
