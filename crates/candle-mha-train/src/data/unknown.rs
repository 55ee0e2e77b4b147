//! Input a tokenizer cannot encode: characters it drops (a character vocabulary without
//! them) and words it maps to its unknown token. Found from the encoding's offsets, so that
//! no text is lost without the user hearing of it.

use std::sync::{Arc, Mutex};

use tokenizers::models::ModelWrapper;
use tokenizers::{Encoding, Tokenizer};

/// What encoding met that the tokenizer cannot represent: how many characters, and the first.
///
/// PyTorch equivalent: none (`tokenizers` drops or replaces them silently).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnknownInput {
    /// Characters dropped or replaced by the unknown token.
    pub chars: u64,
    /// The first of them (a dropped character, or the word the unknown token stands for).
    pub example: Option<String>,
}

impl UnknownInput {
    /// Adds `other`'s count (the first example kept).
    pub fn add(&mut self, other: &UnknownInput) {
        self.chars += other.chars;
        if self.example.is_none() {
            self.example.clone_from(&other.example);
        }
    }

    /// "3 characters the tokenizer cannot encode (the first: "é")".
    pub fn describe(&self) -> String {
        format!(
            "{} character{} the tokenizer cannot encode (the first: {})",
            self.chars,
            if self.chars == 1 { "" } else { "s" },
            candle_mha::io::quoted(self.example.as_deref().unwrap_or_default(), 20)
        )
    }
}

/// How a [`TextTokenizer`](super::TextTokenizer) treats unknown input: refused (the default),
/// or skipped and counted in a record its clones share.
#[derive(Clone, Debug, Default)]
pub(super) struct UnknownRule {
    pub(super) skip: bool,
    pub(super) seen: Arc<Mutex<UnknownInput>>,
}

impl UnknownRule {
    pub(super) fn record(&self, found: &UnknownInput) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(found);
    }

    pub(super) fn seen(&self) -> UnknownInput {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The unknown token of `tok`'s model and its id, if it has one.
fn unknown_token(tok: &Tokenizer) -> Option<(u32, String)> {
    let name = match tok.get_model() {
        ModelWrapper::BPE(m) => m.get_unk_token().clone()?,
        ModelWrapper::WordLevel(m) => m.unk_token.clone(),
        ModelWrapper::WordPiece(m) => m.unk_token.clone(),
        ModelWrapper::Unigram(_) => return None,
    };
    Some((tok.token_to_id(&name)?, name))
}

/// The input of `text` that `encoding` (of `text`, by `tok`) does not represent, and the
/// positions of the tokens standing for unknown words (to drop when skipping). A character
/// no token covers is dropped input (whitespace only where the tokenizer has neither a
/// normalizer nor a pre-tokenizer to split at it); a token with the unknown id whose text is
/// not the unknown token itself replaced input.
pub(super) fn find_unknown(
    tok: &Tokenizer,
    text: &str,
    encoding: &Encoding,
) -> (UnknownInput, Vec<usize>) {
    let mut found = UnknownInput::default();
    let mut note = |piece: &str, chars: u64| {
        found.chars += chars;
        if found.example.is_none() {
            found.example = Some(piece.to_string());
        }
    };
    let unk = unknown_token(tok);
    let mut unknown_at = Vec::new();
    let mut covered = vec![false; text.len()];
    for (i, (&id, &(a, b))) in encoding
        .get_ids()
        .iter()
        .zip(encoding.get_offsets())
        .enumerate()
    {
        let (a, b) = (a.min(text.len()), b.min(text.len()));
        covered[a..b.max(a)].iter_mut().for_each(|c| *c = true);
        if let Some((unk_id, name)) = &unk {
            let piece = text.get(a..b).unwrap_or_default();
            if id == *unk_id && piece != name {
                note(piece, piece.chars().count().max(1) as u64);
                unknown_at.push(i);
            }
        }
    }
    let splits_whitespace = tok.get_normalizer().is_some() || tok.get_pre_tokenizer().is_some();
    for (at, c) in text.char_indices() {
        let split_off = splits_whitespace && c.is_whitespace();
        if !covered[at] && !split_off {
            note(&c.to_string(), 1);
        }
    }
    (found, unknown_at)
}
