//! The key/value caches of incremental decoding: [`KvCache`] (self-attention, grown as tokens
//! come), [`MemoryCache`] (cross-attention, a memory projected once) and the per-call
//! [`IncrementalOptions`].
//!
//! PyTorch's `nn.MultiheadAttention` has no cache; generation libraries wrap their own
//! (fairseq's `incremental_state`, Hugging Face's `past_key_values`), which is what these are.

use candle::{DType, Device, Result, Tensor};

use super::mask::additive_mask;
use super::softmax::softmax_dtype;
use super::{AttentionKernel, MultiheadAttention, MultiheadAttentionConfig};

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

/// What a cache must agree on with the module that uses it.
#[derive(Clone, Debug)]
pub(crate) struct CacheGeometry {
    pub embed_dim: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    /// `bias_k` and zero-attention rows appended after the keys.
    pub extra: usize,
    pub dtype: DType,
    pub device: Device,
}

impl CacheGeometry {
    pub(crate) fn of(mha: &MultiheadAttention) -> Self {
        let cfg: &MultiheadAttentionConfig = mha.config();
        let w = mha.out_proj().weight();
        Self {
            embed_dim: cfg.embed_dim,
            num_heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
            extra: usize::from(cfg.add_bias_kv) + usize::from(cfg.add_zero_attn),
            dtype: w.dtype(),
            device: w.device().clone(),
        }
    }

    /// An error naming `what` (the cache or memory) when it was made for another module.
    pub(crate) fn check(&self, module: &CacheGeometry, what: &str) -> Result<()> {
        let field_err = |field: &str, got: String, want: String| -> Result<()> {
            candle::bail!(
                "{what} was made for a module with {field} {got}, but this module has {field} {want}: a cache belongs to the module that made it"
            )
        };
        if self.embed_dim != module.embed_dim {
            field_err(
                "embed_dim",
                self.embed_dim.to_string(),
                module.embed_dim.to_string(),
            )?
        }
        if self.num_heads != module.num_heads {
            field_err(
                "num_heads",
                self.num_heads.to_string(),
                module.num_heads.to_string(),
            )?
        }
        if self.extra != module.extra {
            field_err(
                "extra key rows (add_bias_kv + add_zero_attn)",
                self.extra.to_string(),
                module.extra.to_string(),
            )?
        }
        if self.dtype != module.dtype {
            field_err(
                "dtype",
                format!("{:?}", self.dtype),
                format!("{:?}", module.dtype),
            )?
        }
        if !self.device.same_device(&module.device) {
            field_err(
                "device",
                format!("{:?}", self.device.location()),
                format!("{:?}", module.device.location()),
            )?
        }
        Ok(())
    }
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

    /// An empty cache with room for `capacity` positions before it grows.
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

/// Keys and values of a fixed memory (an encoder's output), projected once for
/// cross-attention decoding with [`MultiheadAttention::forward_with_memory`]; made by
/// [`MultiheadAttention::project_memory`].
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

/// The per-call options of [`MultiheadAttention::forward_incremental`] and
/// [`MultiheadAttention::forward_with_memory`]. Decoding is inference: there is no dropout
/// and no `train` flag.
///
/// PyTorch equivalent: the keyword arguments of `MultiheadAttention.forward` in eval mode
/// (`key_padding_mask`, `need_weights`, `average_attn_weights`); causal masking is implied.
#[derive(Clone, Debug)]
pub struct IncrementalOptions {
    /// Padding of the NEW positions: `(N, T)` (or `(T)` unbatched), u8 (nonzero = padded) or
    /// a float additive mask in the query's dtype. Earlier positions' padding is remembered
    /// by the [`KvCache`]. Must be `None` in `forward_with_memory` (the memory's padding is
    /// given to `project_memory`). Default `None`.
    pub key_padding_mask: Option<Tensor>,
    /// Return the attention weights `(N, T, S')` (averaged) or `(N, H, T, S')`. Default
    /// `false`: decoding rarely needs them.
    pub need_weights: bool,
    /// Average the weights over heads. Default `true`.
    pub average_attn_weights: bool,
    /// Which implementation computes the attention. Default [`AttentionKernel::Auto`]: the
    /// fused kernel on the CPU in f32/f64, the reference ops elsewhere.
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

    /// Sets [`key_padding_mask`](Self::key_padding_mask).
    pub fn with_key_padding_mask(mut self, mask: Tensor) -> Self {
        self.key_padding_mask = Some(mask);
        self
    }

    /// Sets [`need_weights`](Self::need_weights).
    pub fn with_need_weights(mut self, need_weights: bool) -> Self {
        self.need_weights = need_weights;
        self
    }

    /// Sets [`average_attn_weights`](Self::average_attn_weights).
    pub fn with_average_attn_weights(mut self, average: bool) -> Self {
        self.average_attn_weights = average;
        self
    }

    /// Sets [`kernel`](Self::kernel).
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
        self
    }
}
