//! `mha generate`: continue a prompt with a trained model.

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::data::Codec;
use candle_mha::device::select_device;
use candle_mha::models::{generate, GenerateConfig};

/// Arguments of `mha generate`. Greedy unless --top-k, --top-p or --temperature is given; then
/// the next token is sampled (temperature, then top-k, then top-p, as Hugging Face's
/// `model.generate(do_sample=True, ...)`).
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
    /// Sample among the k most likely tokens (default: greedy; no top-k filtering when
    /// sampling).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to at
    /// least P, in (0, 1] (default: greedy; no top-p filtering when sampling).
    #[arg(long, value_name = "P", value_parser = parse_top_p)]
    pub top_p: Option<f64>,
    /// Sampling temperature, positive (below 1 sharper, above 1 flatter); alone it samples
    /// from the whole distribution (default: greedy; 1 when sampling).
    #[arg(long, value_name = "T", value_parser = parse_temperature)]
    pub temperature: Option<f64>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = super::choices::DeviceParser)]
    pub device: String,
    /// Compute dtype.
    #[arg(long, default_value = "f32", value_parser = super::choices::DtypeParser)]
    pub dtype: DType,
}

/// Parses `--top-p`: a probability in (0, 1].
fn parse_top_p(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!("--top-p {s}: expected a probability in (0, 1]")),
    }
}

/// Parses `--temperature`: a positive finite number.
fn parse_temperature(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && t.is_finite() => Ok(t),
        _ => Err(format!(
            "--temperature {s}: expected a positive finite number"
        )),
    }
}

/// Runs `mha generate`. Text models: prints the prompt as typed followed by its continuation,
/// as one text. Symbol models: the prompt on one line, `=> continuation` on the next.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let (device, notice) = select_device(&args.device)?;
    eprintln!("{notice}");
    let ckpt = super::checkpoint_dir::open(&args.checkpoint, args.dtype, &device)?;
    let prompt = ckpt.codec.encode_prompt(&args.prompt)?;
    let cfg = GenerateConfig {
        max_new_tokens: args.max_new_tokens,
        do_sample: args.top_k.is_some() || args.top_p.is_some() || args.temperature.is_some(),
        top_k: args.top_k,
        top_p: args.top_p,
        temperature: args.temperature.unwrap_or(1.0),
        seed: args.seed,
        eos_id: ckpt.codec.eos_id(),
        kv_cache: true,
    };
    let new = generate(&ckpt.model, &prompt, &cfg)?;
    let continuation = ckpt.codec.decode_continuation(&prompt, &new)?;
    match ckpt.codec {
        Codec::Text(_) => println!("{}{continuation}", args.prompt),
        Codec::Symbols(_) => {
            println!("{}", args.prompt);
            println!("=> {continuation}");
        }
    }
    Ok(())
}
