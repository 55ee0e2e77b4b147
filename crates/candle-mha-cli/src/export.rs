//! `mha export`: a run's model as a Hugging Face GPT-2 directory that
//! `GPT2LMHeadModel.from_pretrained` loads.

use std::path::PathBuf;

use anyhow::Result;

/// Arguments of `mha export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// A run or checkpoint directory (e.g. RUN/best).
    pub run: PathBuf,
    /// The directory to write (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub out: PathBuf,
    /// The format: `hf`, a Hugging Face GPT2LMHeadModel directory.
    #[arg(long, default_value = "hf", value_parser = ["hf"])]
    pub format: String,
}

/// Runs `mha export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    candle_mha_train::export::export_hugging_face(&args.run, &args.out)?;
    println!(
        "exported {} to {} (Hugging Face GPT-2: GPT2LMHeadModel.from_pretrained)",
        args.run.display(),
        args.out.display()
    );
    Ok(())
}
