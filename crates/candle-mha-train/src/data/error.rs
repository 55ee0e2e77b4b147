//! [`DataError`]: why data could not be used, as variants a program can match (carried
//! through `candle::Error`: [`candle_mha::error::find`]).

use std::path::PathBuf;

/// The failures of opening data a caller may want to tell apart: a source that does not
/// exist, an id the vocabulary does not have, a tokenizer that is not the data's.
///
/// ```
/// use candle_mha_train::data::{expand_sources, DataError};
/// let err = expand_sources(&["no/such/corpus.txt".into()]).unwrap_err();
/// assert!(matches!(candle_mha::error::find(&err), Some(DataError::NotFound { .. })));
/// ```
///
/// PyTorch equivalent: the `FileNotFoundError` or `IndexError` a training script's dataset
/// raises.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file or directory the data names does not exist.
    #[error("{}: no such file or directory", .path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// Prepared tokens hold an id the vocabulary (or the tokenizer given for them) does not
    /// have.
    #[error("{}: {detail}", .path.display())]
    IdOutOfRange {
        /// The token file.
        path: PathBuf,
        /// The id.
        id: u64,
        /// Ids in the vocabulary.
        vocab: u64,
        /// The message's rest (where the id is, and what to do).
        detail: String,
    },
    /// The tokenizer given (or a checkpoint's) is not the one the data was made with.
    #[error("{what} does not match the data in {}: {detail}", .dir.display())]
    TokenizerMismatch {
        /// The data directory.
        dir: PathBuf,
        /// Which tokenizer ("the checkpoint's tokenizer", …).
        what: String,
        /// How they differ, and what to do.
        detail: String,
    },
}

impl From<DataError> for candle::Error {
    fn from(e: DataError) -> Self {
        candle_mha::error::typed(e)
    }
}
