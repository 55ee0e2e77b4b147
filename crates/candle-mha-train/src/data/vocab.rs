//! A symbol vocabulary: the four special symbols first, then every other symbol in the order it
//! was first seen.

use std::collections::HashMap;
use std::path::Path;

use candle::Result;

use candle_mha::io::write_atomic;

/// The padding symbol (id [`PAD_ID`]).
pub const PAD: &str = "<pad>";
/// The unknown-symbol symbol (id [`UNK_ID`]).
pub const UNK: &str = "<unk>";
/// The beginning-of-sequence symbol (id [`BOS_ID`]).
pub const BOS: &str = "<bos>";
/// The end-of-sequence symbol (id [`EOS_ID`]).
pub const EOS: &str = "<eos>";

/// The id of [`PAD`].
pub const PAD_ID: u32 = 0;
/// The id of [`UNK`].
pub const UNK_ID: u32 = 1;
/// The id of [`BOS`].
pub const BOS_ID: u32 = 2;
/// The id of [`EOS`].
pub const EOS_ID: u32 = 3;

/// The special symbols in id order.
const SPECIALS: [&str; 4] = [PAD, UNK, BOS, EOS];

/// A mapping between symbols and ids: ids 0..4 are [`PAD`], [`UNK`], [`BOS`], [`EOS`] in that
/// order, then the other symbols in first-seen order.
///
/// PyTorch equivalent: `torchtext.vocab.build_vocab_from_iterator(..., specials=[...])`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    symbols: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Vocab {
    /// A vocabulary holding only the four special symbols.
    fn specials_only() -> Self {
        let mut vocab = Vocab {
            symbols: Vec::new(),
            ids: HashMap::new(),
        };
        for s in SPECIALS {
            vocab.push(s);
        }
        vocab
    }

    /// Adds `symbol` unless it is already present.
    pub(crate) fn push(&mut self, symbol: &str) {
        if !self.ids.contains_key(symbol) {
            // A vocabulary never holds 2^32 symbols in practice; saturate rather than wrap.
            let id = u32::try_from(self.symbols.len()).unwrap_or(u32::MAX);
            self.ids.insert(symbol.to_string(), id);
            self.symbols.push(symbol.to_string());
        }
    }

    /// Builds the vocabulary of `sequences`: the specials, then each symbol in first-seen order.
    ///
    /// PyTorch equivalent: `torchtext.vocab.build_vocab_from_iterator(sequences, specials=[...])`
    /// (which orders by frequency instead).
    pub fn build<'a>(sequences: impl IntoIterator<Item = &'a [String]>) -> Self {
        let mut vocab = Self::specials_only();
        for seq in sequences {
            for s in seq {
                vocab.push(s);
            }
        }
        vocab
    }

    /// A vocabulary of the specials followed by `symbols` (duplicates and specials are skipped).
    ///
    /// PyTorch equivalent: `torchtext.vocab.vocab(OrderedDict(...), specials=[...])`.
    pub fn from_symbols(symbols: &[&str]) -> Self {
        let mut vocab = Self::specials_only();
        for s in symbols {
            vocab.push(s);
        }
        vocab
    }

    /// The number of symbols, specials included.
    ///
    /// PyTorch equivalent: `len(vocab)`.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether the vocabulary has no symbols (never true for one built here: the specials are
    /// always present).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The id of `symbol`, if present.
    ///
    /// PyTorch equivalent: `vocab[symbol]` (without a default index).
    pub fn id(&self, symbol: &str) -> Option<u32> {
        self.ids.get(symbol).copied()
    }

    /// The symbol with id `id`, if present.
    ///
    /// PyTorch equivalent: `vocab.lookup_token(id)`.
    pub fn symbol(&self, id: u32) -> Option<&str> {
        self.symbols.get(id as usize).map(String::as_str)
    }

    /// The symbols' ids; unknown symbols become [`UNK_ID`].
    ///
    /// PyTorch equivalent: `vocab.lookup_indices(symbols)` with `set_default_index(unk)`.
    pub fn encode(&self, symbols: &[&str]) -> Vec<u32> {
        symbols
            .iter()
            .map(|s| self.id(s).unwrap_or(UNK_ID))
            .collect()
    }

    /// The symbols' ids, or an error naming every unknown symbol (each once, in order).
    ///
    /// PyTorch equivalent: `vocab.lookup_indices(symbols)` without a default index.
    pub fn encode_strict(&self, symbols: &[&str]) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(symbols.len());
        let mut unknown: Vec<&str> = Vec::new();
        for s in symbols {
            match self.id(s) {
                Some(id) => ids.push(id),
                None => {
                    if !unknown.contains(s) {
                        unknown.push(s);
                    }
                }
            }
        }
        if unknown.is_empty() {
            Ok(ids)
        } else {
            let shown: Vec<String> = unknown.iter().take(20).map(|s| format!("{s:?}")).collect();
            let more = if unknown.len() > 20 {
                format!(" and {} more", unknown.len() - 20)
            } else {
                String::new()
            };
            Err(candle::Error::Msg(format!(
                "{} unknown symbol(s) not in the vocabulary of {} symbols: {}{more}; \
                 expected only symbols of the vocabulary",
                unknown.len(),
                self.len(),
                shown.join(", ")
            )))
        }
    }

    /// The ids' symbols; ids outside the vocabulary become [`UNK`].
    ///
    /// PyTorch equivalent: `vocab.lookup_tokens(ids)`.
    pub fn decode(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| self.symbol(id).unwrap_or(UNK).to_string())
            .collect()
    }

    /// Writes the vocabulary to `path` (`vocab.json`): a JSON array of the symbols in id order,
    /// written atomically.
    ///
    /// PyTorch equivalent: `torch.save(vocab, path)`.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, self.to_json()?.as_bytes())
    }

    /// The JSON [`Vocab::save`] writes.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(&self.symbols)
            .map_err(|e| candle::Error::Msg(format!("serializing the vocabulary: {e}")))
    }

    /// Reads a vocabulary written by [`Vocab::save`], checking that it is a JSON array of
    /// strings, that the four specials come first in order and that no symbol repeats.
    ///
    /// PyTorch equivalent: `torch.load(path)`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = candle_mha::io::read_input_string(path, crate::limits::MAX_JSON_BYTES)
            .map_err(|e| candle::Error::Msg(format!("reading vocabulary: {e}")))?;
        let symbols: Vec<String> = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!(
                "{}: not a vocabulary ({e}); expected a JSON array of strings \
                 beginning with {PAD:?}, {UNK:?}, {BOS:?}, {EOS:?}",
                path.display()
            ))
        })?;
        for (i, special) in SPECIALS.iter().enumerate() {
            match symbols.get(i) {
                Some(s) if s == special => {}
                Some(s) => {
                    return Err(candle::Error::Msg(format!(
                        "{}: entry {i} of the vocabulary is {s:?}; expected the special \
                         symbol {special:?} (the first four must be {PAD:?}, {UNK:?}, \
                         {BOS:?}, {EOS:?})",
                        path.display()
                    )))
                }
                None => {
                    return Err(candle::Error::Msg(format!(
                        "{}: the vocabulary has {} entries; expected at least the four \
                         specials {PAD:?}, {UNK:?}, {BOS:?}, {EOS:?}",
                        path.display(),
                        symbols.len()
                    )))
                }
            }
        }
        if u32::try_from(symbols.len()).is_err() {
            return Err(candle::Error::Msg(format!(
                "{}: the vocabulary has {} entries; expected at most {}",
                path.display(),
                symbols.len(),
                u32::MAX
            )));
        }
        let mut ids = HashMap::with_capacity(symbols.len());
        for (i, s) in symbols.iter().enumerate() {
            if let Some(first) = ids.insert(s.clone(), i as u32) {
                return Err(candle::Error::Msg(format!(
                    "{}: symbol {s:?} appears twice in the vocabulary (entries {first} and \
                     {i}); expected each symbol once",
                    path.display()
                )));
            }
        }
        Ok(Vocab { symbols, ids })
    }
}
