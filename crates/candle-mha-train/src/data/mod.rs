//! Training data: vocabularies, examples, padded batches and seeded, resumable batching.
//!
//! - [`Vocab`] maps symbols to ids (specials [`PAD`], [`UNK`], [`BOS`], [`EOS`] at 0..4) and
//!   is saved as `vocab.json`.
//! - [`Example`] is one sequence with its loss mask; [`Batch`] pads a few into `(N, L)`
//!   tensors; [`Dataset`] splits and orders them by seed, so training resumes mid-epoch exactly.
//! - Sources: [`AssociativeRecall`] (the default synthetic task, solvable only by attention),
//!   token files ([`read_token_file`], [`encode_sequences`]) and text through a
//!   [`TextTokenizer`] ([`text_dataset`]).
//! - [`DataSpec`]: what a run trains on, as its checkpoint records it; [`DataSpec::load`]
//!   opens it ([`RunData`]); [`Corpus`] is what an evaluation reads (a run rebuilds its own
//!   split: [`crate::run::checkpoint_corpus`]).
//! - Corpora of any size: [`prepare_text`] / [`prepare_token_files`] encode once, in bounded
//!   memory, into a data directory ([`TokenData`], memory-mapped); [`TokenWindows`] draws
//!   training windows from it by (seed, step) and fixes the validation windows;
//!   [`TextWindows`] streams any text file as windows; [`TextChunks`] and
//!   [`expand_sources`] read the sources.

mod batch;
mod corpus;
mod dataset;
mod error;
mod example;
mod prepare;
mod prepare_job;
mod source;
mod source_args;
mod spec;
mod synthetic;
mod text;
mod text_chunks;
mod text_windows;
mod token_data;
mod token_file;
mod tokenizer;
mod tokenizer_check;
mod unknown;
mod vocab;
mod windows;

pub use batch::{batches, Batch};
pub use corpus::{Corpus, RunSplit};
pub use dataset::Dataset;
pub use error::DataError;
pub use example::Example;
pub use prepare::{prepare_text, prepare_token_files, PrepareOptions, PrepareProgress};
pub use prepare_job::{
    describe_prepared, same_sources, PrepareJob, SetupObserver, DEFAULT_BPE_SAMPLE_MB,
    DEFAULT_BPE_VOCAB,
};
pub use source::{EvalSet, TrainSource, WindowSource};
pub use source_args::DataSource;
pub use spec::{
    example_text_bytes, open_prepared, target_bytes, DataSpec, RunData, DEFAULT_EVAL_WINDOWS,
};
pub use synthetic::AssociativeRecall;
pub use text::{text_dataset, TextTokenizer, MAX_BPE_VOCAB, MIN_BPE_VOCAB};
pub use text_chunks::{expand_sources, TextChunks, DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES};
pub use text_windows::TextWindows;
pub use token_data::{
    nanogpt_vocab, split_point, BpeSettings, SourceFile, TokenData, TokenDataMeta, TokenDtype,
    DATA_FORMAT, META_FILE, NANOGPT_FILES, TOKENS_FILE,
};
pub use token_file::{encode_sequences, read_token_file};
pub use tokenizer::Codec;
pub use tokenizer_check::MAX_TOKENIZER_BYTES;
pub use unknown::UnknownInput;
pub use vocab::{Vocab, BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID};
pub use windows::{consecutive_windows, windows_dataset, TokenWindows};
