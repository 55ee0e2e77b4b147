//! The key/value caches of incremental decoding: [`KvCache`] (self-attention, grown as tokens
//! come), [`StackKvCache`] (one per layer of a decoder stack, with left padding),
//! [`MemoryCache`] (cross-attention, a memory projected once) and the per-call
//! [`IncrementalOptions`].
//!
//! PyTorch's `nn.MultiheadAttention` has no cache; generation libraries wrap their own
//! (fairseq's `incremental_state`, Hugging Face's `past_key_values`), which is what these are.

use candle::{Result, Tensor};

use super::mask::additive_mask;
use super::MultiheadAttention;
use crate::numerics::softmax_dtype;

mod geometry;
mod memory;
mod options;
mod stack;

pub(crate) use geometry::CacheGeometry;
pub use memory::MemoryCache;
pub use options::IncrementalOptions;
pub use stack::StackKvCache;

/// Positions a cache grows by at least (its buffers are reallocated rarely: the capacity at
/// least doubles, rounded up to a whole block).
const BLOCK: usize = 64;

/// Projected keys and values of the positions seen so far, per batch row, for self-attention
/// decoding with [`MultiheadAttention::forward_incremental`].
///
/// The buffers are `(N, H, capacity, head_dim)`, preallocated and grown by blocks (never a
/// concatenation per token); the key padding of cached positions is remembered. A cache
/// belongs to one module: its heads, head size, dtype and device are checked on every call.
/// The `bias_k` / zero-attention columns are not positions: they are placed after the last
/// key at attention time, as `forward` places them.
///
/// PyTorch equivalent: none in `torch.nn`; fairseq's `incremental_state` for one attention
/// layer, or one layer's entry of Hugging Face's `past_key_values` (`DynamicCache`).
///
/// ```
/// use candle::{DType, Device, Tensor};
/// use candle_mha::{seeded_var_builder, AttentionOptions, IncrementalOptions, KvCache};
/// use candle_mha::{MultiheadAttention, MultiheadAttentionConfig};
/// # fn main() -> candle::Result<()> {
/// let varmap = candle_nn::VarMap::new();
/// let cfg = MultiheadAttentionConfig::new(8, 2).with_batch_first(true);
/// let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu))?;
/// let x = Tensor::randn(0f32, 1., (1, 5, 8), &Device::Cpu)?; // (N, L, E)
/// let mut cache = KvCache::new(&mha, 1)?;
/// let opts = IncrementalOptions::new();
/// let prompt = mha.forward_incremental(&x.narrow(1, 0, 3)?, &mut cache, &opts)?; // 3 tokens
/// let next = mha.forward_incremental(&x.narrow(1, 3, 2)?, &mut cache, &opts)?; // 2 more
/// assert_eq!(cache.len(), 5);
/// // The same as attending over the whole sequence causally.
/// let full = mha.forward(&x, &x, &x, &AttentionOptions::new().with_is_causal(true))?;
/// let inc = Tensor::cat(&[&prompt.output, &next.output], 1)?;
/// let diff = (full.output - inc)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
/// assert!(diff < 1e-5);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct KvCache {
    /// `(N, H, capacity + extra, hd)`, or `None` before the first allocation. The `extra`
    /// rows after the last position hold the `bias_k`/`bias_v` and zero-attention rows so that
    /// the keys of one call are one contiguous view.
    k: Option<Tensor>,
    v: Option<Tensor>,
    /// Additive key padding of the cached positions `(N, capacity)` in the softmax dtype, or
    /// `None` while no position has been padded.
    key_padding: Option<Tensor>,
    len: usize,
    capacity: usize,
    batch_size: usize,
    geometry: CacheGeometry,
    /// Why this cache is unusable: a [`Clone`] whose copy failed.
    failed_clone: Option<String>,
}

/// A deep copy ([`KvCache::try_clone`]): the buffers are written in place, so a clone
/// sharing them would clobber the original's later positions (beam search clones caches).
/// Should the copy fail (device memory), the clone is unusable: every call with it returns
/// that error.
impl Clone for KvCache {
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(c) => c,
            Err(e) => Self {
                k: None,
                v: None,
                key_padding: None,
                len: self.len,
                capacity: 0,
                batch_size: self.batch_size,
                geometry: self.geometry.clone(),
                failed_clone: Some(e.to_string()),
            },
        }
    }
}

impl KvCache {
    /// An empty cache for `batch_size` rows of `mha` (its heads, dtype and device); the
    /// buffers are allocated on the first call.
    ///
    /// PyTorch equivalent: an empty `incremental_state` / `DynamicCache()`.
    pub fn new(mha: &MultiheadAttention, batch_size: usize) -> Result<Self> {
        Self::with_capacity(mha, batch_size, 0)
    }

    /// An empty cache with room for at least `capacity` positions before it grows (one
    /// allocation for a known generation length).
    ///
    /// PyTorch equivalent: preallocating like Hugging Face's `StaticCache(max_cache_len=…)`,
    /// though this one still grows past it.
    pub fn with_capacity(
        mha: &MultiheadAttention,
        batch_size: usize,
        capacity: usize,
    ) -> Result<Self> {
        let mut cache = Self {
            k: None,
            v: None,
            key_padding: None,
            len: 0,
            capacity: 0,
            batch_size,
            geometry: CacheGeometry::of(mha),
            failed_clone: None,
        };
        if capacity > 0 {
            cache.grow_to(capacity)?;
        }
        Ok(cache)
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No position cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batch rows `N`.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Positions the buffers hold before they must grow.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position (length 0) and keeps the buffers for the next sequence (a
    /// failed clone becomes an empty, usable cache).
    pub fn reset(&mut self) {
        self.len = 0;
        self.key_padding = None;
        self.failed_clone = None;
    }

    /// A deep copy of the cache (its own buffers), or the copy's error.
    ///
    /// PyTorch equivalent: `copy.deepcopy(past_key_values)`.
    pub fn try_clone(&self) -> Result<Self> {
        self.usable()?;
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        Ok(Self {
            k: copy(&self.k)?,
            v: copy(&self.v)?,
            key_padding: copy(&self.key_padding)?,
            len: self.len,
            capacity: self.capacity,
            batch_size: self.batch_size,
            geometry: self.geometry.clone(),
            failed_clone: None,
        })
    }

    /// An error when this cache is a failed clone.
    fn usable(&self) -> Result<()> {
        match &self.failed_clone {
            Some(e) => candle::bail!("cache: this KvCache is a clone whose copy failed ({e})"),
            None => Ok(()),
        }
    }

    /// The check of every call: the cache is usable and was made for this module.
    pub(crate) fn check_module(&self, module: &CacheGeometry) -> Result<()> {
        self.usable()?;
        self.geometry.check(module, "cache")
    }

    /// Reallocates the buffers for at least `needed` positions, keeping the cached ones.
    fn grow_to(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity && self.k.is_some() {
            return Ok(());
        }
        let cap = needed.max(2 * self.capacity).div_ceil(BLOCK) * BLOCK;
        let g = &self.geometry;
        let shape = (self.batch_size, g.num_heads, cap + g.extra, g.head_dim);
        let (k, v) = (
            Tensor::zeros(shape, g.dtype, &g.device)?,
            Tensor::zeros(shape, g.dtype, &g.device)?,
        );
        if let (Some(old_k), Some(old_v)) = (&self.k, &self.v) {
            if self.len > 0 {
                k.slice_set(&old_k.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                v.slice_set(&old_v.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
            }
        }
        if let Some(old) = &self.key_padding {
            let kp = Tensor::zeros((self.batch_size, cap), old.dtype(), &g.device)?;
            if self.len > 0 {
                kp.slice_set(&old.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
            }
            self.key_padding = Some(kp);
        }
        self.k = Some(k);
        self.v = Some(v);
        self.capacity = cap;
        Ok(())
    }

    /// Appends new keys and values `(N, H, T, hd)` (and their key padding `(N, T)`, any
    /// dtype of [`additive_mask`]) after the cached positions, then writes the `extra` rows
    /// (`(1, H, extra, hd)`-broadcastable, or `None` without extra rows) after them. Returns
    /// the keys, values `(N, H, len + extra, hd)` and the additive key padding `(N, len)`
    /// of the positions so far.
    pub(crate) fn append(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        key_padding: Option<&Tensor>,
        extra: Option<(&Tensor, &Tensor)>,
    ) -> Result<CachedKeys> {
        let t = k.dim(2)?;
        let start = self.len;
        self.grow_to(start + t)?;
        let (Some(kb), Some(vb)) = (&self.k, &self.v) else {
            candle::bail!("KvCache: buffers missing after allocation")
        };
        if t > 0 {
            kb.slice_set(&k.contiguous()?, 2, start)?;
            vb.slice_set(&v.contiguous()?, 2, start)?;
        }
        let mask_dtype = softmax_dtype(self.geometry.dtype);
        if let Some(m) = key_padding {
            let m = additive_mask(m, mask_dtype)?.contiguous()?;
            let kp = match &self.key_padding {
                Some(kp) => kp.clone(),
                None => {
                    let kp = Tensor::zeros(
                        (self.batch_size, self.capacity),
                        mask_dtype,
                        &self.geometry.device,
                    )?;
                    self.key_padding = Some(kp.clone());
                    kp
                }
            };
            kp.slice_set(&m, 1, start)?;
        } else if let Some(kp) = &self.key_padding {
            // Earlier positions were padded: the new ones are not.
            let zeros = Tensor::zeros((self.batch_size, t), mask_dtype, &self.geometry.device)?;
            kp.slice_set(&zeros, 1, start)?;
        }
        self.len = start + t;
        if let Some((ek, ev)) = extra {
            let shape = (
                self.batch_size,
                self.geometry.num_heads,
                self.geometry.extra,
                self.geometry.head_dim,
            );
            kb.slice_set(&ek.broadcast_as(shape)?.contiguous()?, 2, self.len)?;
            vb.slice_set(&ev.broadcast_as(shape)?.contiguous()?, 2, self.len)?;
        }
        let total = self.len + self.geometry.extra;
        Ok(CachedKeys {
            k: kb.narrow(2, 0, total)?,
            v: vb.narrow(2, 0, total)?,
            key_padding: self
                .key_padding
                .as_ref()
                .map(|kp| kp.narrow(1, 0, self.len))
                .transpose()?,
            s_masked: self.len,
        })
    }
}

/// The keys an incremental call attends over.
pub(crate) struct CachedKeys {
    /// `(N, H, S', hd)`: the positions, then the extra rows.
    pub k: Tensor,
    pub v: Tensor,
    /// Additive `(N, s_masked)` in the softmax dtype.
    pub key_padding: Option<Tensor>,
    /// Positions (keys that masks apply to); `S' - s_masked` extra rows follow.
    pub s_masked: usize,
}
