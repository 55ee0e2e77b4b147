//! [`Corpus`]: the data an evaluation or analysis reads from a checkpoint's run: a file given
//! for it, or the run's own split rebuilt from its [`DataSpec`](super::DataSpec).

use std::path::PathBuf;

use candle::Result;

use super::{consecutive_windows, Dataset, Example, TextTokenizer, TextWindows, TokenData};

/// Which part of a run's own data to use when no file is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        /// The text file.
        path: PathBuf,
        /// Its tokenizer (the checkpoint's).
        tok: Box<TextTokenizer>,
    },
    /// A range of prepared tokens, as consecutive windows.
    Prepared {
        /// The prepared data.
        data: Box<TokenData>,
        /// The tokens read.
        range: std::ops::Range<u64>,
    },
}

impl Corpus {
    /// The examples, `len` tokens each at most (windows overlap by one token, so every token
    /// but the first is predicted once).
    pub fn examples(&self, len: usize) -> Result<Box<dyn Iterator<Item = Result<Example>> + '_>> {
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
