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

use std::io::{BufRead, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle::Result;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::codec::{Codec, TOKENIZER_FILE, VOCAB_FILE};
use super::text::TextTokenizer;
use super::text_chunks::{text_file_sizes, TextChunks, DEFAULT_CHUNK_BYTES};
use super::vocab::{Vocab, BOS_ID, EOS_ID, UNK_ID};
use crate::checkpoint::write_atomic;

/// The token stream of a data directory.
pub const TOKENS_FILE: &str = "tokens.bin";
/// The description of a data directory.
pub const META_FILE: &str = "meta.json";
/// The `format` field of every `meta.json`.
pub const DATA_FORMAT: &str = "candle-mha-tokens";
/// The `version` field written by this crate.
const DATA_VERSION: u32 = 1;

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

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A prepared data directory, its token stream memory-mapped.
///
/// PyTorch equivalent: `np.memmap("train.bin", dtype=np.uint16, mode="r")`.
pub struct TokenData {
    dir: PathBuf,
    meta: TokenDataMeta,
    map: Option<memmap2::Mmap>,
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
    /// Opens a data directory written by [`prepare_text`] or [`prepare_token_files`].
    ///
    /// Errors, naming the path: a missing directory or file, a `meta.json` that is not this
    /// format, a `tokens.bin` whose size does not match `num_tokens` × the dtype's width, a
    /// split point past the end.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            candle::bail!(
                "data directory {}: not found; expected a directory written by `mha prepare`",
                dir.display()
            )
        }
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|e| {
            candle::Error::Msg(format!(
                "{}: {e}; expected the {META_FILE} that `mha prepare` writes",
                meta_path.display()
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
        if meta.train_tokens > meta.num_tokens {
            candle::bail!(
                "{}: train_tokens {} is past num_tokens {}",
                meta_path.display(),
                meta.train_tokens,
                meta.num_tokens
            )
        }
        let path = dir.join(TOKENS_FILE);
        let file = std::fs::File::open(&path)
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))?;
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
        // SAFETY: the map is read-only; the file is not expected to change while it is open
        // (as with candle's own memory-mapped safetensors).
        let map = if len == 0 {
            None
        } else {
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| {
                candle::Error::Msg(format!("memory-mapping {}: {e}", path.display()))
            })?)
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            map,
        })
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
        let Some(map) = &self.map else {
            return Ok(Vec::new());
        };
        let w = self.meta.dtype.width();
        let bytes = &map[range.start as usize * w..range.end as usize * w];
        Ok(match self.meta.dtype {
            TokenDtype::U16 => bytes
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            TokenDtype::U32 => bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        })
    }

    /// The tokenization stored beside the tokens; errors when its hash is not the one
    /// `meta.json` recorded (the file was replaced).
    pub fn codec(&self) -> Result<Codec> {
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
        let fp = codec.fingerprint()?;
        if fp != self.meta.codec_sha256 {
            candle::bail!(
                "{what} does not match the data in {}: the tokens were made with another tokenization (hash {}…, the data's {}…); use the data's own {} or prepare the data again",
                self.dir.display(),
                &fp[..12],
                &self.meta.codec_sha256[..12.min(self.meta.codec_sha256.len())],
                self.meta.codec_file
            )
        }
        Ok(())
    }
}

/// Settings of [`prepare_text`] and [`prepare_token_files`].
///
/// PyTorch equivalent: the constants of nanoGPT's `prepare.py`.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareOptions {
    /// The held-out tail's share of the ids, in `[0, 1)`. Default 0.1.
    pub val_fraction: f64,
    /// Bytes of text encoded at a time per thread. Default 1 MiB.
    pub chunk_bytes: usize,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            val_fraction: 0.1,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

/// How far [`prepare_text`] has come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepareProgress {
    /// Source bytes read so far.
    pub bytes: u64,
    /// Source bytes in all.
    pub total_bytes: u64,
    /// Ids written so far.
    pub tokens: u64,
}

/// `tokens.bin` being written: a temporary file renamed into place by [`TokenWriter::finish`].
struct TokenWriter {
    tmp: PathBuf,
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    dtype: TokenDtype,
    vocab_size: usize,
    count: u64,
}

impl TokenWriter {
    fn create(dir: &Path, vocab_size: usize) -> Result<Self> {
        let path = dir.join(TOKENS_FILE);
        let tmp = dir.join(format!(".{TOKENS_FILE}.tmp-{}", std::process::id()));
        let file = std::fs::File::create(&tmp)
            .map_err(|e| candle::Error::Msg(format!("creating {}: {e}", tmp.display())))?;
        Ok(Self {
            tmp,
            path,
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            dtype: TokenDtype::for_vocab(vocab_size),
            vocab_size,
            count: 0,
        })
    }

    fn push(&mut self, ids: &[u32]) -> Result<()> {
        let mut buf = Vec::with_capacity(ids.len() * self.dtype.width());
        for &id in ids {
            if id as usize >= self.vocab_size {
                candle::bail!(
                    "the tokenizer produced id {id}, outside its vocabulary of {} ids",
                    self.vocab_size
                )
            }
            match self.dtype {
                TokenDtype::U16 => buf.extend_from_slice(&(id as u16).to_le_bytes()),
                TokenDtype::U32 => buf.extend_from_slice(&id.to_le_bytes()),
            }
        }
        self.out
            .write_all(&buf)
            .map_err(|e| candle::Error::Msg(format!("writing {}: {e}", self.tmp.display())))?;
        self.count += ids.len() as u64;
        Ok(())
    }

    fn finish(mut self) -> Result<u64> {
        self.out
            .flush()
            .and_then(|_| self.out.get_ref().sync_all())
            .and_then(|_| std::fs::rename(&self.tmp, &self.path))
            .map_err(|e| candle::Error::Msg(format!("writing {}: {e}", self.path.display())))?;
        Ok(self.count)
    }
}

impl Drop for TokenWriter {
    fn drop(&mut self) {
        // Gone already after a successful rename; after an error, do not leave it behind.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Size and SHA-256 of a file, read in pieces.
fn hash_file(path: &Path) -> Result<(u64, String)> {
    let file = std::fs::File::open(path)
        .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    loop {
        let buf = reader
            .fill_buf()
            .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))?;
        if buf.is_empty() {
            break;
        }
        hasher.update(buf);
        n += buf.len() as u64;
        let len = buf.len();
        reader.consume(len);
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((n, hex))
}

/// Creates `out` (or checks that it holds no prepared data yet).
fn claim_dir(out: &Path) -> Result<()> {
    if out.join(META_FILE).exists() {
        candle::bail!(
            "{} already holds prepared data ({META_FILE}); choose another directory or remove it",
            out.display()
        )
    }
    std::fs::create_dir_all(out)
        .map_err(|e| candle::Error::Msg(format!("creating {}: {e}", out.display())))
}

/// The record of source `f`, which became `tokens` ids.
fn source_record(f: &Path, tokens: u64) -> Result<SourceFile> {
    let (bytes, sha256) = hash_file(f)?;
    Ok(SourceFile {
        path: f.display().to_string(),
        bytes,
        sha256,
        tokens,
    })
}

/// Moves `tokens.bin` into place, then writes the codec and `meta.json`: the directory is
/// complete only once `meta.json` exists.
fn finish_dir(
    out: &Path,
    writer: TokenWriter,
    codec: &Codec,
    opts: &PrepareOptions,
    sources: Vec<SourceFile>,
) -> Result<TokenDataMeta> {
    let dtype = writer.dtype;
    let num_tokens = writer.finish()?;
    let text = matches!(codec, Codec::Text(_));
    let meta = TokenDataMeta {
        format: DATA_FORMAT.into(),
        version: DATA_VERSION,
        dtype,
        num_tokens,
        vocab_size: codec.vocab_size(),
        train_tokens: split_point(num_tokens, opts.val_fraction)?,
        val_fraction: opts.val_fraction,
        source_bytes: sources.iter().map(|s| s.bytes).sum(),
        text,
        codec_file: if text { TOKENIZER_FILE } else { VOCAB_FILE }.into(),
        codec_sha256: codec.fingerprint()?,
        sources,
    };
    codec.save_dir(out)?;
    let json = serde_json::to_string_pretty(&meta)
        .map_err(|e| candle::Error::Msg(format!("serializing {META_FILE}: {e}")))?;
    write_atomic(&out.join(META_FILE), json.as_bytes())?;
    Ok(meta)
}

/// Encodes the text files `files` with `tok` into the data directory `out`: in pieces of
/// `chunk_bytes` encoded in parallel (rayon) and written in order, so memory stays at a few
/// pieces per thread whatever the corpus size. Each file becomes one document: BOS, its ids,
/// EOS (those the tokenizer has). `progress` is called after every group of pieces.
///
/// Errors, naming the file: an unreadable, empty or non-UTF-8 source (with the line and
/// byte of the first invalid byte), a directory that already holds prepared data. Nothing is
/// left in `out` on error but what was there (the token file is written to a temporary name).
///
/// The ids equal those of encoding each whole file at once for byte-level BPE tokenizers
/// (pieces are cut where the pre-tokenizer cuts; see [`TextChunks`]).
///
/// PyTorch equivalent: nanoGPT's `data/*/prepare.py` (`enc.encode_ordinary` + `tofile`).
pub fn prepare_text(
    files: &[PathBuf],
    tok: &TextTokenizer,
    out: &Path,
    opts: &PrepareOptions,
    progress: &mut dyn FnMut(PrepareProgress),
) -> Result<TokenDataMeta> {
    split_point(0, opts.val_fraction)?;
    if files.is_empty() {
        candle::bail!("no source file to prepare")
    }
    let sizes = text_file_sizes(files)?;
    claim_dir(out)?;
    let codec = Codec::Text(Box::new(tok.clone()));
    let vocab_size = tok.vocab_size();
    let mut writer = TokenWriter::create(out, vocab_size)?;
    let mut report = PrepareProgress {
        total_bytes: sizes.iter().sum(),
        ..Default::default()
    };
    let group = 2 * rayon::current_num_threads().max(1);
    let mut sources = Vec::with_capacity(files.len());
    for f in files {
        let start = writer.count;
        writer.push(&Vec::from_iter(tok.bos_id()))?;
        let mut chunks = TextChunks::open(f, opts.chunk_bytes)?;
        loop {
            let texts: Vec<String> = chunks.by_ref().take(group).collect::<Result<_>>()?;
            if texts.is_empty() {
                break;
            }
            let ids: Vec<Vec<u32>> = texts
                .par_iter()
                .map(|t| {
                    tok.encode(t)
                        .map_err(|e| candle::Error::Msg(format!("{}: {e}", f.display())))
                })
                .collect::<Result<_>>()?;
            for (t, i) in texts.iter().zip(&ids) {
                writer.push(i)?;
                report.bytes += t.len() as u64;
            }
            report.tokens = writer.count;
            progress(report);
        }
        writer.push(&Vec::from_iter(tok.eos_id()))?;
        sources.push(source_record(f, writer.count - start)?);
    }
    finish_dir(out, writer, &codec, opts, sources)
}

/// The symbols of every sequence line of a token file (blank and `#` lines skipped), read
/// line by line; errors name the file and line.
fn for_each_line(path: &Path, mut f: impl FnMut(&str) -> Result<()>) -> Result<()> {
    if path.is_dir() {
        candle::bail!("{} is a directory; expected a token file", path.display())
    }
    let file = std::fs::File::open(path)
        .map_err(|e| candle::Error::Msg(format!("reading token file {}: {e}", path.display())))?;
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let mut n = 0usize;
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        let text = std::str::from_utf8(&line).map_err(|e| {
            candle::Error::Msg(format!(
                "{}:{n}: invalid UTF-8 at column {}; expected a UTF-8 token file",
                path.display(),
                e.valid_up_to() + 1
            ))
        })?;
        let t = text.trim_start();
        if !t.is_empty() && !t.starts_with('#') {
            f(t)?;
        }
    }
}

/// Encodes token files (one sequence of whitespace-separated symbols per line, as
/// [`read_token_file`](super::read_token_file) reads them) into the data directory `out`:
/// a first pass builds the [`Vocab`] (specials, then symbols in first-seen order), a second
/// writes each line as `BOS ids… EOS`. Memory holds the vocabulary and one line.
///
/// PyTorch equivalent: none (a script writing `np.array(ids, dtype=np.uint16).tofile(...)`).
pub fn prepare_token_files(
    files: &[PathBuf],
    out: &Path,
    opts: &PrepareOptions,
) -> Result<TokenDataMeta> {
    split_point(0, opts.val_fraction)?;
    if files.is_empty() {
        candle::bail!("no token file to prepare")
    }
    let mut vocab = Vocab::from_symbols(&[]);
    for f in files {
        let mut lines = 0usize;
        for_each_line(f, |t| {
            lines += 1;
            t.split_whitespace().for_each(|s| vocab.push(s));
            Ok(())
        })?;
        if lines == 0 {
            candle::bail!(
                "{} contains no sequence (only blank or '#' lines); expected at least one line of symbols",
                f.display()
            )
        }
    }
    claim_dir(out)?;
    let mut writer = TokenWriter::create(out, vocab.len())?;
    let mut sources = Vec::with_capacity(files.len());
    for f in files {
        let start = writer.count;
        for_each_line(f, |t| {
            let mut ids = vec![BOS_ID];
            ids.extend(t.split_whitespace().map(|s| vocab.id(s).unwrap_or(UNK_ID)));
            ids.push(EOS_ID);
            writer.push(&ids)
        })?;
        sources.push(source_record(f, writer.count - start)?);
    }
    finish_dir(out, writer, &Codec::Symbols(vocab), opts, sources)
}
