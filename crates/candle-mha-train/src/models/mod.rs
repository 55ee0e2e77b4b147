//! Models built on the attention core and the [`nn`](candle_mha::nn) layers: a next-token predictor
//! and its generation.

mod config;
mod generate;
pub mod llama;
pub mod lora;
mod next_token;

pub use config::{Gelu, LlamaRecord, NextTokenPredictorConfig};
pub use generate::{generate, generate_batch, generate_stream, sample_next, GenerateConfig};
pub use next_token::{masked_cross_entropy, Block, NextTokenPredictor, EVAL_LOGITS};
