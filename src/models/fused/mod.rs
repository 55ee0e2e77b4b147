//! CPU ops for the model's layers, forward and backward in one pass each: layer
//! normalisation, the exact GELU (alone and after the MLP's first linear layer) and the
//! masked cross-entropy.
//!
//! Built from candle's generic ops these cost many passes over the activations (layer norm:
//! ~10 forward and ~25 backward, each gradient added into a fresh zero tensor; GELU's backward
//! 8 single-threaded passes with `erf` recomputed), which made them most of a training step.
//! Other devices and dtypes keep the generic ops.

mod cross_entropy;
mod gelu;
mod layer_norm;
mod linear_gelu;

pub(crate) use cross_entropy::cross_entropy_rows;
pub(crate) use gelu::gelu_erf;
pub(crate) use layer_norm::layer_norm;
pub(crate) use linear_gelu::linear_gelu;

#[cfg(test)]
mod tests;
