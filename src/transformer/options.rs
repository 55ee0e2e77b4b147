//! The per-call arguments of the encoder ([`EncoderOptions`]) and decoder ([`DecoderOptions`])
//! layers and stacks.
//!
//! Masks follow [`AttentionOptions`](crate::AttentionOptions): bool masks are `u8` tensors,
//! nonzero = masked (PyTorch's `True`); float masks (the input's dtype) are added to the scores.

use candle::Tensor;

/// The arguments of [`TransformerEncoderLayer::forward`](super::TransformerEncoderLayer::forward)
/// and [`TransformerEncoder::forward`](super::TransformerEncoder::forward).
///
/// PyTorch equivalent: `forward(src, mask=None, src_key_padding_mask=None, is_causal=False)`
/// (the layer calls the first `src_mask`), plus `train` for `module.train()` / `.eval()`.
///
/// # Shapes
/// - `mask`: `(S, S)` or `(N·nhead, S, S)`.
/// - `src_key_padding_mask`: `(N, S)`, or `(S)` for unbatched input.
#[derive(Clone, Debug, Default)]
pub struct EncoderOptions {
    /// Attention mask of the self-attention. Default `None`.
    pub mask: Option<Tensor>,
    /// Keys to ignore per batch element. Default `None`.
    pub src_key_padding_mask: Option<Tensor>,
    /// Causal self-attention: with no `mask` the causal mask is built (PyTorch requires it to be
    /// given); with a `mask` that mask is used (PyTorch's hint). Default `false`.
    pub is_causal: bool,
    /// Training mode: dropout on. Default `false` (eval).
    pub train: bool,
    /// Seed of this call's dropout masks; `None` draws them from the layer's seed and a call
    /// counter. Default `None`. Not in PyTorch.
    pub dropout_seed: Option<u64>,
}

impl EncoderOptions {
    /// No masks, not causal, eval mode.
    pub fn new() -> Self {
        Self::default()
    }
}

crate::setters! {
    EncoderOptions {
        with_mask(mask: Some(Tensor));
        with_src_key_padding_mask(src_key_padding_mask: Some(Tensor));
        with_is_causal(is_causal: bool);
        with_train(train: bool);
        with_dropout_seed(dropout_seed: Some(u64));
    }
}

/// The arguments of [`TransformerDecoderLayer::forward`](super::TransformerDecoderLayer::forward)
/// and [`TransformerDecoder::forward`](super::TransformerDecoder::forward).
///
/// PyTorch equivalent: `forward(tgt, memory, tgt_mask=None, memory_mask=None,
/// tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
/// memory_is_causal=False)`, plus `train`.
///
/// # Shapes
/// - `tgt_mask`: `(T, T)` or `(N·nhead, T, T)`; `memory_mask`: `(T, S)` or `(N·nhead, T, S)`.
/// - `tgt_key_padding_mask`: `(N, T)`; `memory_key_padding_mask`: `(N, S)` (no `N` unbatched).
#[derive(Clone, Debug, Default)]
pub struct DecoderOptions {
    /// Attention mask of the self-attention. Default `None`.
    pub tgt_mask: Option<Tensor>,
    /// Attention mask of the cross-attention. Default `None`.
    pub memory_mask: Option<Tensor>,
    /// Target keys to ignore per batch element. Default `None`.
    pub tgt_key_padding_mask: Option<Tensor>,
    /// Memory keys to ignore per batch element. Default `None`.
    pub memory_key_padding_mask: Option<Tensor>,
    /// Causal self-attention (see [`EncoderOptions::is_causal`]). Default `false`.
    pub tgt_is_causal: bool,
    /// Causal cross-attention (see [`EncoderOptions::is_causal`]). Default `false`.
    pub memory_is_causal: bool,
    /// Training mode: dropout on. Default `false` (eval).
    pub train: bool,
    /// Seed of this call's dropout masks (see [`EncoderOptions::dropout_seed`]). Not in PyTorch.
    pub dropout_seed: Option<u64>,
}

impl DecoderOptions {
    /// No masks, not causal, eval mode.
    pub fn new() -> Self {
        Self::default()
    }
}

crate::setters! {
    DecoderOptions {
        with_tgt_mask(tgt_mask: Some(Tensor));
        with_memory_mask(memory_mask: Some(Tensor));
        with_tgt_key_padding_mask(tgt_key_padding_mask: Some(Tensor));
        with_memory_key_padding_mask(memory_key_padding_mask: Some(Tensor));
        with_tgt_is_causal(tgt_is_causal: bool);
        with_memory_is_causal(memory_is_causal: bool);
        with_train(train: bool);
        with_dropout_seed(dropout_seed: Some(u64));
    }
}
