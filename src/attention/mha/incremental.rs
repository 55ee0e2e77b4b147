//! Incremental decoding: self-attention over a [`KvCache`] plus the new positions, and
//! cross-attention over a [`MemoryCache`] projected once. Both project only what is new and
//! then attend in head space over the cached keys, with `forward`'s masking rules.

use candle::{DType, Result, Tensor};

use super::{InProjWeight, MultiheadAttention};
use crate::attention::fused::{decode_attention, linear};
use crate::attention::kv_cache::{CacheGeometry, CachedKeys};
use crate::attention::mask::additive_mask;
use crate::attention::softmax::safe_softmax_last_dim;
use crate::attention::{
    AttentionKernel, AttentionOutput, IncrementalOptions, KvCache, MemoryCache,
};
use crate::numerics::softmax_dtype;

mod checks;

use checks::{check_memory_inputs, check_new_padding, check_query, QueryDims};

impl MultiheadAttention {
    /// Self-attention of the new positions `query` over the cached ones and themselves,
    /// causally; appends the new keys and values to `cache`.
    ///
    /// The output and weights equal those of [`forward`](Self::forward) on the whole sequence
    /// with `is_causal` (query = key = value), at the new positions: the query at absolute
    /// position `p` attends to the positions `≤ p`, except padded ones (the padding of earlier
    /// calls is remembered by the cache), and to the `bias_k` / zero-attention columns, which
    /// come after every position and are never masked. Decoding is inference: no dropout,
    /// and no gradient through the cache (its buffers are written in place; the fused CPU
    /// kernel has no backward at all): train with `forward`.
    ///
    /// PyTorch equivalent: `module.eval(); module(x, x, x, is_causal=True,
    /// attn_mask=causal)[:, -T:]` on the whole sequence `x`, computed incrementally as
    /// fairseq's `incremental_state` or Hugging Face's `past_key_values` do.
    ///
    /// # Shapes
    /// - `query`: the `T` new positions, `(T, N, E)`, `(N, T, E)` with `batch_first`, or
    ///   `(T, E)` unbatched (with a cache of batch 1).
    /// - output: the query's shape; weights (when asked for): `(N, T, S')` averaged or
    ///   `(N, H, T, S')`, `N` dropped when unbatched, `S' = cache.len() (after the append) +
    ///   add_bias_kv + add_zero_attn`.
    ///
    /// # Errors
    /// A cache made for another module (embed size, heads, extra rows, dtype, device) or of
    /// another batch size, a query of the wrong rank, size, dtype or device, a key padding
    /// mask of the wrong shape or dtype, `kdim`/`vdim` ≠ `embed_dim` (not self-attention).
    pub fn forward_incremental(
        &self,
        query: &Tensor,
        cache: &mut KvCache,
        opts: &IncrementalOptions,
    ) -> Result<AttentionOutput> {
        self.check_no_lora("forward_incremental")?;
        let cfg = &self.config;
        let geometry = CacheGeometry::of(self);
        cache.check_module(&geometry)?;
        if !cfg.qkv_same_embed_dim() {
            candle::bail!(
                "forward_incremental is self-attention: it needs kdim = vdim = embed_dim = {}, but this module has kdim {} and vdim {}",
                cfg.embed_dim, cfg.kdim(), cfg.vdim()
            )
        }
        let dims = check_query(cfg, &geometry, query, cache.batch_size(), "cache")?;
        let padding = check_new_padding(opts.key_padding_mask.as_ref(), &dims, query)?;
        if dims.n == 0 || dims.t == 0 {
            let s1 = cache.len() + geometry.extra;
            return self.empty_incremental(query, &dims, s1, opts);
        }
        let x = dims.batched3(query)?;
        let (q, k, v) = self
            .in_projection(&x, &x, &x, true, true)?
            .split(cfg.embed_dim)?;
        let (q, k, v) = (
            self.to_heads(&q, &dims)?,
            self.to_heads(&k, &dims)?,
            self.to_heads(&v, &dims)?,
        );
        let extra = self.extra_rows()?;
        let start = cache.len();
        let keys = cache.append(
            &k,
            &v,
            padding.as_ref(),
            extra.as_ref().map(|(k, v)| (k, v)),
        )?;
        self.attend_cached(&q, &keys, Some(start), &dims, opts)
    }

    /// Projects a memory (`key`, `value`, e.g. an encoder's output) once for
    /// [`forward_with_memory`](Self::forward_with_memory), with its key padding.
    ///
    /// PyTorch equivalent: the `k`/`v` input projections of `module(query, key, value)`
    /// (fairseq's `static_kv`), computed once per sequence.
    ///
    /// # Shapes
    /// `key (S, N, kdim)`, `value (S, N, vdim)` (`(N, S, ·)` with `batch_first`; `(S, ·)`
    /// unbatched, a memory of batch 1); `key_padding_mask (N, S)` (`(S)` unbatched), u8
    /// (nonzero = padded) or float additive.
    ///
    /// # Errors
    /// Arguments of the wrong rank, size, dtype or device, with a message naming them.
    pub fn project_memory(
        &self,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
    ) -> Result<MemoryCache> {
        self.check_no_lora("project_memory")?;
        let geometry = CacheGeometry::of(self);
        let dims = check_memory_inputs(&self.config, &geometry, key, value, key_padding_mask)?;
        let kdt = softmax_dtype(geometry.dtype);
        let key_padding = key_padding_mask
            .map(|m| {
                additive_mask(m, kdt)?
                    .reshape((dims.n, dims.t))?
                    .contiguous()
            })
            .transpose()?;
        let (mut keys, mut values) = match dims.n * dims.t {
            0 => {
                let shape = (dims.n, geometry.num_heads, dims.t, geometry.head_dim);
                (
                    Tensor::zeros(shape, geometry.dtype, &geometry.device)?,
                    Tensor::zeros(shape, geometry.dtype, &geometry.device)?,
                )
            }
            _ => (
                self.to_heads(&self.project_part(&dims.batched3(key)?, 1)?, &dims)?,
                self.to_heads(&self.project_part(&dims.batched3(value)?, 2)?, &dims)?,
            ),
        };
        if let Some((ek, ev)) = self.extra_rows()? {
            let shape = (
                dims.n,
                geometry.num_heads,
                geometry.extra,
                geometry.head_dim,
            );
            // cat of a broadcast view may come back strided: the products need rows.
            keys = Tensor::cat(&[&keys, &ek.broadcast_as(shape)?], 2)?.contiguous()?;
            values = Tensor::cat(&[&values, &ev.broadcast_as(shape)?], 2)?.contiguous()?;
        }
        Ok(MemoryCache {
            keys,
            values,
            key_padding,
            batch_size: dims.n,
            len: dims.t,
            geometry,
        })
    }

    /// Cross-attention of `query` over a memory projected by
    /// [`project_memory`](Self::project_memory): equals `forward(query, key, value)` with the
    /// memory's key padding mask (no causal mask), in eval mode.
    ///
    /// PyTorch equivalent: `module.eval(); module(query, key, value,
    /// key_padding_mask=memory_padding)`.
    ///
    /// # Shapes
    /// `query (T, N, E)` / `(N, T, E)` with `batch_first` / `(T, E)` unbatched; output the
    /// same; weights `(N, T, S')` averaged or `(N, H, T, S')`, `S' = S + add_bias_kv +
    /// add_zero_attn`.
    ///
    /// # Errors
    /// A memory of another module or batch size, a query of the wrong rank, size, dtype or
    /// device, or a `key_padding_mask` in `opts` (the memory's padding belongs to
    /// `project_memory`).
    pub fn forward_with_memory(
        &self,
        query: &Tensor,
        memory: &MemoryCache,
        opts: &IncrementalOptions,
    ) -> Result<AttentionOutput> {
        self.check_no_lora("forward_with_memory")?;
        let geometry = CacheGeometry::of(self);
        memory.geometry.check(&geometry, "memory")?;
        if let Some(m) = &opts.key_padding_mask {
            candle::bail!(
                "forward_with_memory: opts.key_padding_mask must be None (got shape {:?}); the memory's padding is given to project_memory",
                m.dims()
            )
        }
        let dims = check_query(&self.config, &geometry, query, memory.batch_size, "memory")?;
        if dims.n == 0 || dims.t == 0 {
            return self.empty_incremental(query, &dims, memory.len + geometry.extra, opts);
        }
        let q = self.project_part(&dims.batched3(query)?, 0)?;
        let q = self.to_heads(&q, &dims)?;
        let keys = CachedKeys {
            k: memory.keys.clone(),
            v: memory.values.clone(),
            key_padding: memory.key_padding.clone(),
            s_masked: memory.len,
        };
        self.attend_cached(&q, &keys, None, &dims, opts)
    }

    /// One of the input projections (0 = q, 1 = k, 2 = v) of a 3-D input.
    fn project_part(&self, x: &Tensor, part: usize) -> Result<Tensor> {
        let e = self.config.embed_dim;
        let w = match &self.in_proj_weight {
            InProjWeight::Packed(w) => w.narrow(0, part * e, e)?,
            InProjWeight::Separate { q, k, v } => [q, k, v][part].clone(),
        };
        let b = self
            .in_proj_bias
            .as_ref()
            .map(|b| b.narrow(0, part * e, e))
            .transpose()?;
        linear(x, &w, b.as_ref())
    }

    /// `(A, B, E)` in the caller's layout → `(N, H, len, hd)`, contiguous.
    fn to_heads(&self, t: &Tensor, dims: &QueryDims) -> Result<Tensor> {
        let (h, hd) = (self.config.num_heads, self.config.head_dim());
        let (a, b, _) = t.dims3()?;
        let t = t.reshape((a, b, h, hd))?;
        match dims.seq_first {
            true => t.permute((1, 2, 0, 3))?,
            false => t.permute((0, 2, 1, 3))?,
        }
        .contiguous()
    }

    /// The `bias_k`/`bias_v` and zero-attention rows in head space, `(1, H, extra, hd)`
    /// each, or `None` when the module has neither.
    fn extra_rows(&self) -> Result<Option<(Tensor, Tensor)>> {
        let cfg = &self.config;
        let (h, hd) = (cfg.num_heads, cfg.head_dim());
        let mut rows: Vec<(Tensor, Tensor)> = Vec::new();
        if let (Some(bk), Some(bv)) = (&self.bias_k, &self.bias_v) {
            rows.push((bk.reshape((1, h, 1, hd))?, bv.reshape((1, h, 1, hd))?));
        }
        if cfg.add_zero_attn {
            let z = Tensor::zeros((1, h, 1, hd), self.dtype(), self.out_proj.weight().device())?;
            rows.push((z.clone(), z));
        }
        match rows.len() {
            0 => Ok(None),
            _ => {
                let (k, v): (Vec<Tensor>, Vec<Tensor>) = rows.into_iter().unzip();
                Ok(Some((Tensor::cat(&k, 2)?, Tensor::cat(&v, 2)?)))
            }
        }
    }

    /// Attention of `q (N, H, T, hd)` (unscaled) over cached keys, then the output projection:
    /// the query `i` may see position `j` when `j ≤ offset + i` (`causal_offset`), all
    /// positions without it; padded positions never; the extra rows always.
    fn attend_cached(
        &self,
        q: &Tensor,
        keys: &CachedKeys,
        causal_offset: Option<usize>,
        dims: &QueryDims,
        opts: &IncrementalOptions,
    ) -> Result<AttentionOutput> {
        let cfg = &self.config;
        let dtype = self.dtype();
        let fused = match opts.kernel {
            AttentionKernel::Auto => {
                (q.device().is_cpu() && matches!(dtype, DType::F32 | DType::F64))
                    || super::cuda_fused(q.device(), dtype, cfg.head_dim(), opts.need_weights)
            }
            AttentionKernel::Fused => true,
            AttentionKernel::Reference => false,
        };
        let (ctx, weights) = match fused {
            true => self.attend_cached_fused(q, keys, causal_offset, opts)?,
            false => self.attend_cached_reference(q, keys, causal_offset, dims, opts)?,
        };
        // Merge heads (feature h*hd + j) back into the caller's layout.
        let ctx = match dims.seq_first {
            true => ctx.permute((2, 0, 1, 3))?,
            false => ctx.permute((0, 2, 1, 3))?,
        };
        let (a, b) = match dims.seq_first {
            true => (dims.t, dims.n),
            false => (dims.n, dims.t),
        };
        let ctx = ctx.reshape((a, b, cfg.embed_dim))?;
        let output = linear(&ctx, self.out_proj.weight(), self.out_proj.bias())?;
        let output = if dims.batched {
            output
        } else {
            output.squeeze(1)?
        };
        let weights = match weights {
            Some(w) if !dims.batched => Some(w.squeeze(0)?),
            w => w,
        };
        Ok(AttentionOutput { output, weights })
    }

    /// The attention step over cached keys by the fused kernels: on the CPU the decoding
    /// kernel (the half types in f32, as `forward`'s fused path), on CUDA the flash forward
    /// kernel (no weights). Context `(N, H, T, hd)` and the weights.
    fn attend_cached_fused(
        &self,
        q: &Tensor,
        keys: &CachedKeys,
        causal_offset: Option<usize>,
        opts: &IncrementalOptions,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let dtype = self.dtype();
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() {
            if opts.need_weights {
                candle::bail!("the fused CUDA kernel returns no attention weights; call with need_weights=false or AttentionKernel::Reference")
            }
            let ctx = crate::attention::fused::cuda::decode_attention_cuda(
                q,
                &keys.k,
                &keys.v,
                keys.key_padding.as_ref(),
                keys.s_masked,
                causal_offset,
            )?;
            return Ok((ctx, None));
        }
        let kdt = softmax_dtype(dtype);
        let (ctx, probs) = decode_attention(
            &q.to_dtype(kdt)?,
            &keys.k.to_dtype(kdt)?,
            &keys.v.to_dtype(kdt)?,
            keys.key_padding.as_ref(),
            keys.s_masked,
            causal_offset,
            opts.need_weights,
        )?;
        let weights = match probs {
            Some(p) if opts.average_attn_weights => Some(p.mean(1)?.to_dtype(dtype)?),
            Some(p) => Some(p.to_dtype(dtype)?),
            None => None,
        };
        Ok((ctx.to_dtype(dtype)?, weights))
    }

    /// The reference attention step over cached keys, op by op as `attend_reference`:
    /// context `(N, H, T, hd)` and the batch-major weights.
    fn attend_cached_reference(
        &self,
        q: &Tensor,
        keys: &CachedKeys,
        causal_offset: Option<usize>,
        dims: &QueryDims,
        opts: &IncrementalOptions,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let dtype = self.dtype();
        let hd = self.config.head_dim();
        let (t, s) = (dims.t, keys.s_masked);
        let s1 = keys.k.dim(2)?;
        // q is scaled before the product, by sqrt(1/hd) rounded to the dtype, as forward does.
        let q = (q * (1.0 / hd as f64).sqrt())?;
        let sm_dtype = softmax_dtype(dtype);
        let scores = q.matmul(&keys.k.t()?)?.to_dtype(sm_dtype)?; // (N, H, T, S')
        let causal = match causal_offset {
            // One new query sees every position: no mask needed.
            Some(off) if t > 1 => {
                let data: Vec<u8> = (0..t)
                    .flat_map(|i| (0..s).map(move |j| u8::from(j > off + i)))
                    .collect();
                let m = Tensor::from_vec(data, (t, s), q.device())?;
                Some(additive_mask(&m, sm_dtype)?.reshape((1, 1, t, s))?)
            }
            _ => None,
        };
        let kpm = match &keys.key_padding {
            Some(m) => Some(m.reshape((dims.n, 1, 1, s))?),
            None => None,
        };
        let mask = match (causal, kpm) {
            (Some(a), Some(k)) => Some(a.broadcast_add(&k)?),
            (a, k) => a.or(k),
        };
        let scores = match mask {
            Some(m) if s1 > s => scores.broadcast_add(&m.pad_with_zeros(3, 0, s1 - s)?)?,
            Some(m) => scores.broadcast_add(&m)?,
            None => scores,
        };
        let probs = safe_softmax_last_dim(&scores)?;
        let ctx = match s1 {
            0 => q.zeros_like()?,
            _ => probs.to_dtype(dtype)?.matmul(&keys.v)?,
        };
        let weights = match opts.need_weights {
            false => None,
            true => Some(
                match opts.average_attn_weights {
                    true => probs.mean(1)?,
                    false => probs,
                }
                .to_dtype(dtype)?,
            ),
        };
        Ok((ctx, weights))
    }

    /// Empty results (an empty batch or no new position), shaped as `forward`'s.
    fn empty_incremental(
        &self,
        query: &Tensor,
        dims: &QueryDims,
        s1: usize,
        opts: &IncrementalOptions,
    ) -> Result<AttentionOutput> {
        let weights = (dims.n, dims.t, s1, dims.batched);
        self.empty_result(query, weights, opts.need_weights, opts.average_attn_weights)
    }
}
