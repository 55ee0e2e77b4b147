//! Token files: one sequence per line, whitespace-separated symbols.
//!
//! ```text
//! # comment lines and blank lines are skipped
//! 3 1 4 1 5
//! a b c
//! ```
//!
//! Numbers are just symbols: `"3"` gets whatever id the [`Vocab`] gives it.

use std::path::Path;

use candle::Result;

use super::dataset::Dataset;
use super::example::Example;
use super::vocab::{Vocab, BOS_ID, EOS_ID, UNK_ID};

/// The largest token file read into memory (larger corpora: `mha prepare`, then `--data`).
pub const MAX_TOKEN_FILE_BYTES: u64 = 1 << 32;

/// Reads the sequences of a token file: one per line, whitespace-separated symbols, skipping
/// blank lines and lines whose first non-blank character is `#`. The symbols are returned
/// without BOS/EOS; [`encode_sequences`] adds them, so each line becomes `BOS sym… EOS`.
///
/// Errors, naming the path: an unreadable file, a directory, a file that is not UTF-8, a file
/// with no sequence. A line whose symbols plus 2 (for BOS/EOS) exceed `max_tokens` is an error
/// naming its line number (1-based), its length and the limit.
///
/// PyTorch equivalent: none (a hand-written `Dataset.__init__` reading the file).
pub fn read_token_file(path: &Path, max_tokens: usize) -> Result<Vec<Vec<String>>> {
    if path.is_dir() {
        return Err(candle::Error::Msg(format!(
            "{} is a directory; expected a token file (one sequence of whitespace-separated \
             symbols per line)",
            path.display()
        )));
    }
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Err(super::DataError::NotFound {
            path: path.to_path_buf(),
        }
        .into());
    }
    let bytes = candle_mha::io::read_input(path, MAX_TOKEN_FILE_BYTES)
        .map_err(|e| candle::Error::Msg(format!("reading token file: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        candle::Error::Msg(format!(
            "{}:{line}: invalid UTF-8 at byte {at}; expected a UTF-8 text file",
            path.display()
        ))
    })?;
    let mut seqs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let symbols: Vec<String> = trimmed.split_whitespace().map(str::to_string).collect();
        let tokens = symbols.len().saturating_add(2);
        if tokens > max_tokens {
            return Err(candle::Error::Msg(format!(
                "{}:{}: the line has {} symbols, {tokens} tokens with BOS/EOS; expected at most \
                 max_tokens = {max_tokens} tokens",
                path.display(),
                i + 1,
                symbols.len()
            )));
        }
        seqs.push(symbols);
    }
    if seqs.is_empty() {
        return Err(candle::Error::Msg(format!(
            "{} contains no sequence (only blank or '#' lines); expected at least one line of \
             symbols",
            path.display()
        )));
    }
    Ok(seqs)
}

/// Encodes each sequence as `BOS ids… EOS` (unknown symbols become UNK) into an
/// [`Example::full`].
///
/// PyTorch equivalent: `[torch.tensor([bos] + vocab(seq) + [eos]) for seq in seqs]`.
pub fn encode_sequences(seqs: &[Vec<String>], vocab: &Vocab) -> Dataset {
    let examples = seqs
        .iter()
        .map(|seq| {
            let mut tokens = Vec::with_capacity(seq.len() + 2);
            tokens.push(BOS_ID);
            tokens.extend(seq.iter().map(|s| vocab.id(s).unwrap_or(UNK_ID)));
            tokens.push(EOS_ID);
            Example::full(tokens)
        })
        .filter(|e| e.tokens.len() >= 2)
        .collect();
    Dataset { examples }
}
