//! Writing prepared token data ([`prepare_text`], [`prepare_token_files`]): a corpus encoded
//! once, in bounded memory, into a data directory (the format is in `token_data.rs`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use candle::Result;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::text::TextTokenizer;
use super::text_chunks::{text_file_sizes, TextChunks, DEFAULT_CHUNK_BYTES};
use super::token_data::{
    split_point, BpeSettings, SourceFile, TokenDataMeta, TokenDtype, DATA_FORMAT, DATA_VERSION,
    META_FILE, TOKENS_FILE,
};
use super::tokenizer::Codec;
use super::vocab::{Vocab, BOS_ID, EOS_ID, UNK_ID};
use crate::checksum::hex;
use crate::run_dir::{TOKENIZER_FILE, VOCAB_FILE};
use candle_mha::io::write_atomic;

/// Settings of [`prepare_text`] and [`prepare_token_files`].
///
/// PyTorch equivalent: the constants of nanoGPT's `prepare.py`.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareOptions {
    /// The held-out tail's share of the ids, in `[0, 1)`. Default 0.1.
    pub val_fraction: f64,
    /// Bytes of text encoded at a time per thread. Default 1 MiB.
    pub chunk_bytes: usize,
    /// How the tokenizer was trained, recorded in `meta.json` (`None`: given, or symbols).
    pub bpe: Option<BpeSettings>,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            val_fraction: 0.1,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            bpe: None,
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

/// `tokens.bin` being written: a temporary file (created exclusively beside it, removed if
/// dropped) renamed into place by [`TokenWriter::finish`].
struct TokenWriter {
    path: PathBuf,
    out: std::io::BufWriter<tempfile::NamedTempFile>,
    dtype: TokenDtype,
    vocab_size: usize,
    count: u64,
    /// The largest id written, and the SHA-256 of the bytes written.
    max_id: Option<u32>,
    hasher: Sha256,
}

impl TokenWriter {
    fn create(dir: &Path, vocab_size: usize) -> Result<Self> {
        let path = dir.join(TOKENS_FILE);
        candle_mha::io::refuse_link(&path)?;
        let tmp = candle_mha::io::temp_beside(&path)?;
        Ok(Self {
            path,
            out: std::io::BufWriter::with_capacity(1 << 20, tmp),
            dtype: TokenDtype::for_vocab(vocab_size),
            vocab_size,
            count: 0,
            max_id: None,
            hasher: Sha256::new(),
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
            self.max_id = self.max_id.max(Some(id));
        }
        self.hasher.update(&buf);
        self.out
            .write_all(&buf)
            .map_err(|e| candle::Error::Msg(format!("writing {}: {e}", self.path.display())))?;
        self.count += ids.len() as u64;
        Ok(())
    }

    /// Renames the file into place; returns the number of ids, the largest and the file's
    /// SHA-256.
    fn finish(self) -> Result<(u64, Option<u32>, String)> {
        let err =
            |e: std::io::Error| candle::Error::Msg(format!("writing {}: {e}", self.path.display()));
        let tmp = self.out.into_inner().map_err(|e| err(e.into_error()))?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.persist(&self.path).map_err(|e| err(e.error))?;
        let sha256 = hex(&self.hasher.finalize());
        Ok((self.count, self.max_id, sha256))
    }
}

/// Size and SHA-256 of a file, read in pieces.
fn hash_file(path: &Path) -> Result<(u64, String)> {
    crate::checksum::size_and_sha256(candle_mha::io::open_input(path)?)
        .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))
}

/// The files a prepared data directory consists of.
const DATA_FILES: [&str; 4] = [META_FILE, TOKENS_FILE, TOKENIZER_FILE, VOCAB_FILE];

/// Marks a directory being prepared (it holds the preparing process's pid) until its
/// `meta.json` is written: what an unfinished preparation left is then known to be its own.
const PREPARING_FILE: &str = ".preparing";

/// Creates `out`, or checks that it holds none of the files preparing writes: prepared data,
/// or files of the same names someone else wrote, are never overwritten; what an unfinished
/// preparation here left (its marker says so) is removed, temporary files included.
fn claim_dir(out: &Path) -> Result<()> {
    if out.join(META_FILE).exists() {
        candle::bail!(
            "{} already holds prepared data ({META_FILE}); choose another directory or remove it",
            out.display()
        )
    }
    let marker = out.join(PREPARING_FILE);
    if marker.exists() {
        for f in DATA_FILES {
            let _ = std::fs::remove_file(out.join(f));
        }
    } else if let Some(f) = DATA_FILES.iter().find(|f| out.join(f).exists()) {
        candle::bail!(
            "{} holds a {f} that preparing did not write (no {META_FILE}); it is not overwritten: choose another directory or remove it",
            out.display()
        )
    }
    std::fs::create_dir_all(out)
        .map_err(|e| candle::Error::Msg(format!("creating {}: {e}", out.display())))?;
    candle_mha::io::remove_stale_temps(out);
    write_atomic(&marker, format!("pid {}\n", std::process::id()).as_bytes())
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
    let (num_tokens, max_id, tokens_sha256) = writer.finish()?;
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
        max_id,
        tokens_sha256: Some(tokens_sha256),
        bpe: opts.bpe,
    };
    codec.save_dir(out)?;
    let json = serde_json::to_string_pretty(&meta)
        .map_err(|e| candle::Error::Msg(format!("serializing {META_FILE}: {e}")))?;
    write_atomic(&out.join(META_FILE), json.as_bytes())?;
    // Complete: the files are prepared data now.
    let _ = std::fs::remove_file(out.join(PREPARING_FILE));
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
    let file = candle_mha::io::open_input(path)
        .map_err(|e| candle::Error::Msg(format!("reading token file: {e}")))?;
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
