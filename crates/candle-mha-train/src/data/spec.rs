//! [`DataSpec`]: what a run trains on, recorded in its `trainer_state.json` so that a resumed
//! run, an evaluation or an analysis rebuilds the same data and split: the built-in synthetic
//! task, a token file, prepared token data, or (older runs) a text file cut into chunks.
//! [`DataSpec::load`] opens it as [`RunData`].

use std::path::{Path, PathBuf};

use candle::Result;
use serde::{Deserialize, Serialize};

use super::{
    encode_sequences, read_token_file, text_dataset, AssociativeRecall, Codec, Dataset, EvalSet,
    Example, TextTokenizer, TokenData, TokenWindows, TrainSource, Vocab, WindowSource,
};

/// Validation windows of prepared data evaluated at most (evenly spaced over the tail).
pub const DEFAULT_EVAL_WINDOWS: usize = 256;

/// A data source, as recorded in `trainer_state.json` (`"data"`).
///
/// PyTorch equivalent: none (a training script's own dataset arguments).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DataSpec {
    /// Associative recall, generated from a seed.
    Synthetic {
        /// Keys of the task's vocabulary.
        num_keys: usize,
        /// Values of the task's vocabulary.
        num_values: usize,
        /// Key-value pairs per sequence.
        pairs: usize,
        /// Training sequences.
        train_examples: usize,
        /// Validation sequences.
        val_examples: usize,
        /// The generator's seed.
        seed: u64,
    },
    /// One sequence of whitespace-separated symbols per line.
    Tokens {
        /// The token file.
        path: PathBuf,
        /// Share of the sequences held out for validation.
        val_fraction: f64,
        /// The split's seed.
        seed: u64,
    },
    /// Text cut into fixed chunks with a random split (runs made before prepared data; kept
    /// so they resume and evaluate as they were trained).
    Text {
        /// The text file.
        path: PathBuf,
        /// Share of the chunks held out for validation.
        val_fraction: f64,
        /// The split's seed.
        seed: u64,
    },
    /// A data directory written by `mha prepare` ([`TokenData`]): random training windows from
    /// `[0, train_tokens)`, fixed validation windows from the rest.
    Prepared {
        /// The data directory (in `trainer_state.json`: relative to the checkpoint directory
        /// when it lies inside the run, else absolute).
        dir: PathBuf,
        /// Tokens of the training part.
        train_tokens: u64,
        /// Validation windows evaluated at most (evenly spaced over the rest).
        eval_windows: usize,
        /// Ids in the data when the run began (`None`: runs recorded before it was); a data
        /// directory with another count is not the run's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        num_tokens: Option<u64>,
        /// The SHA-256 of `tokens.bin` its `meta.json` recorded when the run began (`None`:
        /// not recorded); a data directory recording another is not the run's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_sha256: Option<String>,
    },
}

/// Training and validation data and the tokenization, as [`DataSpec::load`] opens them.
pub struct RunData {
    /// What the steps draw from: a [`Dataset`] of sequences or a [`WindowSource`].
    pub train: Box<dyn TrainSource>,
    /// The validation set.
    pub val: Dataset,
    /// Bytes of text the validation targets stand for (text data only).
    pub val_bytes: Option<u64>,
    /// The tokenization.
    pub codec: Codec,
    /// Tokens per example the model must see (its context `max_len` is this minus 1).
    pub longest: usize,
}

impl RunData {
    /// The validation set as the trainer evaluates it.
    pub fn eval_set(&self) -> EvalSet<'_> {
        EvalSet {
            data: &self.val,
            text_bytes: self.val_bytes,
        }
    }

    /// Sequences split by `(val_fraction, seed)` into training and validation sets.
    fn split(data: Dataset, val_fraction: f64, seed: u64, codec: Codec) -> Self {
        let longest = data.max_len();
        let (train, val) = data.split(val_fraction, seed);
        Self {
            train: Box::new(train),
            val,
            val_bytes: None,
            codec,
            longest,
        }
    }
}

/// The UTF-8 bytes of text that the targets of `example` (every token but its first) stand
/// for; 0 unless `codec` is a text tokenizer.
pub fn example_text_bytes(codec: &Codec, example: &Example) -> Result<u64> {
    match codec {
        Codec::Text(tok) => Ok(tok.decode(&example.tokens[1..])?.len() as u64),
        Codec::Symbols(_) => Ok(0),
    }
}

/// The UTF-8 bytes of text that the targets of `examples` stand for; `None` unless `codec` is
/// a text tokenizer.
pub fn target_bytes(codec: &Codec, examples: &[Example]) -> Result<Option<u64>> {
    if !matches!(codec, Codec::Text(_)) {
        return Ok(None);
    }
    let mut bytes = 0u64;
    for e in examples {
        bytes += example_text_bytes(codec, e)?;
    }
    Ok(Some(bytes))
}

/// Opens prepared data, checking `codec` (a checkpoint's or a given tokenizer's) against it.
pub fn open_prepared(dir: &Path, codec: Option<&Codec>, what: &str) -> Result<(TokenData, Codec)> {
    let data = TokenData::open(dir)?;
    let codec = match codec {
        Some(c) => {
            data.check_codec(c, what)?;
            c.clone()
        }
        None => data.codec()?,
    };
    Ok((data, codec))
}

/// `path` lexically normalised: `.` dropped, `a/..` folded (no file system access).
fn normalise(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `path` absolute and canonical when it exists (else absolute and normalised).
pub(crate) fn absolute(path: &Path) -> Result<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    let cwd = std::env::current_dir()
        .map_err(|e| candle::Error::Msg(format!("the working directory: {e}")))?;
    Ok(normalise(&cwd.join(path)))
}

impl DataSpec {
    /// The paths it names, made absolute (canonical where they exist): what a run holds in
    /// memory, whatever the working directory later becomes.
    pub fn absolute(&self) -> Result<Self> {
        let mut spec = self.clone();
        match &mut spec {
            Self::Tokens { path, .. } | Self::Text { path, .. } => *path = absolute(path)?,
            Self::Prepared { dir, .. } => *dir = absolute(dir)?,
            Self::Synthetic { .. } => {}
        }
        Ok(spec)
    }

    /// As recorded in the `trainer_state.json` of checkpoint directory `ckpt`: a data
    /// directory inside the run (`ckpt`, or the run holding `ckpt` when it is the run's
    /// `best/`) relative to `ckpt`, so that the run can be moved; other paths as held
    /// (absolute).
    pub fn recorded_in(&self, ckpt: &Path) -> Self {
        let mut spec = self.clone();
        if let Self::Prepared { dir, .. } = &mut spec {
            let here = absolute(ckpt).unwrap_or_else(|_| ckpt.to_path_buf());
            let run = match here
                .file_name()
                .is_some_and(|n| n == crate::run_dir::BEST_DIR)
            {
                true => here.parent().map(Path::to_path_buf),
                false => None,
            };
            if let Ok(rel) = dir.strip_prefix(&here) {
                *dir = rel.to_path_buf();
            } else if let Some(rel) = run.as_deref().and_then(|r| dir.strip_prefix(r).ok()) {
                *dir = Path::new("..").join(rel);
            }
        }
        spec
    }

    /// The inverse of [`recorded_in`](Self::recorded_in): relative paths joined to `ckpt`.
    /// A link where a relative path leads is an error: what the run holds is read from the
    /// run, never through a link out of it.
    pub fn resolved_in(&self, ckpt: &Path) -> Result<Self> {
        let mut spec = self.clone();
        let join = |p: &mut PathBuf| -> Result<()> {
            if p.is_relative() {
                let joined = normalise(&ckpt.join(&*p));
                candle_mha::io::refuse_link(&joined)?;
                *p = absolute(&joined).unwrap_or(joined);
            }
            Ok(())
        };
        match &mut spec {
            Self::Tokens { path, .. } | Self::Text { path, .. } => join(path)?,
            Self::Prepared { dir, .. } => join(dir)?,
            Self::Synthetic { .. } => {}
        }
        Ok(spec)
    }

    /// Errors, naming what differs, unless `data` is the prepared data this spec was made
    /// from: the same number of ids and the same recorded SHA-256 of `tokens.bin` (where the
    /// spec recorded them), and at least `train_tokens` ids.
    pub fn check_prepared(&self, data: &TokenData) -> crate::RunResult<()> {
        let Self::Prepared {
            dir,
            train_tokens,
            num_tokens,
            tokens_sha256,
            ..
        } = self
        else {
            return Ok(());
        };
        let mismatch = |found: String, recorded: String| crate::RunError::DataMismatch {
            dir: dir.clone(),
            found,
            recorded,
        };
        if let Some(n) = num_tokens {
            if *n != data.len() {
                return Err(mismatch(format!("{} tokens", data.len()), n.to_string()));
            }
        }
        if let Some(want) = tokens_sha256 {
            let got = data.meta().tokens_sha256.as_deref().unwrap_or("none");
            if got != want {
                return Err(mismatch(
                    format!(
                        "tokens.bin's recorded SHA-256 is {}…",
                        &got[..12.min(got.len())]
                    ),
                    format!("{}…", &want[..12.min(want.len())]),
                ));
            }
        }
        if *train_tokens > data.len() {
            return Err(mismatch(
                format!("{} tokens", data.len()),
                format!("training on {train_tokens} tokens"),
            ));
        }
        Ok(())
    }
}

impl DataSpec {
    /// Loads the data. `codec` is the checkpoint's tokenization when resuming or evaluating
    /// (the vocabulary must not change); `None` builds it (a vocabulary, or `tokenizer` /
    /// a BPE of `bpe_vocab` ids for old-style text). `max_tokens` bounds a sequence (the
    /// model's context + 1) when known; prepared data needs it (its window length).
    pub fn load(
        &self,
        codec: Option<Codec>,
        tokenizer: Option<&Path>,
        bpe_vocab: usize,
        max_tokens: Option<usize>,
    ) -> crate::RunResult<RunData> {
        match self {
            Self::Synthetic {
                num_keys,
                num_values,
                pairs,
                train_examples,
                val_examples,
                seed,
            } => {
                let task = AssociativeRecall {
                    num_keys: *num_keys,
                    num_values: *num_values,
                    pairs: *pairs,
                };
                task.validate()?;
                let codec = codec.unwrap_or_else(|| Codec::Symbols(task.vocab()));
                let (train, val) = (
                    task.generate(*train_examples, *seed),
                    task.generate(*val_examples, seed ^ 0x5eed),
                );
                Ok(RunData {
                    train: Box::new(train),
                    val,
                    val_bytes: None,
                    codec,
                    longest: task.seq_len(),
                })
            }
            Self::Tokens {
                path,
                val_fraction,
                seed,
            } => {
                let seqs = read_token_file(path, max_tokens.unwrap_or(usize::MAX))?;
                let codec = match codec {
                    Some(c) => c,
                    None => Codec::Symbols(Vocab::build(seqs.iter().map(|s| s.as_slice()))),
                };
                let Codec::Symbols(vocab) = &codec else {
                    return Err(candle::Error::Msg(
                        "this checkpoint uses a text tokenizer: give it text, not a token file"
                            .to_string(),
                    )
                    .into());
                };
                if let Some(v) = seqs.iter().flatten().find(|s| vocab.id(s).is_none()) {
                    return Err(candle::Error::Msg(format!(
                        "{}: symbol \"{v}\" is not in the checkpoint's vocabulary",
                        path.display()
                    ))
                    .into());
                }
                let data = encode_sequences(&seqs, vocab);
                Ok(RunData::split(data, *val_fraction, *seed, codec))
            }
            Self::Text {
                path,
                val_fraction,
                seed,
            } => {
                let tok = match (codec, tokenizer) {
                    (Some(Codec::Text(t)), _) => *t,
                    (Some(Codec::Symbols(_)), _) => return Err(candle::Error::Msg(
                        "this checkpoint uses a symbol vocabulary: give it a token file, not text"
                            .to_string(),
                    )
                    .into()),
                    (None, Some(p)) => TextTokenizer::load(p)?,
                    (None, None) => TextTokenizer::train_bpe(path, bpe_vocab).map_err(|e| {
                        candle::Error::Msg(format!(
                            "training a BPE tokenizer on {}: {e}",
                            path.display()
                        ))
                    })?,
                };
                let window = max_tokens.unwrap_or(65);
                let data = text_dataset(path, &tok, window)?;
                Ok(RunData::split(
                    data,
                    *val_fraction,
                    *seed,
                    Codec::Text(Box::new(tok)),
                ))
            }
            Self::Prepared {
                dir,
                train_tokens,
                eval_windows,
                ..
            } => {
                let Some(window) = max_tokens else {
                    return Err(candle::Error::Msg(
                        "prepared data needs the model's context (max_tokens)".to_string(),
                    )
                    .into());
                };
                let what = match &codec {
                    Some(_) => "the checkpoint's tokenizer".to_string(),
                    None => format!("{}", dir.display()),
                };
                let (data, codec) = open_prepared(dir, codec.as_ref(), &what)?;
                self.check_prepared(&data)?;
                let windows =
                    TokenWindows::new(window as u64, 0..*train_tokens, *train_tokens..data.len())?;
                let val = windows.val_dataset(&data, *eval_windows)?;
                let val_bytes = target_bytes(&codec, &val.examples)?;
                Ok(RunData {
                    train: Box::new(WindowSource { data, windows }),
                    val,
                    val_bytes,
                    codec,
                    longest: window,
                })
            }
        }
    }
}
