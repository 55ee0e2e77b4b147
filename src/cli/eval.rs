//! `mha eval`: loss, perplexity and accuracy of a checkpoint.

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::checkpoint::StateDict;
use candle_mha::device::select_device;
use candle_mha::training::evaluate;

use super::data_source::{checkpoint_dataset, RunSplit};

/// Arguments of `mha eval`. Without a data option it evaluates on the run's own validation
/// set, rebuilt from the checkpoint.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// A checkpoint directory written by `mha train`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Evaluate on every sequence of this token file.
    #[arg(long, conflicts_with = "text")]
    pub tokens: Option<PathBuf>,
    /// Evaluate on this text file.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Sequences per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Compute dtype: f32, f64, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = super::parse_dtype)]
    pub dtype: DType,
    /// Also write `logits_check.safetensors` (the first batch's tokens, padding mask and
    /// logits) into the checkpoint, for `scripts/reference_model.py DIR` to compare in PyTorch.
    #[arg(long)]
    pub write_logits_check: bool,
}

/// Runs `mha eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    let (device, notice) = select_device(&args.device)?;
    eprintln!("{notice}");
    let ckpt = super::checkpoint_dir::open(&args.checkpoint, args.dtype, &device)?;
    let (name, dataset) = checkpoint_dataset(
        &args.checkpoint,
        args.tokens.as_deref(),
        args.text.as_deref(),
        ckpt.codec.clone(),
        ckpt.model.config().max_len + 1,
        RunSplit::Val,
    )?;
    let eval = evaluate(&ckpt.model, &dataset, args.batch_size, &device)?;
    println!("eval on {name} ({} sequences): {eval}", dataset.len());
    if args.write_logits_check {
        let batch = dataset
            .eval_batches(args.batch_size.min(8), &device)?
            .remove(0);
        let logits = ckpt
            .model
            .forward(&batch.input, Some(&batch.key_padding_mask))?;
        let path = args.checkpoint.join("logits_check.safetensors");
        StateDict::from_tensors([
            ("tokens".to_string(), batch.input.to_dtype(DType::I64)?),
            (
                "key_padding_mask".to_string(),
                batch.key_padding_mask.clone(),
            ),
            ("logits".to_string(), logits.to_dtype(DType::F32)?),
        ])
        .save_safetensors(&path)?;
        println!(
            "wrote {}: check it with scripts/reference_model.py {}",
            path.display(),
            args.checkpoint.display()
        );
    }
    Ok(())
}
