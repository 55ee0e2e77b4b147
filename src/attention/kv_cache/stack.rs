//! [`StackKvCache`]: the key/value caches of a stack of self-attention layers (a decoder-only
//! model), one [`KvCache`] per layer plus each row's left padding (for its positions).

use candle::Result;

use super::KvCache;
use crate::attention::MultiheadAttention;

/// The keys and values a stack of self-attention layers has seen, one [`KvCache`] per layer
/// (e.g. for `NextTokenPredictor::forward_incremental` in candle-mha-train).
///
/// # Shapes
/// Every layer's cache holds `(N, H, len, E / H)` keys and values for `N` =
/// [`batch_size`](Self::batch_size) rows and `len` = [`len`](Self::len) columns, grown by
/// preallocated blocks.
///
/// # Positions
/// The position of column `c` in row `r` is `c - left_padding[r]` (default padding 0: the
/// column itself, as a full forward pass numbers positions). A row padded
/// on the left with `k` columns ([`set_left_padding`](Self::set_left_padding)) thus gives its
/// first real token position 0, as the row alone would; its padding columns take position 0
/// and must be masked by the key padding mask.
///
/// PyTorch equivalent: Hugging Face's `past_key_values` (a tuple of per-layer key/value
/// tensors) together with `position_ids = attention_mask.cumsum(-1) - 1` for left padding.
#[derive(Clone, Debug)]
pub struct StackKvCache {
    layers: Vec<KvCache>,
    left_padding: Vec<usize>,
}

impl StackKvCache {
    /// An empty cache for the self-attention `layers` (in order) and `batch_size` rows,
    /// growing as needed.
    ///
    /// PyTorch equivalent: `past_key_values = None` before the first call.
    pub fn new(layers: &[&MultiheadAttention], batch_size: usize) -> Result<Self> {
        Self::build(layers, batch_size, None)
    }

    /// An empty cache with room for `capacity` columns before it grows (e.g. the prompt plus
    /// the new tokens, at most `max_len`).
    pub fn with_capacity(
        layers: &[&MultiheadAttention],
        batch_size: usize,
        capacity: usize,
    ) -> Result<Self> {
        Self::build(layers, batch_size, Some(capacity))
    }

    fn build(
        attentions: &[&MultiheadAttention],
        batch_size: usize,
        capacity: Option<usize>,
    ) -> Result<Self> {
        if batch_size == 0 {
            candle::bail!("StackKvCache: batch_size must be at least 1, got 0")
        }
        let layers = attentions
            .iter()
            .map(|&attn| match capacity {
                Some(cap) => KvCache::with_capacity(attn, batch_size, cap),
                None => KvCache::new(attn, batch_size),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            left_padding: vec![0; batch_size],
        })
    }

    /// Columns cached so far (the same in every layer).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `N`.
    pub fn batch_size(&self) -> usize {
        self.left_padding.len()
    }

    /// Layers covered (one [`KvCache`] each).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Each row's left padding in columns (see the type's docs on positions).
    pub fn left_padding(&self) -> &[usize] {
        &self.left_padding
    }

    /// Declares that row `r` starts with `padding[r]` padding columns, so that its first
    /// real token takes position 0. Only on an empty cache, one entry per row; the padding
    /// columns must also be marked in the key padding mask of each incremental call.
    pub fn set_left_padding(&mut self, padding: &[usize]) -> Result<()> {
        if padding.len() != self.batch_size() {
            candle::bail!(
                "set_left_padding: expected one padding per row ({} rows), got {}",
                self.batch_size(),
                padding.len()
            )
        }
        if !self.is_empty() {
            candle::bail!(
                "set_left_padding: the cache already holds {} columns; set the padding before \
                 the first forward_incremental (or after reset)",
                self.len()
            )
        }
        self.left_padding = padding.to_vec();
        Ok(())
    }

    /// Empties every layer's cache (keeping its memory and the left padding), to start a new
    /// sequence of the same batch size.
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(KvCache::reset);
    }

    /// The per-layer caches.
    pub fn layers(&self) -> &[KvCache] {
        &self.layers
    }

    /// The per-layer caches, for a model's incremental forward to pass layer `i`'s to
    /// [`MultiheadAttention::forward_incremental`].
    pub fn layers_mut(&mut self) -> &mut [KvCache] {
        &mut self.layers
    }
}
