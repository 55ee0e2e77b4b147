//! Training data: vocabularies, examples, padded batches and seeded, resumable batching.
//!
//! - [`Vocab`] maps symbols to ids (specials [`PAD`], [`UNK`], [`BOS`], [`EOS`] at 0..4) and
//!   is saved as `vocab.json`.
//! - [`Example`] is one sequence with its loss mask; [`Batch`] pads a few into `(N, L)`
//!   tensors; [`Dataset`] splits and orders them by seed, so training resumes mid-epoch exactly.
//! - Sources: [`AssociativeRecall`] (the default synthetic task, solvable only by attention),
//!   token files ([`read_token_file`], [`encode_sequences`]) and text through a
//!   [`TextTokenizer`] ([`text_dataset`]).

mod batch;
mod codec;
mod dataset;
mod example;
mod synthetic;
mod text;
mod token_file;
mod vocab;

pub use batch::Batch;
pub use codec::{Codec, TOKENIZER_FILE, VOCAB_FILE};
pub use dataset::Dataset;
pub use example::Example;
pub use synthetic::AssociativeRecall;
pub use text::{text_dataset, TextTokenizer};
pub use token_file::{encode_sequences, read_token_file};
pub use vocab::{Vocab, BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID};
