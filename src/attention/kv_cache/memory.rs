//! [`MemoryCache`]: a memory's keys and values, projected once for cross-attention decoding.

use candle::Tensor;

use super::CacheGeometry;

/// Keys and values of a fixed memory (an encoder's output), projected once for
/// cross-attention decoding with
/// [`forward_with_memory`](crate::MultiheadAttention::forward_with_memory); made by
/// [`project_memory`](crate::MultiheadAttention::project_memory).
///
/// Holds `k`, `v` `(N, H, S', hd)` (the `bias_k` / zero-attention rows already appended) and
/// the memory's additive key padding `(N, S)`.
///
/// PyTorch equivalent: none in `torch.nn`; fairseq's `static_kv` entry of
/// `incremental_state`, or Hugging Face's cross-attention `past_key_values`
/// (`EncoderDecoderCache`).
#[derive(Clone, Debug)]
pub struct MemoryCache {
    pub(crate) keys: Tensor,
    pub(crate) values: Tensor,
    pub(crate) key_padding: Option<Tensor>,
    pub(crate) batch_size: usize,
    pub(crate) len: usize,
    pub(crate) geometry: CacheGeometry,
}

impl MemoryCache {
    /// Batch rows `N`.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Memory positions `S` (without the `bias_k` / zero-attention rows).
    pub fn len(&self) -> usize {
        self.len
    }

    /// An empty memory (`S = 0`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
