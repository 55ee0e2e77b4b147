//! `mha generate`: continue a prompt with a trained model.

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::device::select_device;
use candle_mha::models::{generate, GenerateConfig};

/// Arguments of `mha generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint directory written by `mha train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The prompt: symbols separated by spaces (token models) or text (text models).
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate at most (stops early at end of sequence).
    #[arg(long, default_value_t = 20)]
    pub max_new_tokens: usize,
    /// Sample among the k most likely tokens (default: greedy).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sampling temperature (with --top-k).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Compute dtype: f32, f64, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = super::parse_dtype)]
    pub dtype: DType,
}

/// Runs `mha generate`: prints the prompt and its continuation.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let (device, notice) = select_device(&args.device)?;
    eprintln!("{notice}");
    let ckpt = super::checkpoint_dir::open(&args.checkpoint, args.dtype, &device)?;
    let prompt = ckpt.codec.encode_prompt(&args.prompt)?;
    let cfg = GenerateConfig {
        max_new_tokens: args.max_new_tokens,
        top_k: args.top_k,
        temperature: args.temperature,
        seed: args.seed,
        eos_id: ckpt.codec.eos_id(),
    };
    let new = generate(&ckpt.model, &prompt, &cfg)?;
    println!("{}", args.prompt);
    println!("=> {}", ckpt.codec.decode(&new)?);
    Ok(())
}
