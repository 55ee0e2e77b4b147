//! Models built on the attention core: layers with PyTorch's names and a next-token predictor.

mod config;
mod fused;
mod generate;
pub mod layers;
mod next_token;

pub use config::NextTokenPredictorConfig;
pub use generate::{generate, sample_next, GenerateConfig};
pub use next_token::{masked_cross_entropy, Block, NextTokenPredictor};
