//! Opening a checkpoint directory written by `mha train`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions};
use candle_mha::zeroed_var_builder;
use candle_mha_train::data::{Codec, Corpus, RunSplit};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::run::checkpoint_corpus;
use candle_mha_train::run_dir::{CONFIG_FILE, MODEL_FILE};
use candle_nn::VarMap;

/// The options `mha eval` and `mha vocab-matrix` share: a checkpoint, the corpus to run it
/// over, the batch and the device.
#[derive(clap::Args, Debug)]
pub struct CorpusArgs {
    /// A checkpoint directory written by `mha train` (the run's directory, or its best/).
    #[arg(long)]
    pub checkpoint: PathBuf,
    #[command(flatten)]
    pub read: ReadOptions,
    /// Every sequence of this token file (default: the run's own data).
    #[arg(long, conflicts_with_all = ["text", "data"])]
    pub tokens: Option<PathBuf>,
    /// This text file (read and encoded piece by piece, any size).
    #[arg(long, conflicts_with = "data")]
    pub text: Option<PathBuf>,
    /// A data directory written by `mha prepare` with the checkpoint's tokenizer (eval: its
    /// validation part; vocab-matrix: its training part).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Sequences per batch.
    #[arg(long, default_value_t = 64, value_parser = super::bounds::count(1, super::bounds::MAX_COUNT))]
    pub batch_size: usize,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = super::choices::DeviceParser)]
    pub device: String,
}

impl CorpusArgs {
    /// Opens the device, the checkpoint in `dtype` and the corpus (`split` of the run's own
    /// data when no other is given).
    pub fn open(&self, dtype: DType, split: RunSplit) -> Result<CorpusRun> {
        let (device, notice) = crate::device::open(&self.device)?;
        eprintln!("{notice}");
        let ckpt = open(
            &self.checkpoint,
            &self.read,
            dtype,
            &device,
            self.batch_size,
        )?;
        let len = ckpt.model.config().max_len + 1;
        let (name, corpus) = checkpoint_corpus(
            &self.checkpoint,
            self.tokens.as_deref(),
            self.text.as_deref(),
            self.data.as_deref(),
            &ckpt.codec,
            len,
            split,
        )?;
        Ok(CorpusRun {
            ckpt,
            device,
            name,
            corpus,
            len,
        })
    }
}

/// What [`CorpusArgs::open`] opened.
pub struct CorpusRun {
    pub ckpt: Checkpoint,
    pub device: Device,
    /// The corpus as messages name it.
    pub name: String,
    pub corpus: Corpus,
    /// Tokens a window holds: the context plus the next-token target.
    pub len: usize,
}

/// How a command that reads a checkpoint directory treats what it cannot check or encode.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ReadOptions {
    /// Read a checkpoint directory that has no checkpoint.json (its files cannot be checked
    /// to be one save; refused without this).
    #[arg(long)]
    pub unverified: bool,
    /// Leave out text the tokenizer cannot encode (counted in a warning) instead of refusing
    /// it.
    #[arg(long)]
    pub skip_unknown: bool,
}

/// The [`Unverified`](candle_mha_train::Unverified) rule of an `--unverified` flag.
pub fn trust(unverified: bool) -> candle_mha_train::Unverified {
    match unverified {
        true => candle_mha_train::Unverified::Allow,
        false => candle_mha_train::Unverified::Refuse,
    }
}

/// A trained model and its tokenization.
pub struct Checkpoint {
    pub model: NextTokenPredictor,
    pub codec: Codec,
}

/// Loads `config.json`, `model.safetensors` (strictly: a config that does not match the
/// weights is an error with the load report) and the vocabulary or tokenizer, after checking
/// them against the checkpoint's `checkpoint.json`. What `config.json` says is bounded before
/// anything is built (a directory without `checkpoint.json` only with `--unverified`; the codec skipping unknown text with `--skip-unknown`): its sizes as the options' ranges, its parameters by the weights file's
/// size, and the model with batches of `batch` sequences by this machine's memory.
pub fn open(
    dir: &Path,
    read: &ReadOptions,
    dtype: DType,
    device: &Device,
    batch: usize,
) -> Result<Checkpoint> {
    let config = dir.join(CONFIG_FILE);
    if std::fs::symlink_metadata(&config).is_err() {
        anyhow::bail!(
            "cannot read model config {}: no such file; expected a checkpoint directory written by `mha train`",
            config.display()
        )
    }
    // The files below must be one checkpoint, not parts of two saves.
    candle_mha_train::verify_model_files(dir, trust(read.unverified))?;
    let cfg = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))?;
    // A LoRA run's weights are its base's (checked by hash when read) plus a small adapter.
    let path = match candle_mha_train::run::lora::LoraRecord::load(dir, &cfg)? {
        Some(record) => record.base.dir.join(MODEL_FILE),
        None => dir.join(MODEL_FILE),
    };
    let file_bytes = std::fs::metadata(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    // Every parameter takes at least 2 bytes in the file (bf16/f16; the trainer writes f32).
    let params = cfg.parameter_count();
    if u128::from(file_bytes) < params * 2 {
        anyhow::bail!(
            "{}: config.json describes a model of {params} parameters, but {MODEL_FILE} has only {file_bytes} bytes: they are not one checkpoint",
            dir.display()
        )
    }
    if let Some(limit) = crate::bounds::memory_limit() {
        let need = |b: usize| cfg.memory(dtype, b as u128 * cfg.max_len as u128, false);
        let batch = batch.max(1);
        let what = format!("running this model on batches of {batch} sequences");
        if let Err(e) = need(batch).check(limit, &what) {
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            // The largest batch that fits, if any: the user's next try.
            match (1..batch)
                .rev()
                .find(|b| need(*b).total() <= u128::from(limit))
            {
                Some(b) => anyhow::bail!("{first}; --batch-size {b} fits"),
                None => anyhow::bail!("{first}"),
            }
        }
        if file_bytes > limit {
            anyhow::bail!(
                "{}: {file_bytes} bytes, more than this machine's memory ({limit} bytes)",
                path.display()
            )
        }
    }
    let codec = Codec::load_dir(dir)?;
    if codec.vocab_size() > cfg.vocab_size {
        anyhow::bail!(
            "{}: the tokenization has {} ids but config.json says vocab_size {}",
            dir.display(),
            codec.vocab_size(),
            cfg.vocab_size
        )
    }
    // Zeros that take no memory until the checkpoint's tensors fill them, each freed once
    // copied: the model is held once, not twice, while it loads.
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(cfg.clone(), zeroed_var_builder(&varmap, dtype, device))?;
    let weights = candle_mha_train::run::lora::model_weights(dir, &cfg)?;
    let opts = LoadOptions::new()
        .with_module("NextTokenPredictor")
        .with_source(&path.display().to_string());
    load_into_varmap_owned(&varmap, weights, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    let codec = match read.skip_unknown {
        true => codec.skipping_unknown(),
        false => codec,
    };
    Ok(Checkpoint { model, codec })
}
