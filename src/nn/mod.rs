//! Layers with PyTorch's names, initialisation and a full backward, and the fused CPU ops the
//! models are built from: [`Linear`] (with an optional LoRA adapter, [`Lora`]), [`Embedding`],
//! [`LayerNorm`]; the GELU (alone and after a linear layer) and the masked cross-entropy.
//!
//! Built from candle's generic ops the layer norm, GELU and cross-entropy cost many passes over
//! the activations (layer norm: ~10 forward and ~25 backward, each gradient added into a fresh
//! zero tensor; GELU's backward 8 single-threaded passes with `erf` recomputed), which made them
//! most of a training step. So on the CPU in f32/f64 each is one op forward and one backward,
//! over the kernels of the CPU layer (`crate::cpu`); other devices and dtypes keep the generic
//! ops.
//!
//! Layering: above the CPU layer, `numerics` and `init`; below the attention and
//! [`crate::transformer`], which are built from these layers.

mod cross_entropy;
pub mod dropout;
mod embedding;
mod gelu;
mod layer_norm;
mod linear;
mod linear_cross_entropy;
mod linear_gelu;
mod lora;
mod lora_linear;
mod rms_norm;
mod rotary;
mod swiglu;

pub use crate::cpu::GeluApproximate;
pub use cross_entropy::cross_entropy_rows;
pub use embedding::embedding_sum;
pub use embedding::Embedding;
pub(crate) use gelu::gelu_erf;
pub use gelu::gelu_with;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use linear_cross_entropy::linear_cross_entropy;
pub use linear_gelu::{linear_gelu, linear_gelu_with, mlp, mlp_with};
pub use lora::{Lora, LoraConfig, MAX_LORA_RANK};
pub use rms_norm::{RmsNorm, RmsNormKind};
pub use rotary::{apply_rotary, RopeScaling, RotaryEmbedding, MAX_ROPE_HEAD_DIM};
pub use swiglu::{silu_mul, silu_mul_linear, SwiGlu};
#[cfg(test)]
mod tests;
