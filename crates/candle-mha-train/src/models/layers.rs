//! Moved to [`candle_mha::nn`]; kept here so existing code compiles.
//!
//! PyTorch equivalent: `nn.Linear`, `nn.Embedding`, `nn.LayerNorm`.

/// Moved to [`candle_mha::nn::Linear`]; kept here so existing code compiles.
pub use candle_mha::nn::Linear;

/// Moved to [`candle_mha::nn::Embedding`]; kept here so existing code compiles.
pub use candle_mha::nn::Embedding;

/// Moved to [`candle_mha::nn::LayerNorm`]; kept here so existing code compiles.
pub use candle_mha::nn::LayerNorm;
