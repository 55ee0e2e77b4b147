//! `mha prepare`: encode a corpus once into a data directory that `mha train --data` and
//! `mha eval --data` read memory-mapped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_mha::data::{
    expand_sources, prepare_text, prepare_token_files, PrepareOptions, TextTokenizer,
    TokenDataMeta, DEFAULT_CHUNK_BYTES, MAX_BPE_VOCAB, MAX_CHUNK_BYTES, MIN_BPE_VOCAB,
};
use indicatif::{ProgressBar, ProgressStyle};

/// Vocabulary size of the BPE trained when no tokenizer is given (`mha prepare`,
/// `mha train --text`).
pub const DEFAULT_BPE_VOCAB: usize = 512;
/// Megabytes of text that BPE is trained on.
pub const DEFAULT_BPE_SAMPLE_MB: f64 = 8.0;

/// Arguments of `mha prepare`.
#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Text sources: files, directories (every file below) or glob patterns ("docs/*.txt").
    #[arg(long, num_args = 1.., required_unless_present = "tokens", conflicts_with = "tokens")]
    pub text: Vec<PathBuf>,
    /// Token files (one sequence of whitespace-separated symbols per line) instead of text.
    #[arg(long, num_args = 1..)]
    pub tokens: Vec<PathBuf>,
    /// The data directory to write (tokens.bin, meta.json, tokenizer.json or vocab.json).
    #[arg(long)]
    pub out: PathBuf,
    /// A tokenizers `tokenizer.json` (default: train a byte-level BPE on a sample of the text).
    #[arg(long, conflicts_with = "tokens")]
    pub tokenizer: Option<PathBuf>,
    /// Vocabulary size of the trained BPE (260 to 1048576).
    #[arg(long, default_value_t = DEFAULT_BPE_VOCAB,
          value_parser = super::bounds::count(MIN_BPE_VOCAB as u64, MAX_BPE_VOCAB as u64))]
    pub vocab_size: usize,
    /// Megabytes of text the BPE is trained on (a sample spread over the files; 0.001 to
    /// 100000).
    #[arg(long, default_value_t = DEFAULT_BPE_SAMPLE_MB, value_parser = super::bounds::real(0.001, 1e5))]
    pub bpe_sample_mb: f64,
    /// Fraction of the token stream held out for validation (its tail), in [0, 1).
    #[arg(long, default_value_t = PrepareOptions::default().val_fraction)]
    pub val_fraction: f64,
    /// Kilobytes of text encoded at a time per thread (1 to 262144).
    #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES / 1024,
          value_parser = super::bounds::count(1, MAX_CHUNK_BYTES as u64 / 1024))]
    pub chunk_kb: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// What to prepare: the settings `mha train --text` shares with `mha prepare`.
pub struct PrepareJob<'a> {
    pub text: &'a [PathBuf],
    pub tokens: &'a [PathBuf],
    pub tokenizer: Option<&'a Path>,
    pub vocab_size: usize,
    pub bpe_sample_mb: f64,
    pub val_fraction: f64,
    pub chunk_kb: usize,
    pub quiet: bool,
}

impl PrepareJob<'_> {
    /// Encodes the sources into `out`, with a progress bar on a terminal; notices on stderr.
    pub fn run(&self, out: &Path) -> Result<TokenDataMeta> {
        if !(0.0..1.0).contains(&self.val_fraction) {
            bail!(
                "--val-fraction {}: expected a fraction in [0, 1)",
                self.val_fraction
            )
        }
        if self.chunk_kb == 0 {
            bail!("--chunk-kb 0: expected at least 1")
        }
        let opts = PrepareOptions {
            val_fraction: self.val_fraction,
            chunk_bytes: self.chunk_kb * 1024,
        };
        let started = Instant::now();
        if !self.tokens.is_empty() {
            let files = expand_sources(self.tokens)?;
            return Ok(prepare_token_files(&files, out, &opts)?);
        }
        let files = expand_sources(self.text)?;
        let tok = match self.tokenizer {
            Some(p) => TextTokenizer::load(p)?,
            None => {
                if !(self.bpe_sample_mb > 0.0 && self.bpe_sample_mb.is_finite()) {
                    bail!(
                        "--bpe-sample-mb {}: expected a positive number of megabytes",
                        self.bpe_sample_mb
                    )
                }
                eprintln!(
                    "training a byte-level BPE of {} ids on up to {} MB of {} file(s)…",
                    self.vocab_size,
                    self.bpe_sample_mb,
                    files.len()
                );
                let tok = TextTokenizer::train_bpe_on_files(
                    &files,
                    self.vocab_size,
                    (self.bpe_sample_mb * 1e6) as u64,
                )
                .context("training the BPE tokenizer")?;
                if tok.vocab_size() < self.vocab_size {
                    eprintln!(
                        "the BPE has {} ids, fewer than the {} asked: the sample has no more pairs to merge (a larger --bpe-sample-mb or more text gives more)",
                        tok.vocab_size(),
                        self.vocab_size
                    );
                }
                tok
            }
        };
        let quiet = self.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        bar.set_style(ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} [{elapsed_precise}<{eta_precise}] {binary_bytes_per_sec} {msg}",
        )?);
        let meta = prepare_text(&files, &tok, out, &opts, &mut |p| {
            bar.set_length(p.total_bytes);
            bar.set_position(p.bytes);
            bar.set_message(format!("{} tokens", p.tokens));
        })?;
        bar.finish_and_clear();
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "encoded {:.1} MB in {secs:.1} s ({:.1} MB/s)",
            meta.source_bytes as f64 / 1e6,
            meta.source_bytes as f64 / 1e6 / secs.max(1e-9)
        );
        Ok(meta)
    }
}

/// One line describing prepared data.
pub fn describe(meta: &TokenDataMeta, dir: &Path) -> String {
    format!(
        "{}: {} tokens ({:?}, {} ids) from {} file(s), {:.1} MB; training {} tokens, validation {} (the last {:.0}%)",
        dir.display(),
        meta.num_tokens,
        meta.dtype,
        meta.vocab_size,
        meta.sources.len(),
        meta.source_bytes as f64 / 1e6,
        meta.train_tokens,
        meta.num_tokens - meta.train_tokens,
        100.0 * meta.val_fraction
    )
}

/// Runs `mha prepare`.
pub fn run(args: &PrepareArgs) -> Result<()> {
    let job = PrepareJob {
        text: &args.text,
        tokens: &args.tokens,
        tokenizer: args.tokenizer.as_deref(),
        vocab_size: args.vocab_size,
        bpe_sample_mb: args.bpe_sample_mb,
        val_fraction: args.val_fraction,
        chunk_kb: args.chunk_kb,
        quiet: args.quiet,
    };
    // One process writes a data directory at a time.
    let _lock = candle_mha::io::DirLock::acquire(&args.out, "mha prepare")?;
    let meta = job.run(&args.out)?;
    println!("{}", describe(&meta, &args.out));
    Ok(())
}
