//! The fused kernels as the CPU op of [`scaled_dot_product_attention`]: q, k and v in
//! PyTorch's `(B, H, L, D)` head layout (any row strides, unit last stride), grouped key/value
//! heads read in place (no repeated copy), the mask additive, the output `(B, H, L, D)`.
//!
//! [`scaled_dot_product_attention`]: crate::attention::scaled_dot_product_attention

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Layout, Result, Shape, Tensor};

use super::decode_op::head_map;
use super::kernel::{self, Geom, Masks, RowMap, Rows, RowsMut};
use crate::cpu::{contiguous, slice, unsupported_dtype, with_slice, CpuArg, Elem, Grads, Stash};
use crate::nn::dropout::DropoutMask;

const OP: &str = "fused scaled_dot_product_attention";

/// One fused SDPA call: its sizes (`group` query heads per key/value head), the additive mask
/// (`(L, S)` for every head, or `(B·H, L, S)`; contiguous, the inputs' dtype, CPU), dropout,
/// and the row log-sum-exp the forward pass leaves for the backward.
#[derive(Clone, Debug)]
pub(crate) struct FusedSdpa {
    pub geom: Geom,
    pub mask: Option<Tensor>,
    pub dropout: Option<DropoutMask>,
    pub lse: Stash<Tensor>,
}

/// Row map of a contiguous `(B, heads, len, d)` buffer.
fn contiguous_map(heads: usize, len: usize, d: usize) -> RowMap {
    RowMap {
        off: 0,
        sb: heads * len * d,
        sh: len * d,
        si: d,
    }
}

impl FusedSdpa {
    fn rows<'a, T: Elem>(&self, name: &str, (s, l): CpuArg<'a>) -> Result<Rows<'a, T>> {
        Ok(Rows {
            data: slice(OP, s, l)?,
            map: head_map(name, l)?,
        })
    }

    fn with_masks<T: Elem, R>(&self, f: impl FnOnce(Masks<T>) -> Result<R>) -> Result<R> {
        let guard = self.mask.as_ref().map(|m| m.storage_and_layout());
        let attn = match &guard {
            Some((g, l)) => Some((contiguous::<T, _>(OP, &**g, l)?, l.dims().len() == 3)),
            None => None,
        };
        f(Masks { attn, kpm: None })
    }

    fn fwd_t<T: Elem>(&self, [q, k, v]: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let (q, k, v) = (
            self.rows::<T>("query", q)?,
            self.rows::<T>("key", k)?,
            self.rows::<T>("value", v)?,
        );
        let mut out = vec![T::ZERO; g.n * g.h * g.l * g.d];
        let mut lse = vec![T::ZERO; g.n * g.h * g.l];
        let out_rows = RowsMut::new(&mut out, contiguous_map(g.h, g.l, g.d));
        self.with_masks(|masks| {
            kernel::forward(g, q, k, v, masks, self.dropout.as_ref(), out_rows, &mut lse);
            Ok(())
        })?;
        self.lse
            .put(Tensor::from_vec(lse, (g.n, g.h, g.l), &Device::Cpu)?);
        Ok((T::to_cpu_storage_owned(out), (g.n, g.h, g.l, g.d).into()))
    }

    fn fwd(&self, args: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        match args[0].0 {
            CpuStorage::F32(_) => self.fwd_t::<f32>(args),
            CpuStorage::F64(_) => self.fwd_t::<f64>(args),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    fn bwd_t<T: Elem>(&self, args: [&Tensor; 3], res: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        let g = &self.geom;
        let (hk, d) = (g.kv_heads(), g.d);
        let guards = args.map(|t| t.storage_and_layout());
        let input = |i: usize, name: &str| -> Result<Rows<T>> {
            let (s, l): (&candle::Storage, &Layout) = (&guards[i].0, guards[i].1);
            Ok(Rows {
                data: slice(OP, s, l)?,
                map: head_map(name, l)?,
            })
        };
        let (q, k, v) = (input(0, "query")?, input(1, "key")?, input(2, "value")?);
        let mut dq = vec![T::ZERO; g.n * g.h * g.l * d];
        let mut dk = vec![T::ZERO; g.n * hk * g.s * d];
        let mut dv = vec![T::ZERO; g.n * hk * g.s * d];
        let grads = (
            RowsMut::new(&mut dq, contiguous_map(g.h, g.l, d)),
            RowsMut::new(&mut dk, contiguous_map(hk, g.s, d)),
            RowsMut::new(&mut dv, contiguous_map(hk, g.s, d)),
        );
        let lse_t = self.lse.get(OP)?;
        let lg = lse_t.storage_and_layout();
        let lse = contiguous::<T, _>(OP, &*lg.0, lg.1)?;
        let out_map = contiguous_map(g.h, g.l, d);
        with_slice(OP, res, |o| {
            with_slice(OP, grad, |d_out| {
                let want = g.n * g.h * g.l * d;
                if o.len() != want || d_out.len() != want || lse.len() != g.n * g.h * g.l {
                    candle::bail!("{OP} backward: the output, its gradient or the row log-sum-exp has the wrong size")
                }
                let o = Rows {
                    data: o,
                    map: out_map,
                };
                let d_out = Rows {
                    data: d_out,
                    map: out_map,
                };
                self.with_masks(|masks| {
                    let drop = self.dropout.as_ref();
                    kernel::backward(g, (q, k, v), o, d_out, lse, masks, drop, grads);
                    Ok(())
                })
            })
        })?;
        let dev = &Device::Cpu;
        Ok([
            Some(Tensor::from_vec(dq, (g.n, g.h, g.l, d), dev)?),
            Some(Tensor::from_vec(dk, (g.n, hk, g.s, d), dev)?),
            Some(Tensor::from_vec(dv, (g.n, hk, g.s, d), dev)?),
        ])
    }

    fn bwd(&self, args: [&Tensor; 3], res: &Tensor, grad: &Tensor) -> Result<Grads<3>> {
        match args[0].dtype() {
            DType::F32 => self.bwd_t::<f32>(args, res, grad),
            DType::F64 => self.bwd_t::<f64>(args, res, grad),
            dt => Err(unsupported_dtype(OP, dt)),
        }
    }
}

crate::cpu::custom_op!(CustomOp3 for FusedSdpa, "fused-sdpa", fwd: fwd, bwd: bwd);
