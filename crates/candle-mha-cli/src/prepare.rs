//! `mha prepare`: encode a corpus once into a data directory that `mha train --data` and
//! `mha eval --data` read memory-mapped.

use std::path::PathBuf;

use anyhow::Result;
use candle_mha_train::data::{
    describe_prepared, PrepareJob, PrepareOptions, PrepareProgress, SetupObserver,
    DEFAULT_BPE_SAMPLE_MB, DEFAULT_BPE_VOCAB, DEFAULT_CHUNK_BYTES, MAX_BPE_VOCAB, MAX_CHUNK_BYTES,
    MIN_BPE_VOCAB,
};
use indicatif::{ProgressBar, ProgressStyle};

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
    #[arg(long, value_parser = crate::bounds::below(0.0, 1.0), default_value_t = PrepareOptions::default().val_fraction)]
    pub val_fraction: f64,
    /// Kilobytes of text encoded at a time per thread (1 to 262144).
    #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES / 1024,
          value_parser = super::bounds::count(1, MAX_CHUNK_BYTES as u64 / 1024))]
    pub chunk_kb: usize,
    /// Leave out text the tokenizer cannot encode (counted in a warning) instead of refusing
    /// it.
    #[arg(long)]
    pub skip_unknown: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The CLI's view of a set-up: notices on stderr, the encoding's progress as a bar (hidden
/// when `quiet` or without a terminal).
pub struct Notices {
    bar: ProgressBar,
    /// Whether notices are printed (rank 0 of a data-parallel run).
    pub lead: bool,
}

impl Notices {
    /// Notices printed when `lead`; a progress bar unless `quiet`.
    pub fn new(quiet: bool, lead: bool) -> Result<Self> {
        let quiet = quiet || !lead || !std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = match quiet {
            true => ProgressBar::hidden(),
            false => ProgressBar::new(0),
        };
        bar.set_style(ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} [{elapsed_precise}<{eta_precise}] {binary_bytes_per_sec} {msg}",
        )?);
        Ok(Self { bar, lead })
    }
}

impl SetupObserver for Notices {
    fn notice(&mut self, line: &str) {
        if self.lead {
            self.bar.suspend(|| eprintln!("{line}"));
        }
    }

    fn progress(&mut self, p: &PrepareProgress) {
        self.bar.set_length(p.total_bytes);
        self.bar.set_position(p.bytes);
        self.bar.set_message(format!("{} tokens", p.tokens));
        if p.bytes >= p.total_bytes {
            self.bar.finish_and_clear();
        }
    }
}

/// Runs `mha prepare`.
pub fn run(args: &PrepareArgs) -> Result<()> {
    let job = PrepareJob {
        text: args.text.clone(),
        tokens: args.tokens.clone(),
        tokenizer: args.tokenizer.clone(),
        vocab_size: args.vocab_size,
        bpe_sample_mb: args.bpe_sample_mb,
        val_fraction: args.val_fraction,
        chunk_bytes: args.chunk_kb * 1024,
        skip_unknown: args.skip_unknown,
    };
    // One process writes a data directory at a time; a failure takes away what it made.
    let undo = candle_mha_train::run::undo::Undo::note(&args.out);
    let lock = candle_mha_train::run::lock::DirLock::acquire(&args.out, "mha prepare")?;
    let undo = undo.locked();
    let mut notices = Notices::new(args.quiet, true)?;
    let prepared = job.run(&args.out, &mut notices);
    notices.bar.finish_and_clear();
    drop(lock);
    let meta = prepared.inspect_err(|_| undo.undo())?;
    println!("{}", describe_prepared(&meta, &args.out));
    Ok(())
}
