//! Where `mha train` / `mha eval` / `mha vocab-matrix` get their data: the built-in synthetic
//! task, a token file, prepared token data, or (old runs) a text file cut into chunks,
//! described in JSON so a checkpoint can rebuild the same split.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_mha::candle;
use candle_mha::data::{
    consecutive_windows, encode_sequences, read_token_file, text_dataset, AssociativeRecall, Codec,
    Dataset, Example, TextTokenizer, TextWindows, TokenData, TokenWindows, TrainSource, Vocab,
    WindowSource,
};
use serde::{Deserialize, Serialize};

/// Validation windows of prepared data evaluated at most (evenly spaced over the tail).
pub const DEFAULT_EVAL_WINDOWS: usize = 256;

/// A data source, as recorded in `trainer_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DataSpec {
    /// Associative recall, generated from a seed.
    Synthetic {
        num_keys: usize,
        num_values: usize,
        pairs: usize,
        train_examples: usize,
        val_examples: usize,
        seed: u64,
    },
    /// One sequence of whitespace-separated symbols per line.
    Tokens {
        path: PathBuf,
        val_fraction: f64,
        seed: u64,
    },
    /// Text cut into fixed chunks with a random split (runs made before prepared data; kept
    /// so they resume and evaluate as they were trained).
    Text {
        path: PathBuf,
        val_fraction: f64,
        seed: u64,
    },
    /// A data directory written by `mha prepare`: random training windows from
    /// `[0, train_tokens)`, fixed validation windows from the rest.
    Prepared {
        dir: PathBuf,
        train_tokens: u64,
        eval_windows: usize,
    },
}

/// What a run trains on.
pub enum TrainData {
    /// A finite set of sequences, shuffled per epoch.
    Sequences(Dataset),
    /// A token stream, random windows per step.
    Stream(Box<WindowSource>),
}

impl TrainData {
    /// As a [`TrainSource`] for the trainer.
    pub fn source(&self) -> &dyn TrainSource {
        match self {
            Self::Sequences(d) => d,
            Self::Stream(w) => w.as_ref(),
        }
    }

    /// A line for the log.
    pub fn describe(&self) -> String {
        match self {
            Self::Sequences(d) => format!("{} training", d.len()),
            Self::Stream(w) => format!(
                "{} training tokens (random windows of {}: {} offsets)",
                w.windows.train.end - w.windows.train.start,
                w.windows.len,
                w.windows.num_train_offsets()
            ),
        }
    }
}

/// Training and validation data and the tokenization.
pub struct Data {
    pub train: TrainData,
    pub val: Dataset,
    /// Bytes of text the validation targets stand for (text data only).
    pub val_bytes: Option<u64>,
    pub codec: Codec,
    /// Tokens per example the model must see (its context `max_len` is this minus 1).
    pub longest: usize,
}

impl Data {
    /// Sequences split by `(val_fraction, seed)` into training and validation sets.
    fn split(data: Dataset, val_fraction: f64, seed: u64, codec: Codec) -> Self {
        let longest = data.max_len();
        let (train, val) = data.split(val_fraction, seed);
        Self {
            train: TrainData::Sequences(train),
            val,
            val_bytes: None,
            codec,
            longest,
        }
    }
}

/// The UTF-8 bytes of text that the targets of `example` (every token but its first) stand
/// for; 0 unless `codec` is a text tokenizer.
pub fn example_text_bytes(codec: &Codec, example: &Example) -> candle::Result<u64> {
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

/// The data description a run recorded in its `trainer_state.json`.
pub fn run_data_spec(run: &Path) -> Result<DataSpec> {
    let path = run.join(candle_mha::training::STATE_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let state: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    serde_json::from_value(state["data"].clone()).with_context(|| {
        format!(
            "{} does not say what the run was trained on",
            path.display()
        )
    })
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
    ) -> Result<Data> {
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
                Ok(Data {
                    train: TrainData::Sequences(train),
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
                    bail!("this checkpoint uses a text tokenizer: use --text, not --tokens")
                };
                if let Some(v) = seqs.iter().flatten().find(|s| vocab.id(s).is_none()) {
                    bail!(
                        "{}: symbol \"{v}\" is not in the checkpoint's vocabulary",
                        path.display()
                    )
                }
                let data = encode_sequences(&seqs, vocab);
                Ok(Data::split(data, *val_fraction, *seed, codec))
            }
            Self::Text {
                path,
                val_fraction,
                seed,
            } => {
                let tok = match (codec, tokenizer) {
                    (Some(Codec::Text(t)), _) => *t,
                    (Some(Codec::Symbols(_)), _) => {
                        bail!("this checkpoint uses a symbol vocabulary: use --tokens, not --text")
                    }
                    (None, Some(p)) => TextTokenizer::load(p)?,
                    (None, None) => {
                        TextTokenizer::train_bpe(path, bpe_vocab).with_context(|| {
                            format!("training a BPE tokenizer on {}", path.display())
                        })?
                    }
                };
                let window = max_tokens.unwrap_or(65);
                let data = text_dataset(path, &tok, window)?;
                Ok(Data::split(
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
            } => {
                let window = max_tokens.context("prepared data needs the model's context")?;
                let what = match &codec {
                    Some(_) => "the checkpoint's tokenizer".to_string(),
                    None => format!("{}", dir.display()),
                };
                let (data, codec) = open_prepared(dir, codec.as_ref(), &what)?;
                if *train_tokens > data.len() {
                    bail!(
                        "{}: the run trained on {train_tokens} tokens but the data has {}: it was prepared again",
                        dir.display(),
                        data.len()
                    )
                }
                let windows =
                    TokenWindows::new(window as u64, 0..*train_tokens, *train_tokens..data.len())?;
                let val = windows.val_dataset(&data, *eval_windows)?;
                let val_bytes = target_bytes(&codec, &val.examples)?;
                Ok(Data {
                    train: TrainData::Stream(Box::new(WindowSource { data, windows })),
                    val,
                    val_bytes,
                    codec,
                    longest: window,
                })
            }
        }
    }
}

/// Which part of a run's own data to use when no file is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RunSplit {
    /// The training set.
    Train,
    /// The validation set.
    Val,
}

/// A corpus an evaluation or analysis command reads, streamed as examples of at most the
/// model's context + 1 tokens.
pub enum Corpus {
    /// Sequences in memory (token files, the synthetic task, old text runs, validation windows).
    Sequences(Dataset),
    /// A text file, encoded piece by piece.
    Text {
        path: PathBuf,
        tok: Box<TextTokenizer>,
    },
    /// A range of prepared tokens, as consecutive windows.
    Prepared {
        data: Box<TokenData>,
        range: std::ops::Range<u64>,
    },
}

impl Corpus {
    /// The examples, `len` tokens each at most (windows overlap by one token, so every token
    /// but the first is predicted once).
    pub fn examples(
        &self,
        len: usize,
    ) -> Result<Box<dyn Iterator<Item = candle::Result<Example>> + '_>> {
        Ok(match self {
            Self::Sequences(d) => Box::new(d.examples.iter().cloned().map(Ok)),
            Self::Text { path, tok } => Box::new(TextWindows::open(path, tok, len)?),
            Self::Prepared { data, range } => Box::new(
                consecutive_windows(range.clone(), len as u64, usize::MAX)
                    .into_iter()
                    .map(move |r| Ok(Example::full(data.tokens(r)?))),
            ),
        })
    }
}

/// The data an analysis or evaluation command reads: `tokens`, `text` or `data` when given
/// (encoded with, or checked against, the checkpoint's `codec`), else the run's own `split`
/// rebuilt from `trainer_state.json`. Returns a description for messages and the corpus.
pub fn checkpoint_corpus(
    checkpoint: &Path,
    tokens: Option<&Path>,
    text: Option<&Path>,
    data: Option<&Path>,
    codec: &Codec,
    max_tokens: usize,
    split: RunSplit,
) -> Result<(String, Corpus)> {
    if let Some(p) = tokens {
        let spec = DataSpec::Tokens {
            path: p.to_path_buf(),
            val_fraction: 0.0,
            seed: 0,
        };
        let TrainData::Sequences(d) = spec
            .load(Some(codec.clone()), None, 0, Some(max_tokens))?
            .train
        else {
            unreachable!("token files load as sequences")
        };
        return Ok((p.display().to_string(), Corpus::Sequences(d)));
    }
    if let Some(p) = text {
        let Codec::Text(tok) = codec else {
            bail!("this checkpoint uses a symbol vocabulary: use --tokens, not --text")
        };
        return Ok((
            p.display().to_string(),
            Corpus::Text {
                path: p.to_path_buf(),
                tok: tok.clone(),
            },
        ));
    }
    if let Some(dir) = data {
        let (d, _) = open_prepared(dir, Some(codec), "the checkpoint's tokenizer")?;
        let range = match split {
            RunSplit::Train => d.meta().train_range(),
            RunSplit::Val => d.meta().val_range(),
        };
        let name = format!(
            "{} ({} part, {} tokens)",
            dir.display(),
            if split == RunSplit::Train {
                "training"
            } else {
                "validation"
            },
            range.end - range.start
        );
        return Ok((
            name,
            Corpus::Prepared {
                data: Box::new(d),
                range,
            },
        ));
    }
    let spec = run_data_spec(checkpoint)
        .context("the checkpoint's own data cannot be rebuilt: pass --tokens, --text or --data")?;
    if let (
        DataSpec::Prepared {
            dir, train_tokens, ..
        },
        RunSplit::Train,
    ) = (&spec, split)
    {
        let (d, _) = open_prepared(dir, Some(codec), "the checkpoint's tokenizer")?;
        return Ok((
            "the run's training tokens".to_string(),
            Corpus::Prepared {
                data: Box::new(d),
                range: 0..*train_tokens,
            },
        ));
    }
    let data = spec.load(Some(codec.clone()), None, 0, Some(max_tokens))?;
    Ok(match split {
        RunSplit::Train => match data.train {
            TrainData::Sequences(d) => ("the run's training set".to_string(), Corpus::Sequences(d)),
            TrainData::Stream(_) => unreachable!("handled above"),
        },
        RunSplit::Val => (
            "the run's validation set".to_string(),
            Corpus::Sequences(data.val),
        ),
    })
}
