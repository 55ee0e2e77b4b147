//! Reading attention: head views, labelled tables, heatmaps, a vocabulary × vocabulary matrix
//! over a corpus, attention graphs (rollout, flow), source segments, word vectors.
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
//! head ablation ([`AttentionOptions::head_mask`](crate::AttentionOptions)) to check that a
//! head you read actually matters to the output.
