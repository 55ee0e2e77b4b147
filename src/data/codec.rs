//! [`Codec`]: how a checkpoint turns text into ids and back, whichever tokenization it uses.

use std::path::Path;

use candle::Result;

use super::{TextTokenizer, Vocab, BOS_ID, EOS_ID};

/// The file a symbol vocabulary is stored in, beside the model.
pub const VOCAB_FILE: &str = "vocab.json";
/// The file a `tokenizers` tokenizer is stored in, beside the model.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

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
    /// Reads `vocab.json` or `tokenizer.json` from a checkpoint directory.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let (vocab, tok) = (dir.join(VOCAB_FILE), dir.join(TOKENIZER_FILE));
        if vocab.exists() {
            Ok(Self::Symbols(Vocab::load(&vocab)?))
        } else if tok.exists() {
            Ok(Self::Text(Box::new(TextTokenizer::load(&tok)?)))
        } else {
            candle::bail!(
                "{} has neither {VOCAB_FILE} nor {TOKENIZER_FILE}",
                dir.display()
            )
        }
    }

    /// Writes it into a checkpoint directory (atomically).
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        match self {
            Self::Symbols(v) => v.save(&dir.join(VOCAB_FILE)),
            Self::Text(t) => t.save(&dir.join(TOKENIZER_FILE)),
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
        Ok(super::prepared::sha256_hex(self.to_json()?.as_bytes()))
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
}
