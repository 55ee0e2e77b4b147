//! Checkpoint I/O: PyTorch state_dicts in, PyTorch state_dicts out.
//!
//! - [`StateDict`] reads safetensors and `torch.save` pickles (zip or legacy format, also
//!   nested under `state_dict`/`model`, or a whole pickled model; `pickle.rs` is the reader),
//!   lists what it cannot represent in [`StateDict::skipped`], and writes safetensors with
//!   `{"format": "pt"}`, atomically. [`cast`] converts dtypes, float8 included.
//! - [`load_into_varmap`] loads any model tree held in a `VarMap`, strictly or not, with a
//!   [`LoadReport`] like PyTorch's `load_state_dict`.
//! - [`CheckpointError`]: the failures a caller can match (unreadable, invalid, a strict
//!   load's mismatches, an unsupported setting), carried through `candle::Error`.
//! - [`find_attention_modules`] lists the attention layers of a checkpoint;
//!   [`load_attention`] builds one, inferring its configuration; [`save_modules`] writes
//!   modules at their prefixes.
//! - [`find_transformer_modules`] lists PyTorch's Transformer layers, stacks and whole models
//!   in a checkpoint, with the sizes their tensors tell; the loaders that build them with a
//!   [`LoadReport`] are in [`crate::transformer`] (`LoadTransformer`), a layer
//!   above.

mod attention_io;
mod cast;
mod discover;
mod error;
mod load;
mod pickle;
mod report;
mod state_dict;
mod transformer_discover;

pub use attention_io::{
    load_attention, load_attention_file, save_modules, state_dict_of, AttentionLoadOptions,
    LoadedAttention, NamedParameters,
};
pub use cast::cast;
pub use discover::{find_attention_modules, InferredAttention};
pub use error::CheckpointError;
pub use load::{load_into_varmap, load_into_varmap_owned, LoadOptions};
pub use pickle::{load_pickle, parse_plain_pickle, save_torch, PickleValue};
pub use report::{DtypeCast, LoadReport, ShapeMismatch};
pub use state_dict::{normalize_prefix, CheckpointFormat, StateDict};
pub use transformer_discover::{
    find_transformer_modules, InferredTransformer, InferredTransformerLayer,
    InferredTransformerModule, InferredTransformerStack,
};
