//! Opening a checkpoint directory written by `mha train`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device};
use candle_mha_train::data::{Codec, Corpus, DataSource, RunSplit};
use candle_mha_train::models::NextTokenPredictor;
use candle_mha_train::run::checkpoint_corpus;

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
        let text: Vec<PathBuf> = self.text.iter().cloned().collect();
        let source = DataSource::from_options(self.tokens.as_deref(), &text, self.data.as_deref())?;
        let (name, corpus) =
            checkpoint_corpus(&self.checkpoint, source.as_ref(), &ckpt.codec, len, split)?;
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

/// Opens the checkpoint directory ([`candle_mha_train::Checkpoint::open`]: one save, its
/// configuration bounded and sized against its weights; a directory without
/// `checkpoint.json` only with `--unverified`), checks the model with batches of `batch`
/// sequences against this machine's memory, and loads it strictly (the codec skipping unknown
/// text with `--skip-unknown`).
pub fn open(
    dir: &Path,
    read: &ReadOptions,
    dtype: DType,
    device: &Device,
    batch: usize,
) -> Result<Checkpoint> {
    let ckpt = candle_mha_train::Checkpoint::open(dir, trust(read.unverified))?;
    let cfg = &ckpt.config;
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
        if ckpt.weights_bytes > limit {
            anyhow::bail!(
                "{}: {} bytes, more than this machine's memory ({limit} bytes)",
                ckpt.weights_file.display(),
                ckpt.weights_bytes
            )
        }
    }
    let model = ckpt
        .model(dtype, device)
        .with_context(|| format!("loading {}", dir.display()))?;
    let codec = match read.skip_unknown {
        true => ckpt.codec.skipping_unknown(),
        false => ckpt.codec,
    };
    Ok(Checkpoint { model, codec })
}
