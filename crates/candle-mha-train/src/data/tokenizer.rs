//! [`Codec`]: how a checkpoint turns text into ids and back, whichever tokenization it uses.

use crate::run_dir::{TOKENIZER_FILE, VOCAB_FILE};
use std::path::Path;

use candle::Result;

use super::{TextTokenizer, UnknownInput, Vocab, BOS_ID, EOS_ID};

/// A checkpoint's tokenization: whitespace-separated symbols with a [`Vocab`], or text with a
/// [`TextTokenizer`].
///
/// PyTorch equivalent: the tokenizer saved beside a model (`tokenizer.save_pretrained`).
#[derive(Clone)]
pub enum Codec {
    /// Symbols (`vocab.json`).
    Symbols(Vocab),
    /// Text (`tokenizer.json`); boxed, a tokenizer is large.
    Text(Box<TextTokenizer>),
}

impl Codec {
    /// The tokenization file [`load_dir`](Self::load_dir) reads in `dir`: `vocab.json` when
    /// present, else `tokenizer.json`; an error when neither is.
    pub fn file_in(dir: &Path) -> Result<&'static str> {
        let present = |name: &str| std::fs::symlink_metadata(dir.join(name)).is_ok();
        if present(VOCAB_FILE) {
            Ok(VOCAB_FILE)
        } else if present(TOKENIZER_FILE) {
            Ok(TOKENIZER_FILE)
        } else {
            candle::bail!(
                "{} has neither {VOCAB_FILE} nor {TOKENIZER_FILE}",
                dir.display()
            )
        }
    }

    /// Reads `vocab.json` or `tokenizer.json` from a checkpoint directory.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        match Self::file_in(dir)? {
            VOCAB_FILE => Ok(Self::Symbols(Vocab::load(&dir.join(VOCAB_FILE))?)),
            _ => Ok(Self::Text(Box::new(TextTokenizer::load(
                &dir.join(TOKENIZER_FILE),
            )?))),
        }
    }

    /// Writes it into a checkpoint directory (atomically).
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        match self {
            Self::Symbols(v) => v.save(&dir.join(VOCAB_FILE)),
            Self::Text(t) => t.save(&dir.join(TOKENIZER_FILE)),
        }
    }

    /// The file [`Codec::save_dir`] writes in a directory: `vocab.json` or `tokenizer.json`.
    pub fn file_name(&self) -> &'static str {
        match self {
            Self::Symbols(_) => VOCAB_FILE,
            Self::Text(_) => TOKENIZER_FILE,
        }
    }

    /// The JSON that [`Codec::save_dir`] writes (`vocab.json` or `tokenizer.json`).
    pub fn to_json(&self) -> Result<String> {
        match self {
            Self::Symbols(v) => v.to_json(),
            Self::Text(t) => t.to_json(),
        }
    }

    /// SHA-256 (hex) of [`Codec::to_json`]: two tokenizations with the same fingerprint give
    /// the same ids. Prepared data records it, so a checkpoint or tokenizer that does not
    /// match the data is caught.
    pub fn fingerprint(&self) -> Result<String> {
        Ok(crate::checksum::sha256_hex(self.to_json()?.as_bytes()))
    }

    /// This tokenization leaving out text it cannot encode instead of refusing it
    /// ([`TextTokenizer::skipping_unknown`]); symbols are always checked whole.
    pub fn skipping_unknown(self) -> Self {
        match self {
            Self::Text(t) => Self::Text(Box::new(t.skipping_unknown())),
            symbols => symbols,
        }
    }

    /// What encoding text left out so far ([`TextTokenizer::unknown_skipped`]); `None` when
    /// nothing was.
    pub fn unknown_skipped(&self) -> Option<UnknownInput> {
        match self {
            Self::Text(t) => Some(t.unknown_skipped()).filter(|u| u.chars > 0),
            Self::Symbols(_) => None,
        }
    }

    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Symbols(v) => v.len(),
            Self::Text(t) => t.vocab_size(),
        }
    }

    /// The beginning-of-sequence id, if the tokenization has one.
    pub fn bos_id(&self) -> Option<u32> {
        match self {
            Self::Symbols(_) => Some(BOS_ID),
            Self::Text(t) => t.bos_id(),
        }
    }

    /// The end-of-sequence id, if the tokenization has one.
    pub fn eos_id(&self) -> Option<u32> {
        match self {
            Self::Symbols(_) => Some(EOS_ID),
            Self::Text(t) => t.eos_id(),
        }
    }

    /// A prompt as ids, BOS first: symbols must all be known (the error names the unknown
    /// ones); text goes through the tokenizer.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let body = match self {
            Self::Symbols(v) => v.encode_strict(&prompt.split_whitespace().collect::<Vec<_>>())?,
            Self::Text(t) => t.encode(prompt)?,
        };
        Ok(self.bos_id().into_iter().chain(body).collect())
    }

    /// A readable label for one id (a symbol, or the tokenizer's token string; specials as
    /// `<bos>` etc.), for tables and plots.
    pub fn token_label(&self, id: u32) -> String {
        match self {
            Self::Symbols(v) => v.symbol(id).map(str::to_string),
            Self::Text(t) => t
                .inner()
                .id_to_token(id)
                .map(|s| s.replace('Ġ', "_").replace('Ċ', "\\n")),
        }
        .unwrap_or_else(|| format!("#{id}"))
    }

    /// Ids as text: symbols joined by spaces (specials dropped), or the tokenizer's decoding.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Self::Symbols(v) => {
                let ids: Vec<u32> = ids.iter().copied().filter(|&i| i > EOS_ID).collect();
                Ok(v.decode(&ids).join(" "))
            }
            Self::Text(t) => t.decode(ids),
        }
    }

    /// The text that `continuation` adds after `prompt` (ids as given to and returned by
    /// [`generate`](crate::models::generate)), to append to the prompt as typed.
    ///
    /// Text: `prompt` and `continuation` are decoded together and the decoded prompt is cut
    /// off the front, so a decoder that treats the first token specially (SentencePiece's
    /// `▁`, a leading space it drops) or a character whose bytes straddle the two reads
    /// right; when the decoded prompt is not a prefix of the whole, `continuation` is decoded
    /// alone. Symbols: [`decode`](Self::decode) of `continuation` (symbols are joined by
    /// spaces, the caller puts the separator).
    ///
    /// PyTorch equivalent: `tokenizer.decode(prompt + new, skip_special_tokens=True)
    /// [len(tokenizer.decode(prompt, skip_special_tokens=True)):]`.
    pub fn decode_continuation(&self, prompt: &[u32], continuation: &[u32]) -> Result<String> {
        if let Self::Text(_) = self {
            let whole: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
            let (whole, head) = (self.decode(&whole)?, self.decode(prompt)?);
            if let Some(rest) = whole.strip_prefix(head.as_str()) {
                return Ok(rest.to_string());
            }
        }
        self.decode(continuation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer with SentencePiece's `▁` pre-tokenizer and decoder: decoding
    /// drops the `▁` (the space) of the first token.
    fn metaspace_codec() -> Codec {
        let json = r#"{
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "post_processor": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                              "prepend_scheme": "always", "split": true},
            "decoder": {"type": "Metaspace", "replacement": "▁",
                        "prepend_scheme": "always", "split": true},
            "model": {"type": "WordLevel", "unk_token": "<unk>",
                      "vocab": {"<unk>": 0, "▁The": 1, "▁license": 2, "▁is": 3,
                                "▁granted": 4, "▁to": 5, "▁café": 6}}
        }"#;
        let tok: tokenizers::Tokenizer = json.parse().unwrap();
        Codec::Text(Box::new(TextTokenizer::from_tokenizer(tok)))
    }

    #[test]
    fn continuation_keeps_the_space_a_lone_decode_drops() -> Result<()> {
        let codec = metaspace_codec();
        let prompt = codec.encode_prompt("The license is")?;
        assert_eq!(prompt, [1, 2, 3]);
        // Alone, the continuation loses its leading space: appended to the prompt it would
        // read "The license isgranted to".
        assert_eq!(codec.decode(&[4, 5])?, "granted to");
        assert_eq!(codec.decode_continuation(&prompt, &[4, 5])?, " granted to");
        assert_eq!(codec.decode_continuation(&prompt, &[6])?, " café");
        assert_eq!(codec.decode_continuation(&prompt, &[])?, "");
        // An id the tokenizer does not know is an error naming it.
        let e = codec.decode_continuation(&prompt, &[99]).unwrap_err();
        assert!(e.to_string().contains("id 99"), "{e}");
        Ok(())
    }

    #[test]
    fn symbols_continuation_is_the_decoded_symbols() -> Result<()> {
        let vocab = Vocab::from_symbols(&["a", "b", "c"]);
        let codec = Codec::Symbols(vocab);
        let prompt = codec.encode_prompt("a b")?;
        let new = codec.encode_prompt("c a")?[1..].to_vec();
        assert_eq!(codec.decode_continuation(&prompt, &new)?, "c a");
        Ok(())
    }
}
