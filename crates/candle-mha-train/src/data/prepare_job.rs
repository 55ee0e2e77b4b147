//! [`PrepareJob`]: what `mha prepare` does, as one call: expand the sources, train a BPE on a
//! sample of the text (or load a tokenizer), and encode everything into a data directory.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle::Result;

use super::{
    expand_sources, prepare_text, prepare_token_files, BpeSettings, PrepareOptions,
    PrepareProgress, TextTokenizer, TokenDataMeta, DEFAULT_CHUNK_BYTES,
};

/// The default vocabulary of a BPE trained on the text (`mha prepare --vocab-size`).
pub const DEFAULT_BPE_VOCAB: usize = 512;

/// The default megabytes of text a BPE is trained on (`mha prepare --bpe-sample-mb`).
pub const DEFAULT_BPE_SAMPLE_MB: f64 = 8.0;

/// What a job reports while it runs: one-line notices and the encoding's progress. The CLI
/// prints them; `()` ignores them.
pub trait SetupObserver {
    /// A line worth telling the user (what is being trained, reused or written).
    fn notice(&mut self, _line: &str) {}
    /// The encoding's progress, many times per second.
    fn progress(&mut self, _progress: &PrepareProgress) {}
}

impl SetupObserver for () {}

/// One corpus to encode into a data directory: text files (with a tokenizer given or a BPE
/// trained on a sample of them) or token files (one sequence of symbols per line).
///
/// PyTorch equivalent: none (a tokenization script that writes a `.bin` of ids, as nanoGPT's
/// `prepare.py`).
#[derive(Clone, Debug)]
pub struct PrepareJob {
    /// Text files, folders or glob patterns ([`expand_sources`]); empty with `tokens`.
    pub text: Vec<PathBuf>,
    /// Token files instead of text.
    pub tokens: Vec<PathBuf>,
    /// A `tokenizer.json` to encode with instead of training a BPE.
    pub tokenizer: Option<PathBuf>,
    /// Ids of the BPE trained on the text (default [`DEFAULT_BPE_VOCAB`]).
    pub vocab_size: usize,
    /// Megabytes of text the BPE is trained on (default [`DEFAULT_BPE_SAMPLE_MB`]).
    pub bpe_sample_mb: f64,
    /// The share of the tokens kept for validation, at the end, in `[0, 1)`.
    pub val_fraction: f64,
    /// Bytes of text encoded per task (default [`DEFAULT_CHUNK_BYTES`]).
    pub chunk_bytes: usize,
    /// Leave out text the tokenizer cannot encode (counted in a notice) instead of refusing
    /// it (default `false`).
    pub skip_unknown: bool,
}

impl PrepareJob {
    /// A job for text files with the defaults.
    pub fn text(files: Vec<PathBuf>) -> Self {
        Self {
            text: files,
            tokens: Vec::new(),
            tokenizer: None,
            vocab_size: DEFAULT_BPE_VOCAB,
            bpe_sample_mb: DEFAULT_BPE_SAMPLE_MB,
            val_fraction: PrepareOptions::default().val_fraction,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            skip_unknown: false,
        }
    }

    /// Encodes the corpus into `out` (see [`prepare_text`]); errors name the field at fault.
    pub fn run(&self, out: &Path, observer: &mut dyn SetupObserver) -> Result<TokenDataMeta> {
        if !(0.0..1.0).contains(&self.val_fraction) {
            candle::bail!(
                "val_fraction {}: expected a fraction in [0, 1)",
                self.val_fraction
            )
        }
        if self.chunk_bytes == 0 {
            candle::bail!("chunk_bytes 0: expected at least 1")
        }
        let mut opts = PrepareOptions {
            val_fraction: self.val_fraction,
            chunk_bytes: self.chunk_bytes,
            bpe: None,
        };
        let started = Instant::now();
        if !self.tokens.is_empty() {
            let files = expand_sources(&self.tokens)?;
            return prepare_token_files(&files, out, &opts);
        }
        let files = expand_sources(&self.text)?;
        let tok = match &self.tokenizer {
            Some(p) => TextTokenizer::load(p)?,
            None => {
                opts.bpe = Some(BpeSettings {
                    vocab_size: self.vocab_size,
                    sample_mb: self.bpe_sample_mb,
                });
                self.train_bpe(&files, observer)?
            }
        };
        let tok = match self.skip_unknown {
            true => tok.skipping_unknown(),
            false => tok,
        };
        let meta = prepare_text(&files, &tok, out, &opts, &mut |p| observer.progress(&p))?;
        let skipped = tok.unknown_skipped();
        if skipped.chars > 0 {
            observer.notice(&format!("warning: left out {}", skipped.describe()));
        }
        let secs = started.elapsed().as_secs_f64();
        observer.notice(&format!(
            "encoded {} in {secs:.1} s ({:.1} MB/s)",
            candle_mha::io::human_size(meta.source_bytes),
            meta.source_bytes as f64 / 1e6 / secs.max(1e-9)
        ));
        Ok(meta)
    }

    fn train_bpe(
        &self,
        files: &[PathBuf],
        observer: &mut dyn SetupObserver,
    ) -> Result<TextTokenizer> {
        if !(self.bpe_sample_mb > 0.0 && self.bpe_sample_mb.is_finite()) {
            candle::bail!(
                "bpe_sample_mb {}: expected a positive number of megabytes",
                self.bpe_sample_mb
            )
        }
        observer.notice(&format!(
            "training a byte-level BPE of {} ids on up to {} MB of {} file(s)…",
            self.vocab_size,
            self.bpe_sample_mb,
            files.len()
        ));
        let tok = TextTokenizer::train_bpe_on_files(
            files,
            self.vocab_size,
            (self.bpe_sample_mb * 1e6) as u64,
        )
        .map_err(|e| candle::Error::Msg(format!("training the BPE tokenizer: {e}")))?;
        if tok.vocab_size() < self.vocab_size {
            observer.notice(&format!(
                "the BPE has {} ids, fewer than the {} asked: the sample has no more pairs to merge (more sample or more text gives more)",
                tok.vocab_size(),
                self.vocab_size
            ));
        }
        Ok(tok)
    }
}

/// One line describing prepared data in `dir`: tokens, dtype, ids, sources, split.
pub fn describe_prepared(meta: &TokenDataMeta, dir: &Path) -> String {
    format!(
        "{}: {} tokens ({:?}, {} ids) from {} file(s), {}; training {} tokens, validation {} (the last {:.0}%)",
        dir.display(),
        meta.num_tokens,
        meta.dtype,
        meta.vocab_size,
        meta.sources.len(),
        candle_mha::io::human_size(meta.source_bytes),
        meta.train_tokens,
        meta.num_tokens - meta.train_tokens,
        100.0 * meta.val_fraction
    )
}

impl PrepareJob {
    /// What in this job differs from how the data of `meta` was prepared (the sources aside):
    /// the BPE's settings, a tokenizer given or not, the split; one line each, as
    /// `vocab_size 1000: the data's BPE was asked for 512`. Empty when it would prepare the
    /// same data.
    pub fn differences(&self, meta: &TokenDataMeta) -> Result<Vec<String>> {
        let mut out = Vec::new();
        match (&self.tokenizer, &meta.bpe) {
            (Some(p), _) => {
                let given = super::Codec::Text(Box::new(TextTokenizer::load(p)?));
                if given.fingerprint()? != meta.codec_sha256 {
                    out.push(format!(
                        "tokenizer {}: the data was encoded with another tokenization",
                        p.display()
                    ));
                }
            }
            (None, Some(bpe)) => {
                if bpe.vocab_size != self.vocab_size {
                    out.push(format!(
                        "vocab_size {}: the data's BPE was asked for {}",
                        self.vocab_size, bpe.vocab_size
                    ));
                }
                if bpe.sample_mb != self.bpe_sample_mb {
                    out.push(format!(
                        "bpe_sample_mb {}: the data's BPE was trained on {} MB",
                        self.bpe_sample_mb, bpe.sample_mb
                    ));
                }
            }
            // Prepared before the settings were recorded: the ids it has are all we know.
            (None, None) => {
                if meta.vocab_size > self.vocab_size {
                    out.push(format!(
                        "vocab_size {}: the data's tokenizer has {} ids",
                        self.vocab_size, meta.vocab_size
                    ));
                }
            }
        }
        if self.val_fraction != meta.val_fraction {
            out.push(format!(
                "val_fraction {}: the data was split with {}",
                self.val_fraction, meta.val_fraction
            ));
        }
        Ok(out)
    }
}

/// Whether `files` are the sources recorded in prepared data (same paths and sizes, in order).
pub fn same_sources(recorded: &[super::SourceFile], files: &[PathBuf]) -> bool {
    recorded.len() == files.len()
        && recorded.iter().zip(files).all(|(s, f)| {
            s.path == f.display().to_string()
                && std::fs::metadata(f).is_ok_and(|m| m.len() == s.bytes)
        })
}
