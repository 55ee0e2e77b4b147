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
//! Layering (lower layers never import higher ones): [`rng`] and [`init`] (seeded randomness),
//! [`autograd`] (backward from a given gradient) → [`attention`] (the module itself) → [`checkpoint`] (PyTorch state_dicts in and out).
//!
//! [`torch.nn.MultiheadAttention`]: https://pytorch.org/docs/stable/generated/torch.nn.MultiheadAttention.html
//! [candle]: https://github.com/huggingface/candle

#![warn(missing_docs)]

/// The candle-core crate this one is built on (re-exported so users match its version).
pub use candle;
/// The candle-nn crate this one is built on (`VarMap`, `VarBuilder`, `Optimizer`; re-exported
/// so users match its version).
pub use candle_nn;

pub mod alloc;
pub mod analysis;
pub mod attention;
pub mod autograd;
pub mod checkpoint;
mod cpu;
pub mod data;
pub mod device;
pub mod init;
pub mod io;
pub mod models;
pub mod nn;
pub mod rng;
pub mod training;

pub use attention::{
    multihead_attention, AttentionKernel, AttentionOptions, AttentionOutput, MultiheadAttention,
    MultiheadAttentionConfig,
};
pub use init::seeded_var_builder;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
