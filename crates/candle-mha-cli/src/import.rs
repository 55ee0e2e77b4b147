//! `mha import`: a GPT-2-family checkpoint (a Hugging Face `GPT2LMHeadModel` directory, or
//! nanoGPT's `ckpt.pt`) into a run directory that every other command takes; with `--base RUN`,
//! PEFT's LoRA adapter directory into a LoRA run on `RUN`.

use std::path::PathBuf;

use anyhow::Result;
use candle_mha_train::formats::gpt2_names::Gpt2Format;
use candle_mha_train::formats::{detect, read_hugging_face, read_nanogpt};

/// Arguments of `mha import`.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A Hugging Face GPT-2 directory (config.json and model.safetensors, shards with their
    /// index, or pytorch_model.bin), or nanoGPT's ckpt.pt (or its out directory).
    pub source: PathBuf,
    /// The run directory to write (it must not hold a run).
    #[arg(long)]
    pub out: PathBuf,
    /// nanoGPT's meta.pkl (its data directory's character vocabulary: stoi/itos).
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// A tokenizers `tokenizer.json` (default: the source's own; without one, token ids).
    #[arg(long, conflicts_with = "meta")]
    pub tokenizer: Option<PathBuf>,
    /// SOURCE is PEFT's LoRA adapter directory (adapter_config.json and
    /// adapter_model.safetensors) trained on this run's model (its `--format hf` export):
    /// write a LoRA run on it.
    #[arg(long, value_name = "RUN", conflicts_with_all = ["meta", "tokenizer"])]
    pub base: Option<PathBuf>,
    /// With --base: read a base run that has no checkpoint.json.
    #[arg(long, requires = "base")]
    pub unverified: bool,
}

/// Runs `mha import`.
pub fn run(args: &ImportArgs) -> Result<()> {
    // Refused before the checkpoint is read: the run directory must be new.
    candle_mha_train::run::staged_dir::StagedDir::check(&args.out, "mha import")?;
    if let Some(base) = &args.base {
        let trust = crate::checkpoint_dir::trust(args.unverified);
        candle_mha_train::formats::import_peft(&args.source, base, &args.out, trust)?;
        println!(
            "imported the LoRA adapter {} into {} (a LoRA run on {})",
            args.source.display(),
            args.out.display(),
            base.display()
        );
        return Ok(());
    }
    let imported = match detect(&args.source)? {
        Gpt2Format::HuggingFace => {
            if args.meta.is_some() {
                anyhow::bail!("--meta is nanoGPT's vocabulary; a Hugging Face directory brings tokenizer.json (or give --tokenizer)")
            }
            read_hugging_face(&args.source, args.tokenizer.as_deref())?
        }
        Gpt2Format::NanoGpt => read_nanogpt(
            &args.source,
            args.meta.as_deref(),
            args.tokenizer.as_deref(),
        )?,
    };
    eprintln!("{}: {}", imported.source, imported.report);
    for note in &imported.notes {
        eprintln!("note: {note}");
    }
    let c = &imported.config;
    let arch = match c.llama_config()? {
        Some(l) => format!(
            "{}, {} query / {} key-value heads of {}, ",
            l.family.architecture(),
            l.num_heads,
            l.num_kv_heads,
            l.head_dim
        ),
        None => String::new(),
    };
    let done = format!(
        "imported into {}: {arch}{} blocks, embed_dim {}, {} heads, context {}, {} ids, {} parameters{}{}; step {}{}",
        args.out.display(),
        c.num_layers,
        c.embed_dim,
        c.num_heads,
        c.max_len,
        c.vocab_size,
        c.parameter_count(),
        if c.tie_embeddings { ", tied head" } else { "" },
        if c.bias { "" } else { ", no biases" },
        imported.step,
        if imported.optimizer.is_some() {
            ", with its optimizer state"
        } else {
            ""
        }
    );
    imported.write_run(&args.out)?;
    println!("{done}");
    Ok(())
}
