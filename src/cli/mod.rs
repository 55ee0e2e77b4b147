//! The subcommands of the `mha` binary, one per file.

mod bounds;
mod checkpoint_dir;
pub mod choices;
pub mod convert;
mod data_source;
pub mod eval;
pub mod generate;
pub mod info;
pub mod inspect;
pub mod plot;
pub mod prepare;
pub mod train;
pub mod vocab_matrix;
