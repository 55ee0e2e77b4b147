//! Text through the `tokenizers` crate: load a `tokenizer.json` or train a byte-level BPE, and
//! cut a corpus into training windows.

use std::path::Path;

use candle::Result;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, NormalizerWrapper, PostProcessorWrapper, Tokenizer, TokenizerBuilder,
};

use super::dataset::Dataset;
use super::example::Example;
use super::tokenizer_check::{check_tokenizer_json, MAX_TOKENIZER_BYTES};
use super::unknown::{find_unknown, UnknownInput, UnknownRule};
use super::vocab::{BOS, EOS, PAD, UNK};
use candle_mha::io::write_atomic;

/// The symbols looked up, in order, for [`TextTokenizer::pad_id`].
const PAD_NAMES: [&str; 3] = [PAD, "[PAD]", "<|pad|>"];
/// The symbols looked up, in order, for [`TextTokenizer::bos_id`].
const BOS_NAMES: [&str; 4] = [BOS, "<s>", "<|begin_of_text|>", "<|startoftext|>"];
/// The symbols looked up, in order, for [`TextTokenizer::eos_id`].
const EOS_NAMES: [&str; 4] = [EOS, "</s>", "<|end_of_text|>", "<|endoftext|>"];

/// The number of ids byte-level BPE needs before any merge: 4 specials and 256 bytes.
pub const MIN_BPE_VOCAB: usize = 4 + 256;

/// The largest vocabulary a BPE is trained to, and the largest id a loaded tokenizer may
/// hold (the tables of a tokenizer and of prepared data grow with the largest id).
pub const MAX_BPE_VOCAB: usize = 1 << 20;

/// Errors unless `vocab_size` leaves room for the specials and the 256 bytes and is at most
/// [`MAX_BPE_VOCAB`].
fn check_bpe_vocab(vocab_size: usize) -> Result<()> {
    if !(MIN_BPE_VOCAB..=MAX_BPE_VOCAB).contains(&vocab_size) {
        candle::bail!(
            "BPE vocab_size {vocab_size}: expected {MIN_BPE_VOCAB} (4 special tokens + 256 \
             bytes) to {MAX_BPE_VOCAB}"
        )
    }
    Ok(())
}

/// A text tokenizer (a wrapped [`tokenizers::Tokenizer`]).
///
/// PyTorch equivalent: `tokenizers.Tokenizer` / `transformers.PreTrainedTokenizerFast`.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    unknown: UnknownRule,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

/// Reads `path` (at most `max_bytes`) as UTF-8 text, with errors naming the path.
fn read_text(path: &Path, what: &str, max_bytes: u64) -> Result<String> {
    if path.is_dir() {
        return Err(candle::Error::Msg(format!(
            "{} is a directory; expected a {what} file",
            path.display()
        )));
    }
    let bytes = candle_mha::io::read_input(path, max_bytes)
        .map_err(|e| candle::Error::Msg(format!("reading {what}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        candle::Error::Msg(format!(
            "{}:{line}: invalid UTF-8 at byte {at}; expected a UTF-8 {what} file",
            path.display()
        ))
    })
}

/// Builds a tokenizer from the text of a `tokenizer.json` (`source` names it), checked first
/// ([`check_tokenizer_json`]); a panic inside the `tokenizers` crate becomes an error.
fn parse_tokenizer(text: &str, source: &str) -> Result<Tokenizer> {
    check_tokenizer_json(text, source)?;
    let parsed = catch_panic(source, || text.parse::<Tokenizer>())?;
    parsed.map_err(|e| {
        candle::Error::Msg(format!(
            "{source}: not a tokenizer ({e}); expected a tokenizers `tokenizer.json`"
        ))
    })
}

/// `f()`, or an error naming `source` when it panics: the `tokenizers` crate panics on some
/// inputs it does not expect.
fn catch_panic<T>(source: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let why = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        candle::Error::Msg(format!(
            "{source}: the tokenizers crate failed on it ({why}); expected a consistent tokenizer"
        ))
    })
}

impl TextTokenizer {
    /// A tokenizer whose tokens are the ids themselves (`"17 4 9"`), for a model that comes
    /// without one: prompts and outputs are then written as ids.
    pub fn ids(vocab_size: usize) -> Result<Self> {
        let vocab: serde_json::Map<String, serde_json::Value> = (0..vocab_size)
            .map(|i| (i.to_string(), serde_json::Value::from(i)))
            .collect();
        Self::from_json_value(serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "0"}
        }))
    }

    /// A character-level tokenizer: `itos[i]` is the character of id `i` (nanoGPT's
    /// `meta.pkl`), every character of a text one token, decoding their concatenation; a
    /// character outside the vocabulary is an error when encoding.
    pub fn characters(itos: &[String]) -> Result<Self> {
        let vocab: serde_json::Map<String, serde_json::Value> = itos
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), serde_json::Value::from(i)))
            .collect();
        if vocab.len() != itos.len() {
            candle::bail!("the vocabulary names a character twice")
        }
        Self::from_json_value(serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Fuse"},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": []}
        }))
    }

    fn from_json_value(json: serde_json::Value) -> Result<Self> {
        let inner = parse_tokenizer(&json.to_string(), "the tokenizer")
            .map_err(|e| candle::Error::Msg(format!("building a tokenizer: {e}")))?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Wraps an existing [`tokenizers::Tokenizer`].
    pub fn from_tokenizer(inner: Tokenizer) -> Self {
        TextTokenizer {
            inner,
            unknown: UnknownRule::default(),
        }
    }

    /// The wrapped [`tokenizers::Tokenizer`].
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Loads a `tokenizer.json` (the format of Hugging Face `tokenizers`).
    ///
    /// PyTorch equivalent: `tokenizers.Tokenizer.from_file(path)`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_text(path, "tokenizer.json", MAX_TOKENIZER_BYTES)?;
        let inner = parse_tokenizer(&text, &path.display().to_string())?;
        let tok = Self::from_tokenizer(inner);
        tok.check_largest_id(&path.display().to_string())?;
        Ok(tok)
    }

    /// GPT-2's byte-level BPE from the two files of its slow tokenizer (`GPT2Tokenizer`'s
    /// `save_pretrained`: `vocab.json`, token → id, and `merges.txt`, one merge a line after an
    /// optional `#version` line), built as `GPT2TokenizerFast` builds it: ByteLevel
    /// pre-tokenizer (no prefix space) and decoder, `"<|endoftext|>"` a special token when the
    /// vocabulary has it, and `added_tokens` (token → id: the directory's `added_tokens.json`)
    /// added as plain tokens, matched whole and kept by [`decode`](Self::decode).
    ///
    /// PyTorch equivalent: `transformers.GPT2Tokenizer.from_pretrained(dir)` on a directory
    /// with these files and no `tokenizer.json`.
    pub fn gpt2_files(vocab: &Path, merges: &Path, added_tokens: &[(String, u32)]) -> Result<Self> {
        let vocab_text = read_text(vocab, "vocab.json", MAX_TOKENIZER_BYTES)?;
        let vocab_map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&vocab_text).map_err(|e| {
                candle::Error::Msg(format!(
                    "{}: not a vocabulary ({e}); expected a JSON object of token → id",
                    vocab.display()
                ))
            })?;
        for (token, id) in &vocab_map {
            match id.as_u64() {
                Some(id) if id < MAX_BPE_VOCAB as u64 => {}
                _ => candle::bail!(
                    "{}: token {token:?} has id {id}; expected an id below {MAX_BPE_VOCAB}",
                    vocab.display()
                ),
            }
        }
        let merges_text = read_text(merges, "merges.txt", MAX_TOKENIZER_BYTES)?;
        let mut pairs = Vec::new();
        for (i, line) in merges_text.lines().enumerate() {
            if (i == 0 && line.starts_with("#version")) || line.trim().is_empty() {
                continue;
            }
            let Some((a, b)) = line.split_once(' ') else {
                candle::bail!(
                    "{}:{}: {line:?} is not a merge; expected two tokens separated by a space",
                    merges.display(),
                    i + 1
                )
            };
            pairs.push(serde_json::json!([a, b]));
        }
        // As transformers adds them: the end of text special and unnormalised, the directory's
        // added tokens plain (kept by decoding).
        let token = |content: &str, id: u64, special: bool| {
            serde_json::json!({"id": id, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": !special, "special": special})
        };
        let mut added: Vec<serde_json::Value> = Vec::new();
        if let Some(id) = vocab_map.get("<|endoftext|>").and_then(|v| v.as_u64()) {
            added.push(token("<|endoftext|>", id, true));
        }
        for (content, id) in added_tokens {
            if content != "<|endoftext|>" {
                added.push(token(content, u64::from(*id), false));
            }
        }
        let byte_level = |add_prefix_space: bool, trim_offsets: bool| {
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space,
                "trim_offsets": trim_offsets, "use_regex": true})
        };
        let tok = Self::from_json_value(serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": byte_level(false, true),
            "post_processor": byte_level(true, false), "decoder": byte_level(true, true),
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab_map, "merges": pairs}
        }))
        .map_err(|e| {
            candle::Error::Msg(format!("{} and {}: {e}", vocab.display(), merges.display()))
        })?;
        tok.check_largest_id("added tokens")?;
        Ok(tok)
    }

    /// Errors, naming `source` and the token, when an id is [`MAX_BPE_VOCAB`] or more: ids
    /// index tables sized by the largest one.
    fn check_largest_id(&self, source: &str) -> Result<()> {
        let vocab = self.inner.get_vocab(true);
        if let Some((token, id)) = vocab.into_iter().max_by_key(|(_, id)| *id) {
            if id as usize >= MAX_BPE_VOCAB {
                candle::bail!(
                    "{source}: token {token:?} has id {id}; expected ids below {MAX_BPE_VOCAB}"
                )
            }
        }
        Ok(())
    }

    /// Trains a byte-level BPE (ByteLevel pre-tokenizer and decoder, no prefix space, so
    /// decoding gives the text back exactly) on the text of `corpus`, with the special tokens
    /// `"<pad>"`, `"<unk>"`, `"<bos>"`, `"<eos>"` at ids 0..3 and at most `vocab_size` ids
    /// (at least 260: the 4 specials and the 256 bytes; e.g. 512).
    ///
    /// PyTorch equivalent: `tokenizers.ByteLevelBPETokenizer().train([corpus], vocab_size,
    /// special_tokens=[...])`.
    pub fn train_bpe(corpus: &Path, vocab_size: usize) -> Result<Self> {
        check_bpe_vocab(vocab_size)?;
        let text = read_text(corpus, "corpus", crate::limits::MAX_JSON_BYTES)?;
        if text.is_empty() {
            return Err(candle::Error::Msg(format!(
                "corpus {} is empty; expected some text to train a BPE on",
                corpus.display()
            )));
        }
        Self::train_bpe_on(std::iter::once(text), vocab_size)
            .map_err(|e| candle::Error::Msg(format!("training a BPE on {}: {e}", corpus.display())))
    }

    /// Trains the byte-level BPE of [`TextTokenizer::train_bpe`] on a sample of the text
    /// files `files`: about `sample_bytes` in all, each file contributing from its start in
    /// proportion to its size (whole files when they fit), read in pieces. Errors name the
    /// file (empty, unreadable, not UTF-8).
    ///
    /// PyTorch equivalent: `ByteLevelBPETokenizer().train_from_iterator(sample, vocab_size)`.
    pub fn train_bpe_on_files(
        files: &[std::path::PathBuf],
        vocab_size: usize,
        sample_bytes: u64,
    ) -> Result<Self> {
        check_bpe_vocab(vocab_size)?;
        let sizes = super::text_chunks::text_file_sizes(files)?;
        let total: u64 = sizes.iter().sum();
        let mut sample = Vec::new();
        for (f, &size) in files.iter().zip(&sizes) {
            let share = if total <= sample_bytes {
                size
            } else {
                ((size as f64 / total as f64) * sample_bytes as f64).ceil() as u64
            };
            let mut taken = 0u64;
            for piece in super::TextChunks::open(f, super::DEFAULT_CHUNK_BYTES)? {
                let piece = piece?;
                taken += piece.len() as u64;
                sample.push(piece);
                if taken >= share {
                    break;
                }
            }
        }
        Self::train_bpe_on(sample.into_iter(), vocab_size)
    }

    /// Trains the byte-level BPE of [`TextTokenizer::train_bpe`] on the given texts.
    fn train_bpe_on(texts: impl Iterator<Item = String> + Send, vocab_size: usize) -> Result<Self> {
        check_bpe_vocab(vocab_size)?;
        let model = BPE::builder()
            .unk_token(UNK.to_string())
            .build()
            .map_err(|e| candle::Error::Msg(format!("building a BPE model: {e}")))?;
        let byte_level = ByteLevel::default().add_prefix_space(false);
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            ByteLevel,
            PostProcessorWrapper,
            ByteLevel,
        >::new()
        .with_model(model)
        .with_pre_tokenizer(Some(byte_level))
        .with_decoder(Some(byte_level))
        .build()
        .map_err(|e| candle::Error::Msg(format!("building a BPE tokenizer: {e}")))?;
        let specials = [PAD, UNK, BOS, EOS]
            .iter()
            .map(|s| AddedToken::from(*s, true))
            .collect();
        let mut trainer = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(0)
            .special_tokens(specials)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        tokenizer
            .train(&mut trainer, texts)
            .map_err(|e| candle::Error::Msg(format!("training a BPE: {e}")))?;
        let tok = Self::from_tokenizer(Tokenizer::from(tokenizer));
        for (want, name) in [PAD, UNK, BOS, EOS].iter().enumerate() {
            if tok.inner.token_to_id(name) != Some(want as u32) {
                return Err(candle::Error::Msg(format!(
                    "the trained BPE gave {name:?} the id {:?}; expected {want}",
                    tok.inner.token_to_id(name)
                )));
            }
        }
        Ok(tok)
    }

    /// Writes the tokenizer to `path` as `tokenizer.json`, atomically.
    ///
    /// PyTorch equivalent: `tokenizer.save(path)`.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, self.to_json()?.as_bytes())
    }

    /// The JSON [`TextTokenizer::save`] writes.
    ///
    /// PyTorch equivalent: `tokenizer.to_str(pretty=True)`.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(true)
            .map_err(|e| candle::Error::Msg(format!("serializing the tokenizer: {e}")))
    }

    /// The number of ids: one more than the largest id (added tokens included), the size an
    /// embedding table needs.
    ///
    /// PyTorch equivalent: `tokenizer.get_vocab_size(with_added_tokens=True)`.
    pub fn vocab_size(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1)
    }

    /// The ids of `text`, without special tokens added. Input the tokenizer cannot encode
    /// (characters it would drop, words it would replace by its unknown token: [`UnknownInput`])
    /// is an error naming how much and the first, unless this tokenizer
    /// [skips](Self::skipping_unknown) it: then it is left out and counted.
    ///
    /// PyTorch equivalent: `tokenizer.encode(text, add_special_tokens=False).ids`, which drops
    /// or replaces such input silently.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = catch_panic("the tokenizer", || self.inner.encode(text, false))?
            .map_err(|e| candle::Error::Msg(format!("encoding text: {e}")))?;
        let (found, unknown_at) = find_unknown(&self.inner, text, &encoding);
        let mut ids = encoding.get_ids().to_vec();
        if found.chars > 0 {
            if !self.unknown.skip {
                candle::bail!(
                    "the text holds {}; use text the tokenizer covers, or skip such input deliberately (--skip-unknown)",
                    found.describe()
                )
            }
            self.unknown.record(&found);
            let mut drop = unknown_at.into_iter().peekable();
            let mut at = 0;
            ids.retain(|_| {
                let skip = drop.next_if_eq(&at).is_some();
                at += 1;
                !skip
            });
        }
        Ok(ids)
    }

    /// This tokenizer (and every clone made of it from now on) leaving out the input it
    /// cannot encode instead of refusing it, counted in [`unknown_skipped`](Self::unknown_skipped).
    pub fn skipping_unknown(mut self) -> Self {
        self.unknown = UnknownRule {
            skip: true,
            ..UnknownRule::default()
        };
        self
    }

    /// What [`encode`](Self::encode) left out so far, over this tokenizer and its clones.
    pub fn unknown_skipped(&self) -> UnknownInput {
        self.unknown.seen()
    }

    /// The text of `ids`, special tokens skipped. Errors on an id outside the vocabulary,
    /// naming it.
    ///
    /// PyTorch equivalent: `tokenizer.decode(ids, skip_special_tokens=True)`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some((pos, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| self.inner.id_to_token(id).is_none())
        {
            return Err(candle::Error::Msg(format!(
                "id {id} at position {pos} is not in the tokenizer's vocabulary of {} ids; \
                 expected ids the tokenizer knows",
                self.vocab_size()
            )));
        }
        catch_panic("the tokenizer", || self.inner.decode(ids, true))?
            .map_err(|e| candle::Error::Msg(format!("decoding {} ids: {e}", ids.len())))
    }

    /// The first of `names` the tokenizer knows.
    fn find(&self, names: &[&str]) -> Option<u32> {
        names.iter().find_map(|n| self.inner.token_to_id(n))
    }

    /// The padding id: that of `"<pad>"` (or `"[PAD]"`, `"<|pad|>"`), else the tokenizer's
    /// padding setting, else 0. Batches pad with 0 whatever it is (padding is masked).
    ///
    /// PyTorch equivalent: `tokenizer.pad_token_id`.
    pub fn pad_id(&self) -> u32 {
        self.find(&PAD_NAMES)
            .or_else(|| self.inner.get_padding().map(|p| p.pad_id))
            .unwrap_or(0)
    }

    /// The beginning-of-sequence id: that of `"<bos>"` (or `"<s>"`, `"<|begin_of_text|>"`,
    /// `"<|startoftext|>"`), if any.
    ///
    /// PyTorch equivalent: `tokenizer.bos_token_id`.
    pub fn bos_id(&self) -> Option<u32> {
        self.find(&BOS_NAMES)
    }

    /// The end-of-sequence id: that of `"<eos>"` (or `"</s>"`, `"<|end_of_text|>"`,
    /// `"<|endoftext|>"`), if any.
    ///
    /// PyTorch equivalent: `tokenizer.eos_token_id`.
    pub fn eos_id(&self) -> Option<u32> {
        self.find(&EOS_NAMES)
    }
}

/// Cuts the text of `corpus` into training windows of at most `window` tokens: the whole file
/// is encoded into one token stream, split into non-overlapping chunks, each starting with BOS
/// when the tokenizer has one (so a chunk holds `window - 1` text tokens then); windows of fewer
/// than 2 tokens are dropped. Each window is an [`Example::full`].
///
/// Errors on an unreadable or empty corpus (naming the path) and on `window < 2`.
///
/// PyTorch equivalent: the usual `torch.tensor(ids).split(window)` language-model dataset.
pub fn text_dataset(corpus: &Path, tok: &TextTokenizer, window: usize) -> Result<Dataset> {
    if window < 2 {
        return Err(candle::Error::Msg(format!(
            "window {window} is too short; expected at least 2 tokens (one input, one target)"
        )));
    }
    let text = read_text(corpus, "corpus", crate::limits::MAX_JSON_BYTES)?;
    let ids = tok
        .encode(&text)
        .map_err(|e| candle::Error::Msg(format!("encoding corpus {}: {e}", corpus.display())))?;
    if ids.is_empty() {
        return Err(candle::Error::Msg(format!(
            "corpus {} is empty (0 tokens); expected some text",
            corpus.display()
        )));
    }
    let bos = tok.bos_id();
    let chunk = if bos.is_some() { window - 1 } else { window };
    let examples = ids
        .chunks(chunk)
        .map(|c| {
            let mut tokens = Vec::with_capacity(window);
            tokens.extend(bos);
            tokens.extend_from_slice(c);
            Example::full(tokens)
        })
        .filter(|e| e.tokens.len() >= 2)
        .collect();
    Ok(Dataset { examples })
}
