//! [`IncrementalOptions`]: the per-call options of the incremental calls.

use candle::Tensor;

use crate::attention::AttentionKernel;

/// The per-call options of
/// [`forward_incremental`](crate::MultiheadAttention::forward_incremental) and
/// [`forward_with_memory`](crate::MultiheadAttention::forward_with_memory). Decoding is
/// inference: there is no dropout and no `train` flag.
///
/// PyTorch equivalent: the keyword arguments of `MultiheadAttention.forward` in eval mode
/// (`key_padding_mask`, `need_weights`, `average_attn_weights`); causal masking is implied.
#[derive(Clone, Debug)]
pub struct IncrementalOptions {
    /// Padding of the NEW positions: `(N, T)` (or `(T)` unbatched), u8 (nonzero = padded) or
    /// a float additive mask in the query's dtype. Earlier positions' padding is remembered
    /// by the [`KvCache`](super::KvCache). Must be `None` in `forward_with_memory` (the
    /// memory's padding is given to `project_memory`). Default `None`.
    pub key_padding_mask: Option<Tensor>,
    /// Return the attention weights `(N, T, S')` (averaged) or `(N, H, T, S')`. Default
    /// `false`: decoding rarely needs them.
    pub need_weights: bool,
    /// Average the weights over heads. Default `true`.
    pub average_attn_weights: bool,
    /// Which implementation computes the attention. Default [`AttentionKernel::Auto`]: the
    /// fused kernels on the CPU in f32/f64 and on CUDA without weights, the reference ops
    /// elsewhere.
    pub kernel: AttentionKernel,
}

impl Default for IncrementalOptions {
    fn default() -> Self {
        Self {
            key_padding_mask: None,
            need_weights: false,
            average_attn_weights: true,
            kernel: AttentionKernel::Auto,
        }
    }
}

impl IncrementalOptions {
    /// No mask, no weights, averaged weights when asked for, automatic kernel.
    pub fn new() -> Self {
        Self::default()
    }
}

crate::setters! {
    IncrementalOptions {
        with_key_padding_mask(key_padding_mask: Some(Tensor));
        with_need_weights(need_weights: bool);
        with_average_attn_weights(average_attn_weights: bool);
        with_kernel(kernel: AttentionKernel);
    }
}
