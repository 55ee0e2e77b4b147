//! PyTorch's Transformer layers: [`TransformerEncoderLayer`], [`TransformerEncoder`],
//! [`TransformerDecoderLayer`], [`TransformerDecoder`] and [`Transformer`], with PyTorch's
//! parameter names, initialisation and semantics (post- and pre-norm, relu/gelu, masks,
//! dropout in training mode), built on [`MultiheadAttention`](crate::MultiheadAttention) and the
//! fused CPU ops of [`crate::nn`].
//!
//! Layering: the top of the crate, above the attention core and [`crate::checkpoint`].

mod checks;
mod config;
mod decoder;
mod decoder_layer;
mod encoder;
mod encoder_layer;
mod load;
mod options;
mod parts;
#[allow(clippy::module_inception)]
mod transformer;

pub use config::{
    Activation, FinalNorm, TransformerDecoderLayerConfig, TransformerEncoderLayerConfig,
    TransformerLayerConfig,
};
pub use decoder::TransformerDecoder;
pub use decoder_layer::TransformerDecoderLayer;
pub use encoder::TransformerEncoder;
pub use encoder_layer::TransformerEncoderLayer;
pub use load::{LoadTransformer, TransformerLoadOptions};
pub use options::{DecoderOptions, EncoderOptions};
pub use transformer::{Transformer, TransformerConfig, TransformerOptions};
