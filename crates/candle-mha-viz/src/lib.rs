//! # candle-mha-viz
//!
//! Reading attention from [candle-mha](candle_mha) models: head statistics and ablation
//! ([`heads`]), labelled tables, PNG/SVG heatmaps, a vocabulary × vocabulary matrix over a
//! corpus, attention graphs, rollout and flow, source segments, word vectors, line charts of
//! training curves, and self-contained interactive HTML pages ([`html`]).
//!
//! ```
//! use candle_mha::candle::{DType, Device, Tensor};
//! use candle_mha::{seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
//! use candle_mha_viz::{format_table, heatmap_png, HeatmapOptions, TableOptions};
//! # fn main() -> candle_mha::candle::Result<()> {
//! let varmap = candle_mha::candle_nn::VarMap::new();
//! let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
//! let mha = MultiheadAttention::new(MultiheadAttentionConfig::new(8, 2), vb)?;
//! let x = Tensor::randn(0f32, 1., (3, 8), &Device::Cpu)?; // (L, E): unbatched
//! let w = mha.forward(&x, &x, &x, &AttentionOptions::new())?.weights.unwrap(); // (L, S)
//! let tokens: Vec<String> = ["the", "cat", "sat"].map(String::from).to_vec();
//! println!("{}", format_table(&w, &tokens, &tokens, &TableOptions::default())?);
//! let png = heatmap_png(&w, &tokens, &tokens, &HeatmapOptions::default())?; // bytes of a PNG
//! assert!(png.starts_with(b"\x89PNG"));
//! # Ok(())
//! # }
//! ```
//!
//! # What attention weights do and do not explain
//! Attention weights say how much each query position mixes each key position's *value* in one
//! layer. They are not, by themselves, an explanation of the model's output: different weight
//! patterns can give the same predictions and weights can disagree with gradient-based
//! importance (Jain & Wallace 2019, "Attention is not Explanation"), although for many tasks
//! they are a meaningful signal once tested against alternatives (Wiegreffe & Pinter 2019,
//! "Attention is not not Explanation"). Across layers, information mixes through residual
//! connections, so one layer's weights understate how tokens combine; attention rollout and
//! attention flow (Abnar & Zuidema 2020) propagate weights through the layers instead. Use
//! head ablation ([`AttentionOptions::head_mask`](candle_mha::AttentionOptions)) to check that a
//! head you read actually matters to the output.
#![warn(missing_docs)]

/// The attention core this crate builds on (re-exported so users match its version).
pub use candle_mha;

pub mod heads;
pub mod sources;
pub mod table;
pub use heads::{
    argmax_head, fuse_heads, head_ablation, head_stats, row_entropy, row_max, Ablation, HeadFusion,
    HeadStats,
};
pub use sources::{dominant_source, source_mass, Segments};
pub use table::{format_table, TableOptions};
pub mod graph;
pub mod rollout;
pub mod vocab_matrix;
pub use graph::{is_symmetric, max_asymmetry, AttentionGraph, GraphOptions};
pub use rollout::{attention_flow, attention_rollout, ATTENTION_FLOW_MAX_LEN};
pub use vocab_matrix::{corpus_vocab_matrix, VocabMatrix, DEFAULT_MAX_CELLS, MAX_DENSE_VOCAB};
mod canvas;
mod escape;
mod font;
pub mod heatmap;
pub mod html;
pub mod line_plot;
pub mod word_vectors;
pub use heatmap::{
    colormap, heatmap_grid_png, heatmap_grid_svg, heatmap_png, heatmap_svg, HeatmapOptions,
};
pub use line_plot::{LinePlot, LineStyle, Series, PALETTE};
pub use word_vectors::{
    cosine_attention, cosine_similarity_matrix, load_glove, read_glove, self_attention, WordVectors,
};

/// The guide to reading attention, its examples compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("MHA_WORKSPACE_DIR"), "/docs/reading-attention.md"))]
pub struct ReadingAttentionGuide;
