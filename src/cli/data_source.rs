//! Where `mha train` / `mha eval` get their data: the built-in synthetic task, a token file or
//! a text file, described in JSON so a checkpoint can rebuild the same split.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_mha::data::{
    encode_sequences, read_token_file, text_dataset, AssociativeRecall, Codec, Dataset,
    TextTokenizer, Vocab,
};
use serde::{Deserialize, Serialize};

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
    /// Text through a tokenizer (given, or a BPE trained on the corpus).
    Text {
        path: PathBuf,
        val_fraction: f64,
        seed: u64,
    },
}

/// Training and validation sets and the tokenization.
pub struct Data {
    pub train: Dataset,
    pub val: Dataset,
    pub codec: Codec,
    /// Tokens per example the model must see (its context `max_len` is this minus 1).
    pub longest: usize,
}

impl DataSpec {
    /// Loads the data. `codec` is the checkpoint's tokenization when resuming or evaluating
    /// (the vocabulary must not change); `None` builds it (a vocabulary, or `tokenizer` /
    /// a BPE of `bpe_vocab` ids for text). `max_tokens` bounds a sequence (the model's
    /// context + 1) when known.
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
                    train,
                    val,
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
                let longest = data.max_len();
                let (train, val) = data.split(*val_fraction, *seed);
                Ok(Data {
                    train,
                    val,
                    codec,
                    longest,
                })
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
                let longest = data.max_len();
                let (train, val) = data.split(*val_fraction, *seed);
                Ok(Data {
                    train,
                    val,
                    codec: Codec::Text(Box::new(tok)),
                    longest,
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

/// The data an analysis or evaluation command reads: every sequence of `tokens` or `text`
/// when given (encoded with the checkpoint's `codec`), else the run's own `split` rebuilt from
/// `trainer_state.json`. Returns a description for messages and the dataset.
pub fn checkpoint_dataset(
    checkpoint: &Path,
    tokens: Option<&Path>,
    text: Option<&Path>,
    codec: Codec,
    max_tokens: usize,
    split: RunSplit,
) -> Result<(String, Dataset)> {
    let whole = |spec: DataSpec, path: &Path| -> Result<(String, Dataset)> {
        Ok((
            path.display().to_string(),
            spec.load(Some(codec.clone()), None, 0, Some(max_tokens))?
                .train,
        ))
    };
    match (tokens, text) {
        (Some(p), _) => whole(
            DataSpec::Tokens {
                path: p.to_path_buf(),
                val_fraction: 0.0,
                seed: 0,
            },
            p,
        ),
        (_, Some(p)) => whole(
            DataSpec::Text {
                path: p.to_path_buf(),
                val_fraction: 0.0,
                seed: 0,
            },
            p,
        ),
        _ => {
            let path = checkpoint.join(candle_mha::training::STATE_FILE);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let state: serde_json::Value = serde_json::from_str(&text)?;
            let spec: DataSpec = serde_json::from_value(state["data"].clone()).context(
                "the checkpoint does not say what it was trained on: pass --tokens or --text",
            )?;
            let data = spec.load(Some(codec), None, 0, Some(max_tokens))?;
            Ok(match split {
                RunSplit::Train => ("the run's training set".to_string(), data.train),
                RunSplit::Val => ("the run's validation set".to_string(), data.val),
            })
        }
    }
}
