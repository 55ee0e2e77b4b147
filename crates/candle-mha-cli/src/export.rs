//! `mha export`: a run's model as a Hugging Face directory that `from_pretrained` loads
//! (`--format hf`: `GPT2LMHeadModel`, or a Llama-family run's own class), or as nanoGPT's
//! `ckpt.pt` that its `train.py` resumes (`--format nanogpt`), or a LoRA run's adapter as
//! PEFT's directory (`--format peft`). A LoRA run's `hf` and `nanogpt` exports are its
//! merged model.

use std::path::PathBuf;

use anyhow::Result;

use crate::checkpoint_dir::trust;

/// Arguments of `mha export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// A run or checkpoint directory (e.g. RUN/best).
    pub run: PathBuf,
    /// The directory to write, new or empty: `hf` writes config.json, model.safetensors and
    /// tokenizer.json; `nanogpt` writes ckpt.pt. It appears whole or not at all.
    #[arg(long)]
    pub out: PathBuf,
    /// The format: `hf`, a Hugging Face directory (GPT2LMHeadModel; a Llama-family run's own
    /// class, its weights in their source dtypes); `nanogpt`, nanoGPT's
    /// OUT/ckpt.pt (model, model_args, optimizer, iter_num, best_val_loss, config); `peft`, a
    /// LoRA run's adapter_config.json and adapter_model.safetensors (PeftModel.from_pretrained
    /// on the base run's `hf` export). A LoRA run's `hf` and `nanogpt` are its merged model.
    #[arg(long, default_value = "hf", value_parser = ["hf", "nanogpt", "peft"])]
    pub format: String,
    /// Read a checkpoint directory that has no checkpoint.json (its files cannot be checked
    /// to be one save; refused without this).
    #[arg(long)]
    pub unverified: bool,
}

/// Runs `mha export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    let how = match args.format.as_str() {
        "nanogpt" => {
            candle_mha_train::formats::export_nanogpt(
                &args.run,
                &args.out,
                trust(args.unverified),
            )?;
            "nanoGPT: ckpt.pt, train.py init_from=\"resume\"".to_string()
        }
        "peft" => {
            candle_mha_train::formats::export_peft(&args.run, &args.out, trust(args.unverified))?;
            "PEFT: PeftModel.from_pretrained(base, out), base the base run's --format hf export"
                .to_string()
        }
        _ => {
            let class = candle_mha_train::formats::export_hugging_face(
                &args.run,
                &args.out,
                trust(args.unverified),
            )?;
            format!("Hugging Face: {class}.from_pretrained")
        }
    };
    println!(
        "exported {} to {} ({how})",
        args.run.display(),
        args.out.display()
    );
    Ok(())
}
