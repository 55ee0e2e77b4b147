//! [`FusedAttention`] on CUDA storage (the ops' `cuda_fwd` and backward passes) and decoding
//! over a key/value cache.

use candle::backend::{BackendDevice, BackendStorage};
use candle::op::BackpropOp;
use candle::{CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

use super::{backward, forward, CudaMasks, Operand, Saved, MAX_HEAD_DIM, OP};
use crate::attention::fused::decode_op::{cache_dims, head_map};
use crate::attention::fused::kernel::{Geom, RowMap};
use crate::attention::fused::op::{FusedAttention, Parts};

fn cuda_of(s: &Storage) -> Result<&CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        other => candle::bail!(
            "{OP}: expected a CUDA tensor, got one on {:?}",
            other.device().location()
        ),
    }
}

/// `m` relative to the storage's element 0 rather than the layout's start.
fn shifted(m: RowMap, l: &Layout) -> RowMap {
    RowMap {
        off: m.off + l.start_offset(),
        ..m
    }
}

/// A tensor over `storage` (contiguous, no autograd history).
fn tensor(storage: CudaStorage, shape: Shape) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// An f32 mask as the kernels read it: contiguous, on CUDA.
fn check_mask(name: &str, m: &Tensor, l: &Layout) -> Result<()> {
    if m.dtype() != DType::F32 || !l.is_contiguous() {
        candle::bail!(
            "{OP}: the {name} mask must be contiguous f32, got {:?} with strides {:?}",
            m.dtype(),
            l.stride()
        )
    }
    Ok(())
}

impl FusedAttention {
    /// The op's masks as the kernels read them, for `f`.
    fn with_cuda_masks<R>(&self, f: impl FnOnce(CudaMasks) -> Result<R>) -> Result<R> {
        let attn = self.attn_mask.as_ref().map(|m| (m, m.storage_and_layout()));
        let kpm = self
            .key_padding_mask
            .as_ref()
            .map(|m| (m, m.storage_and_layout()));
        let mut masks = CudaMasks::default();
        if let Some((m, (s, l))) = &attn {
            check_mask("attention", m, l)?;
            masks.attn = Some((cuda_of(s)?, l.start_offset(), l.dims().len() == 3));
        }
        if let Some((m, (s, l))) = &kpm {
            check_mask("key padding", m, l)?;
            masks.kpm = Some((cuda_of(s)?, l.start_offset()));
        }
        f(masks)
    }

    /// Part `i` (0: q, 1: k, 2: v) of a forward argument.
    fn cuda_operand<'a>(
        &self,
        parts: Parts,
        (s, l): (&'a CudaStorage, &Layout),
        i: usize,
    ) -> Result<Operand<'a>> {
        Ok(Operand {
            storage: s,
            map: shifted(self.map_of(l, parts.col0(i, self.e()))?, l),
        })
    }

    /// The forward pass on CUDA: the context in the op's layout; the row log-sum-exp is kept
    /// for the backward pass.
    pub(in crate::attention::fused) fn cuda_fwd_parts(
        &self,
        parts: Parts,
        args: [(&CudaStorage, &Layout); 3],
    ) -> Result<(CudaStorage, Shape)> {
        if self.with_weights.is_some() {
            candle::bail!(
                "{OP}: the CUDA kernel returns no attention weights; call with need_weights=false or AttentionKernel::Reference"
            )
        }
        let g = &self.geom;
        let e = self.e();
        let qkv = (
            self.cuda_operand(parts, args[0], 0)?,
            self.cuda_operand(parts, args[1], 1)?,
            self.cuda_operand(parts, args[2], 2)?,
        );
        let dev = &args[0].0.device;
        let shape = self.out_shape(g.l, e);
        // SAFETY (both): the forward kernel writes every element of the context and of lse.
        let out = unsafe { dev.alloc_uninit(&shape, args[0].0.dtype())? };
        let lse = unsafe { dev.alloc_uninit(&Shape::from((g.n, g.h, g.l)), DType::F32)? };
        let out_op = Operand {
            storage: &out,
            map: self.contiguous_map(g.l, e, 0),
        };
        self.with_cuda_masks(|masks| {
            forward(g, None, qkv, masks, self.dropout.as_ref(), out_op, &lse)
        })?;
        self.lse.put(tensor(lse, Shape::from((g.n, g.h, g.l))));
        Ok((out, shape))
    }

    /// The gradients of q, k, v on CUDA: one `(·, ·, 3E)` tensor when packed, else three.
    pub(in crate::attention::fused) fn cuda_bwd(
        &self,
        parts: Parts,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<Vec<Tensor>> {
        let g = &self.geom;
        let e = self.e();
        let (res, grad) = (res.contiguous()?, grad.contiguous()?);
        let lse = self.lse.get(OP)?;
        let guards: Vec<_> = args.iter().map(|t| t.storage_and_layout()).collect();
        let (rs, rl) = res.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (ls, ll) = lse.storage_and_layout();
        if lse.dtype() != DType::F32 || ll.start_offset() != 0 || !ll.is_contiguous() {
            candle::bail!("{OP}: the forward pass's row log-sum-exp is not a fresh f32 buffer")
        }
        let input = |i: usize| -> Result<Operand> {
            let (guard, layout) = parts.arg(&guards, i);
            self.cuda_operand(parts, (cuda_of(guard)?, layout), i)
        };
        let qkv = (input(0)?, input(1)?, input(2)?);
        let out_map = self.contiguous_map(g.l, e, 0);
        let saved = Saved {
            o: Operand {
                storage: cuda_of(&rs)?,
                map: shifted(out_map, rl),
            },
            d_out: Operand {
                storage: cuda_of(&gs)?,
                map: shifted(out_map, gl),
            },
            lse: cuda_of(&ls)?,
        };
        let dev = qkv.0.storage.device.clone();
        let dt = qkv.0.storage.dtype();
        let drop = self.dropout.as_ref();
        match parts {
            Parts::Packed => {
                let shape = self.out_shape(g.l, 3 * e);
                // SAFETY: the backward kernels write every element of the three parts.
                let buf = unsafe { dev.alloc_uninit(&shape, dt)? };
                let at = |part: usize| Operand {
                    storage: &buf,
                    map: self.contiguous_map(g.l, 3 * e, part * e),
                };
                let grads = (at(0), at(1), at(2));
                self.with_cuda_masks(|m| backward(g, qkv, saved, m, drop, grads))?;
                Ok(vec![tensor(buf, shape)])
            }
            Parts::Separate => {
                let (q_shape, kv_shape) = (self.out_shape(g.l, e), self.out_shape(g.s, e));
                // SAFETY: the backward kernels write every element of the three gradients.
                let (dq, dk, dv) = unsafe {
                    (
                        dev.alloc_uninit(&q_shape, dt)?,
                        dev.alloc_uninit(&kv_shape, dt)?,
                        dev.alloc_uninit(&kv_shape, dt)?,
                    )
                };
                let (mq, mkv) = (
                    self.contiguous_map(g.l, e, 0),
                    self.contiguous_map(g.s, e, 0),
                );
                let grads = (
                    Operand {
                        storage: &dq,
                        map: mq,
                    },
                    Operand {
                        storage: &dk,
                        map: mkv,
                    },
                    Operand {
                        storage: &dv,
                        map: mkv,
                    },
                );
                self.with_cuda_masks(|m| backward(g, qkv, saved, m, drop, grads))?;
                Ok(vec![
                    tensor(dq, q_shape),
                    tensor(dk, kv_shape.clone()),
                    tensor(dv, kv_shape),
                ])
            }
        }
    }
}

/// A `(N, H, len, d)` operand (a cache's view) as the kernels read it.
fn operand<'a>(s: &'a Storage, l: &Layout, name: &str) -> Result<Operand<'a>> {
    Ok(Operand {
        storage: cuda_of(s)?,
        map: shifted(head_map(name, l)?, l),
    })
}

/// Attention of `q (N, H, T, d)` (unscaled) over a cache's `k`, `v (N, H, S', d)` views on
/// CUDA: the first `s_masked` keys under the additive key padding `kpm (N, s_masked)` and the
/// causal rule of `causal_offset` (query `i` sees position `j ≤ offset + i`), the rest never
/// masked. Returns the context `(N, H, T, d)`, contiguous, in q's dtype (bf16, f16 or f32).
///
/// PyTorch equivalent: `F.scaled_dot_product_attention(q, k, v, attn_mask)` on the cache.
pub(crate) fn decode_attention_cuda(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kpm: Option<&Tensor>,
    s_masked: usize,
    causal_offset: Option<usize>,
) -> Result<Tensor> {
    let (n, h, t, s, d) = cache_dims(OP, q, k, v)?;
    if d > MAX_HEAD_DIM {
        candle::bail!("{OP}: head dim {d} is over the kernels' {MAX_HEAD_DIM}")
    }
    let g = Geom {
        n,
        h,
        l: t,
        s,
        d,
        s_masked,
        causal: false,
        scale: (1.0 / d as f64).sqrt(),
        group: 1,
    };
    let kpm = match kpm {
        Some(m) => {
            let m = m.to_dtype(DType::F32)?.contiguous()?;
            if m.dims() != [n, s_masked] {
                candle::bail!(
                    "{OP}: key padding has dims {:?}, expected {:?}",
                    m.dims(),
                    [n, s_masked]
                )
            }
            Some(m)
        }
        None => None,
    };
    let dev = q.device().as_cuda_device()?.clone();
    let shape = Shape::from((n, h, t, d));
    // SAFETY (both): the forward kernel writes every element of the context and of lse.
    let out = unsafe { dev.alloc_uninit(&shape, q.dtype())? };
    let lse = unsafe { dev.alloc_uninit(&Shape::from((n, h, t)), DType::F32)? };
    {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let kpm_guard = kpm.as_ref().map(|m| m.storage_and_layout());
        let qkv = (
            operand(&qs, ql, "q")?,
            operand(&ks, kl, "k")?,
            operand(&vs, vl, "v")?,
        );
        let masks = CudaMasks {
            attn: None,
            kpm: match &kpm_guard {
                Some((s, l)) => Some((cuda_of(s)?, l.start_offset())),
                None => None,
            },
        };
        let out_op = Operand {
            storage: &out,
            map: RowMap {
                off: 0,
                sb: h * t * d,
                sh: t * d,
                si: d,
            },
        };
        forward(&g, causal_offset, qkv, masks, None, out_op, &lse)?;
    }
    Ok(tensor(out, shape))
}
