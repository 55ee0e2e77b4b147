//! `mha info FILE`: what a checkpoint holds; `mha info DIR`: a data directory written by
//! `mha prepare` (checked: ids in range, `tokens.bin` against its SHA-256) or a checkpoint
//! directory (checked against its `checkpoint.json`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::checkpoint::{
    find_attention_modules, find_transformer_modules, CheckpointFormat, StateDict,
};

/// Arguments of `mha info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// A safetensors file or a PyTorch pickle (.pt, .pth, .bin), a data directory written by
    /// `mha prepare`, or a checkpoint directory written by `mha train`.
    pub file: PathBuf,
    /// Only the tensors under this prefix (e.g. `layers.0.self_attn`).
    #[arg(long, default_value = "")]
    pub prefix: String,
}

/// Prints the tensors, the attention modules and the Transformer layers, stacks and models of
/// a checkpoint.
pub fn run(args: &InfoArgs) -> Result<()> {
    if args.file.is_dir() {
        let dir = &args.file;
        if dir.join(candle_mha_train::data::META_FILE).exists() {
            return data_info(dir);
        }
        let model = dir.join(candle_mha_train::run_dir::MODEL_FILE);
        if model.exists() {
            candle_mha_train::verify_checkpoint(
                dir,
                &[candle_mha_train::run_dir::MODEL_FILE],
                candle_mha_train::Unverified::Allow,
            )?;
        }
        if !model.exists() {
            anyhow::bail!(
                "{} is a directory, but neither a data directory (meta.json) nor a checkpoint directory (model.safetensors); expected one of those, or a checkpoint file",
                dir.display()
            )
        }
        return run(&InfoArgs {
            file: model,
            prefix: args.prefix.clone(),
        });
    }
    let format = CheckpointFormat::detect(&args.file)?;
    let all =
        StateDict::load(&args.file).with_context(|| format!("mha info {}", args.file.display()))?;
    let sd = if args.prefix.is_empty() {
        all.clone()
    } else {
        all.under(&args.prefix)
    };
    let params: usize = sd.tensors().iter().map(|(_, t)| t.elem_count()).sum();
    println!(
        "{}: {format:?}, {} tensors, {params} parameters",
        args.file.display(),
        sd.len()
    );
    let mut meta: Vec<_> = all.metadata().iter().collect();
    meta.sort();
    for (k, v) in meta {
        println!("  metadata {k} = {v}");
    }
    let width = sd
        .tensors()
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let dtype = |t: &candle_mha::candle::Tensor| format!("{:?}", t.dtype()).to_lowercase();
    let dw = sd
        .tensors()
        .iter()
        .map(|(_, t)| dtype(t).len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!("\n{:<width$}  {:<dw$}  shape", "name", "dtype");
    for (name, t) in sd.tensors() {
        println!("{name:<width$}  {:<dw$}  {:?}", dtype(t), t.dims());
    }
    if !sd.skipped().is_empty() {
        println!("\nnot readable ({}):", sd.skipped().len());
        for (name, why) in sd.skipped() {
            println!("  {name}: {why}");
        }
    }
    let found = find_attention_modules(&all);
    println!("\nattention modules ({}):", found.len());
    for a in &found {
        println!("  {a}");
    }
    let transformers = find_transformer_modules(&all);
    if !transformers.is_empty() {
        println!("\nTransformer modules ({}):", transformers.len());
        for t in &transformers {
            println!("  {t}");
        }
    }
    Ok(())
}

/// Describes and checks a prepared data directory.
fn data_info(dir: &std::path::Path) -> Result<()> {
    let data = candle_mha_train::data::TokenData::open(dir)?;
    println!(
        "{}",
        candle_mha_train::data::describe_prepared(data.meta(), dir)
    );
    match data.verify()? {
        true => println!("tokens.bin: every id in range; SHA-256 matches meta.json"),
        false => println!(
            "tokens.bin: every id in range; no SHA-256 recorded (prepared by an older version)"
        ),
    }
    Ok(())
}
