//! [`DataSource`]: what a user names as data, the one type behind `--tokens`, `--text` and
//! `--data` for every command (training, evaluation, analysis).

use std::path::{Path, PathBuf};

use candle::Result;

/// A token file, text files (files, directories or glob patterns), or a data directory
/// written by `mha prepare`. Training turns it into a [`NewData`](crate::NewData) with its
/// settings; evaluation and analysis read it as a [`Corpus`](super::Corpus)
/// ([`crate::run::checkpoint_corpus`]).
///
/// PyTorch equivalent: none (a training script's `--data` argument).
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// A token file: one sequence of whitespace-separated symbols per line.
    Tokens(PathBuf),
    /// Text: files, directories and glob patterns.
    Text(Vec<PathBuf>),
    /// A data directory written by `mha prepare` (or nanoGPT's `prepare.py`).
    Prepared(PathBuf),
}

impl DataSource {
    /// The source the options name (`--tokens`, `--text`, `--data`); `None` when none does.
    /// Errors when more than one does.
    pub fn from_options(
        tokens: Option<&Path>,
        text: &[PathBuf],
        data: Option<&Path>,
    ) -> Result<Option<Self>> {
        let given = [tokens.is_some(), !text.is_empty(), data.is_some()];
        if given.iter().filter(|g| **g).count() > 1 {
            candle::bail!("give one of --tokens, --text and --data, not several")
        }
        Ok(match (tokens, data) {
            (Some(p), _) => Some(Self::Tokens(p.to_path_buf())),
            (_, Some(d)) => Some(Self::Prepared(d.to_path_buf())),
            _ if !text.is_empty() => Some(Self::Text(text.to_vec())),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_from_the_options() {
        let p = Path::new("a.txt");
        assert_eq!(DataSource::from_options(None, &[], None).unwrap(), None);
        assert_eq!(
            DataSource::from_options(Some(p), &[], None).unwrap(),
            Some(DataSource::Tokens(p.into()))
        );
        assert_eq!(
            DataSource::from_options(None, &[p.into()], None).unwrap(),
            Some(DataSource::Text(vec![p.into()]))
        );
        let err = DataSource::from_options(Some(p), &[], Some(p)).unwrap_err();
        assert!(err.to_string().contains("one of"), "{err}");
    }
}
