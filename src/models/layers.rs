//! Moved to [`crate::nn`]; kept here so existing code compiles.
//!
//! PyTorch equivalent: `nn.Linear`, `nn.Embedding`, `nn.LayerNorm`.

/// Moved to [`crate::nn::Linear`]; kept here so existing code compiles.
pub use crate::nn::Linear;

/// Moved to [`crate::nn::Embedding`]; kept here so existing code compiles.
pub use crate::nn::Embedding;

/// Moved to [`crate::nn::LayerNorm`]; kept here so existing code compiles.
pub use crate::nn::LayerNorm;
