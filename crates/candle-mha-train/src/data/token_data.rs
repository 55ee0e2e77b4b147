//! Prepared token data: a corpus encoded once into one flat token stream on disk, read back
//! memory-mapped by every run that trains or evaluates on it (nanoGPT's `train.bin`).
//!
//! A data directory holds:
//! - `tokens.bin`: the ids, little-endian `u16` when the vocabulary has at most 65,536 ids,
//!   else `u32`; documents (source files, or token-file lines) follow each other, each opened
//!   by BOS and closed by EOS when the tokenization has them;
//! - `meta.json`: [`TokenDataMeta`] (counts, dtype, the split point, the source files with
//!   sizes and SHA-256 hashes, the tokenization's hash);
//! - `tokenizer.json` (text) or `vocab.json` (symbols): the tokenization.
//!
//! Tokens `[0, train_tokens)` are for training, `[train_tokens, num_tokens)` for validation:
//! the held-out part is the stream's tail, never seen in training.
//!
//! This file is the format and its reader ([`TokenData`]); `prepare.rs` writes it.

use std::ops::Range;
use std::path::{Path, PathBuf};

use candle::Result;
use serde::{Deserialize, Serialize};

use super::tokenizer::Codec;

/// The token stream of a data directory.
pub const TOKENS_FILE: &str = "tokens.bin";
/// The description of a data directory.
pub const META_FILE: &str = "meta.json";
/// The `format` field of every `meta.json`.
pub const DATA_FORMAT: &str = "candle-mha-tokens";
/// The `version` field written by this crate.
pub(super) const DATA_VERSION: u32 = 1;

/// How the ids are stored in `tokens.bin`.
///
/// PyTorch equivalent: the `np.uint16` / `np.uint32` of nanoGPT's `train.bin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// 2 bytes per id: vocabularies of at most 65,536 ids.
    U16,
    /// 4 bytes per id.
    U32,
}

impl TokenDtype {
    /// The narrowest dtype that holds ids `0..vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per id.
    pub fn width(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// The ids stored little-endian in `bytes` (a trailing partial id is left out).
    fn ids(self, bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
        bytes.chunks_exact(self.width()).map(move |b| match self {
            Self::U16 => u32::from(u16::from_le_bytes([b[0], b[1]])),
            Self::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        })
    }
}

/// One file the data was prepared from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// The path as given.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Ids it became (BOS/EOS included).
    pub tokens: u64,
}

/// `meta.json` of a data directory.
///
/// PyTorch equivalent: nanoGPT's `meta.pkl`, with counts and provenance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenDataMeta {
    /// Always [`DATA_FORMAT`].
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// How ids are stored.
    pub dtype: TokenDtype,
    /// Ids in `tokens.bin`.
    pub num_tokens: u64,
    /// The tokenization's number of ids.
    pub vocab_size: usize,
    /// The split point: ids before it are for training, the rest for validation.
    pub train_tokens: u64,
    /// The fraction asked for when the split point was chosen.
    pub val_fraction: f64,
    /// Bytes of the sources (text bytes for text data).
    pub source_bytes: u64,
    /// Whether the sources were text (through a tokenizer) or token files (symbols).
    pub text: bool,
    /// `tokenizer.json` or `vocab.json`.
    pub codec_file: String,
    /// [`Codec::fingerprint`] of that tokenization.
    pub codec_sha256: String,
    /// The sources, in stream order.
    pub sources: Vec<SourceFile>,
    /// The largest id in `tokens.bin` (`None`: no ids, or data prepared before it was
    /// recorded).
    #[serde(default)]
    pub max_id: Option<u32>,
    /// SHA-256 of `tokens.bin`, hex ([`TokenData::verify`]; `None` for data prepared before
    /// it was recorded).
    #[serde(default)]
    pub tokens_sha256: Option<String>,
    /// The byte-level BPE trained for the text, as asked (`None`: a tokenizer was given, the
    /// sources are token files, or the data was prepared before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpe: Option<BpeSettings>,
}

/// How the BPE of prepared text was trained (what `--bpe-vocab` and `--bpe-sample-mb` asked).
///
/// PyTorch equivalent: none (the `vocab_size` given to a tokenizer trainer).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BpeSettings {
    /// Ids asked for (the tokenizer may have fewer: `vocab_size` says how many it has).
    pub vocab_size: usize,
    /// Megabytes of text sampled to train it.
    pub sample_mb: f64,
}

impl TokenDataMeta {
    /// The training part of the stream.
    pub fn train_range(&self) -> Range<u64> {
        0..self.train_tokens
    }

    /// The validation part (the tail).
    pub fn val_range(&self) -> Range<u64> {
        self.train_tokens..self.num_tokens
    }
}

/// The split point for `val_fraction` of `num_tokens` ids: the last `round(f·n)` ids are
/// held out; `f` must be in `[0, 1)`.
pub fn split_point(num_tokens: u64, val_fraction: f64) -> Result<u64> {
    if !(0.0..1.0).contains(&val_fraction) {
        candle::bail!("val_fraction {val_fraction}: expected a fraction in [0, 1)")
    }
    let val = (val_fraction * num_tokens as f64).round() as u64;
    Ok(num_tokens - val.min(num_tokens))
}

/// A prepared data directory, its token stream memory-mapped.
///
/// PyTorch equivalent: `np.memmap("train.bin", dtype=np.uint16, mode="r")`.
pub struct TokenData {
    dir: PathBuf,
    meta: TokenDataMeta,
    /// The stream's files, memory-mapped, in order (`tokens.bin`; nanoGPT's `train.bin` then
    /// `val.bin`); empty files left out.
    parts: Vec<memmap2::Mmap>,
}

/// nanoGPT's data directory: ids in `train.bin` then `val.bin` (`np.uint16`), the character
/// vocabulary in `meta.pkl` (`shakespeare_char`) or none (GPT-2's BPE through tiktoken).
pub const NANOGPT_FILES: [&str; 3] = ["train.bin", "val.bin", "meta.pkl"];

/// The characters of nanoGPT's `meta.pkl` (`itos`, id → character), in id order.
///
/// PyTorch equivalent: `pickle.load(open("meta.pkl", "rb"))["itos"]`.
pub fn nanogpt_vocab(path: &Path) -> Result<Vec<String>> {
    use candle_mha::checkpoint::{load_pickle, PickleValue};
    let meta = load_pickle(path)?;
    let Some(itos) = meta.get("itos").and_then(PickleValue::as_dict) else {
        candle::bail!("{}: no itos (nanoGPT's meta.pkl)", path.display())
    };
    let mut chars = vec![None; itos.len()];
    for (k, c) in itos {
        let (Some(i), Some(c)) = (k.as_i64(), c.as_str()) else {
            candle::bail!(
                "{}: itos maps something other than ids to strings",
                path.display()
            )
        };
        match chars.get_mut(i as usize) {
            Some(slot @ None) => *slot = Some(c.to_string()),
            _ => candle::bail!(
                "{}: itos has id {i} twice or out of 0..{}",
                path.display(),
                itos.len()
            ),
        }
    }
    Ok(chars.into_iter().map(|c| c.unwrap_or_default()).collect())
}

/// A read-only memory map of `file` (`None` when it is empty).
fn map(file: &std::fs::File, path: &Path) -> Result<Option<memmap2::Mmap>> {
    let len = file
        .metadata()
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: the map is read-only; the file is not expected to change while it is open
    // (as with candle's own memory-mapped safetensors).
    unsafe { memmap2::Mmap::map(file) }
        .map(Some)
        .map_err(|e| candle::Error::Msg(format!("memory-mapping {}: {e}", path.display())))
}

impl std::fmt::Debug for TokenData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenData")
            .field("dir", &self.dir)
            .field("num_tokens", &self.meta.num_tokens)
            .finish()
    }
}

impl TokenData {
    /// Opens a data directory written by [`prepare_text`](super::prepare_text) or
    /// [`prepare_token_files`](super::prepare_token_files).
    ///
    /// Errors, naming the path: a missing directory or file, a `meta.json` that is not this
    /// format, a `tokens.bin` whose size does not match `num_tokens` × the dtype's width, a
    /// split point past the end, an id outside the vocabulary (with its offset: the whole
    /// file is scanned, at memory speed) or above the largest id recorded.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            candle::bail!(
                "data directory {}: not found; expected a directory written by `mha prepare`",
                dir.display()
            )
        }
        let meta_path = dir.join(META_FILE);
        let nanogpt = NANOGPT_FILES[..2].iter().all(|f| dir.join(f).exists());
        if !meta_path.exists() && nanogpt {
            return Self::open_nanogpt(dir);
        }
        let text = candle_mha::io::read_input_string(&meta_path, crate::limits::MAX_JSON_BYTES)
            .map_err(|e| {
                candle::Error::Msg(format!(
                    "{e}; expected the {META_FILE} that `mha prepare` writes"
                ))
            })?;
        let meta: TokenDataMeta = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!(
                "{}: not a prepared-data description ({e})",
                meta_path.display()
            ))
        })?;
        if meta.format != DATA_FORMAT || meta.version != DATA_VERSION {
            candle::bail!(
                "{}: format {:?} version {}; expected {DATA_FORMAT:?} version {DATA_VERSION}",
                meta_path.display(),
                meta.format,
                meta.version
            )
        }
        crate::limits::check_range(
            &format!("{}: vocab_size", meta_path.display()),
            meta.vocab_size,
            1,
            crate::limits::MAX_VOCAB,
        )?;
        if meta.train_tokens > meta.num_tokens {
            candle::bail!(
                "{}: train_tokens {} is past num_tokens {}",
                meta_path.display(),
                meta.train_tokens,
                meta.num_tokens
            )
        }
        let path = dir.join(TOKENS_FILE);
        let file = candle_mha::io::open_input(&path)?;
        let len = file
            .metadata()
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))?
            .len();
        let want = meta.num_tokens * meta.dtype.width() as u64;
        if len != want {
            candle::bail!(
                "{}: {len} bytes, but {} says {} {:?} ids ({want} bytes): the file is truncated or not this data's",
                path.display(),
                meta_path.display(),
                meta.num_tokens,
                meta.dtype
            )
        }
        let data = Self {
            dir: dir.to_path_buf(),
            meta,
            parts: map(&file, &path)?.into_iter().collect(),
        };
        data.check_ids()?;
        Ok(data)
    }

    /// Opens nanoGPT's data directory ([`NANOGPT_FILES`]): one stream of `train.bin` then
    /// `val.bin` (the split point between them), the vocabulary of `meta.pkl` when there is
    /// one, else as large as the largest id (the tokenizer must then be given: no hash of it
    /// can be checked).
    pub fn open_nanogpt(dir: &Path) -> Result<Self> {
        let mut parts = Vec::new();
        let mut counts = Vec::new();
        for name in &NANOGPT_FILES[..2] {
            let path = dir.join(name);
            let file = candle_mha::io::open_input(&path)?;
            let m = map(&file, &path)?;
            let bytes = m.as_ref().map_or(0, |m| m.len());
            if bytes % 2 != 0 {
                candle::bail!(
                    "{}: {bytes} bytes, not a whole number of uint16 ids",
                    path.display()
                )
            }
            counts.push(bytes as u64 / 2);
            parts.extend(m);
        }
        let meta_pkl = dir.join(NANOGPT_FILES[2]);
        let chars = match meta_pkl.exists() {
            true => Some(nanogpt_vocab(&meta_pkl)?),
            false => None,
        };
        let mut data = Self {
            dir: dir.to_path_buf(),
            meta: TokenDataMeta {
                format: "nanogpt".into(),
                version: DATA_VERSION,
                dtype: TokenDtype::U16,
                num_tokens: counts[0] + counts[1],
                vocab_size: 1 << 16,
                train_tokens: counts[0],
                val_fraction: counts[1] as f64 / (counts[0] + counts[1]).max(1) as f64,
                source_bytes: 0,
                text: true,
                codec_file: NANOGPT_FILES[2].into(),
                codec_sha256: String::new(),
                sources: Vec::new(),
                max_id: None,
                tokens_sha256: None,
                bpe: None,
            },
            parts,
        };
        data.meta.max_id = data.largest_id();
        data.meta.vocab_size = match &chars {
            Some(c) => c.len(),
            None => data.meta.max_id.map_or(1, |m| m as usize + 1),
        };
        if let Some(c) = &chars {
            let codec = Codec::Text(Box::new(super::TextTokenizer::characters(c)?));
            data.meta.codec_sha256 = codec.fingerprint()?;
        }
        // The stream was scanned once for its largest id: a second scan is needed only to
        // name the first id outside the vocabulary.
        if data
            .meta
            .max_id
            .is_some_and(|m| m as usize >= data.meta.vocab_size)
        {
            data.check_ids()?;
        }
        Ok(data)
    }

    /// The largest id of the stream.
    fn largest_id(&self) -> Option<u32> {
        let mut max = None;
        for part in &self.parts {
            max = max.max(self.meta.dtype.ids(part).max());
        }
        max
    }

    /// Errors, naming the offset of the first one, when an id is at or past the vocabulary
    /// size, or above the largest id `meta.json` recorded.
    fn check_ids(&self) -> Result<()> {
        let vocab = self.meta.vocab_size as u64;
        let limit = match self.meta.max_id {
            Some(m) => (u64::from(m) + 1).min(vocab),
            None => vocab,
        };
        let w = self.meta.dtype.width();
        let mut first_bad = None;
        let mut start = 0usize;
        for (p, part) in self.parts.iter().enumerate() {
            let bad = self
                .meta
                .dtype
                .ids(part)
                .position(|id| u64::from(id) >= limit);
            if let Some(i) = bad {
                first_bad = Some((p, start, i));
                break;
            }
            start += part.len() / w;
        }
        if let Some((p, start, i)) = first_bad {
            let id = self.tokens((start + i) as u64..(start + i) as u64 + 1)?[0];
            // nanoGPT's data is train.bin then val.bin; ours is one tokens.bin.
            let file = match self.meta.format.as_str() {
                "nanogpt" => NANOGPT_FILES[p],
                _ => TOKENS_FILE,
            };
            return Err(super::DataError::IdOutOfRange {
                path: self.dir.join(file),
                id: id.into(),
                vocab,
                detail: format!(
                    "id {id} at offset {i} (byte {}) is {}; the file is damaged or not this data's: prepare the data again",
                    i * self.meta.dtype.width(),
                    match u64::from(id) >= vocab {
                        true => format!("outside the vocabulary of {vocab} ids"),
                        false => format!("above the largest id prepared, {}", limit - 1),
                    }
                ),
            }
            .into());
        }
        Ok(())
    }

    /// Checks `tokens.bin` against the SHA-256 `meta.json` recorded (a flipped bit that keeps
    /// an id in range is found only so). Errors when it differs; `Ok(false)` when no hash was
    /// recorded (data prepared before hashes were).
    pub fn verify(&self) -> Result<bool> {
        let Some(want) = &self.meta.tokens_sha256 else {
            return Ok(false);
        };
        let got = {
            use sha2::Digest;
            let mut hasher = sha2::Sha256::new();
            for part in &self.parts {
                hasher.update(&part[..]);
            }
            crate::checksum::hex(&hasher.finalize())
        };
        if &got != want {
            candle::bail!(
                "{}: SHA-256 {}…, but {META_FILE} records {}…: the file changed after it was prepared; prepare the data again",
                self.dir.join(TOKENS_FILE).display(),
                &got[..12],
                &want[..12.min(want.len())]
            )
        }
        Ok(true)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its `meta.json`.
    pub fn meta(&self) -> &TokenDataMeta {
        &self.meta
    }

    /// The number of ids.
    pub fn len(&self) -> u64 {
        self.meta.num_tokens
    }

    /// Whether the stream is empty.
    pub fn is_empty(&self) -> bool {
        self.meta.num_tokens == 0
    }

    /// The ids in `range`; errors when it reaches past the end.
    pub fn tokens(&self, range: Range<u64>) -> Result<Vec<u32>> {
        if range.start > range.end || range.end > self.meta.num_tokens {
            candle::bail!(
                "token range {}..{} is outside the data's {} ids",
                range.start,
                range.end,
                self.meta.num_tokens
            )
        }
        let w = self.meta.dtype.width();
        let (from, to) = (range.start as usize * w, range.end as usize * w);
        // The bytes of [from, to) gathered over the parts (one slice, but where a range
        // crosses from train.bin into val.bin).
        let mut gathered = Vec::new();
        let mut single = None;
        let mut start = 0usize;
        for part in &self.parts {
            let end = start + part.len();
            if from >= start && to <= end {
                single = Some(&part[from - start..to - start]);
                break;
            }
            if from < end && to > start {
                gathered.extend_from_slice(&part[from.max(start) - start..to.min(end) - start]);
            }
            start = end;
        }
        let bytes = single.unwrap_or(&gathered[..]);
        Ok(self.meta.dtype.ids(bytes).collect())
    }

    /// The tokenization stored beside the tokens; errors when its hash is not the one
    /// `meta.json` recorded (the file was replaced).
    pub fn codec(&self) -> Result<Codec> {
        if self.meta.format == "nanogpt" {
            let meta = self.dir.join(NANOGPT_FILES[2]);
            if !meta.exists() {
                candle::bail!(
                    "{}: nanoGPT data without meta.pkl (GPT-2's BPE, through tiktoken): give its tokenizer (GPT-2's tokenizer.json)",
                    self.dir.display()
                )
            }
            let chars = nanogpt_vocab(&meta)?;
            return Ok(Codec::Text(Box::new(super::TextTokenizer::characters(
                &chars,
            )?)));
        }
        let codec = Codec::load_dir(&self.dir)?;
        self.check_codec(
            &codec,
            &self.dir.join(&self.meta.codec_file).display().to_string(),
        )?;
        Ok(codec)
    }

    /// Errors unless `codec` is the tokenization the data was prepared with (same
    /// [`Codec::fingerprint`]); `what` names it in the message.
    pub fn check_codec(&self, codec: &Codec, what: &str) -> Result<()> {
        if self.meta.codec_sha256.is_empty() {
            // nanoGPT's data without meta.pkl records no tokenizer: its ids must fit.
            let need = self.meta.max_id.map_or(0, |m| m as usize + 1);
            if codec.vocab_size() < need {
                return Err(super::DataError::IdOutOfRange {
                    path: self.dir.clone(),
                    id: need as u64 - 1,
                    vocab: codec.vocab_size() as u64,
                    detail: format!(
                        "the data holds id {}, but {what} has {} ids",
                        need - 1,
                        codec.vocab_size()
                    ),
                }
                .into());
            }
            return Ok(());
        }
        let fp = codec.fingerprint()?;
        if fp != self.meta.codec_sha256 {
            return Err(super::DataError::TokenizerMismatch {
                dir: self.dir.clone(),
                what: what.to_string(),
                detail: format!(
                    "the tokens were made with another tokenization (hash {}…, the data's {}…); use the data's own {} or prepare the data again",
                    &fp[..12],
                    &self.meta.codec_sha256[..12.min(self.meta.codec_sha256.len())],
                    self.meta.codec_file
                ),
            }
            .into());
        }
        Ok(())
    }
}
