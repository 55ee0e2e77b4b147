//! The fused kernels as candle custom ops, with their backward passes.
//!
//! Inputs are the projections in the caller's 3-D layout (`(L, N, E)` seq-first or
//! `(N, L, E)`), any strides with a unit last stride: the head split is done by the kernels'
//! addressing, so no head transpose is copied. Self-attention passes the packed projection
//! `(·, ·, 3E)` as one argument (its gradient is then one tensor too); otherwise q, k and v
//! are three arguments. The attention context comes back merged, `(·, ·, E)` in the same
//! layout, ready for the output projection.
//!
//! A CUDA kernel slots in behind the same ops by implementing `cuda_fwd` (and the backward
//! and weights passes on CUDA storage); the module only asks for the ops. The weights op is
//! in `weights_op.rs`.

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Layout, Result, Shape, Tensor};

use super::kernel::{self, Geom, Masks, RowMap, Rows, RowsMut};
use crate::cpu::{contiguous, filled_vec, slice, unsupported_dtype, with_slice, Elem, Stash};
use crate::nn::dropout::DropoutMask;

/// The ops' name in errors.
pub(super) const OP: &str = "fused attention";

/// Everything one fused attention call needs besides q, k and v.
#[derive(Clone, Debug)]
pub(crate) struct FusedAttention {
    pub geom: Geom,
    /// Inputs and output are `(L, N, ·)` rather than `(N, L, ·)`.
    pub seq_first: bool,
    /// Additive `(L, s_masked)` or `(N·H, L, s_masked)` mask (contiguous, kernel dtype, CPU).
    pub attn_mask: Option<Tensor>,
    /// Additive `(N, s_masked)` key padding mask (contiguous, kernel dtype, CPU).
    pub key_padding_mask: Option<Tensor>,
    pub dropout: Option<DropoutMask>,
    /// The row log-sum-exp `(N, H, L)` of the forward pass, kept for backward and weights
    /// (shared by the clones of one call: the weights op is one).
    pub lse: Stash<Tensor>,
    /// `Some(average)`: the call returns the weights, so the forward pass computes them too
    /// (one pass, [`kernel::forward_with_weights`]) and leaves them in `weights_slot` for the
    /// [`FusedWeights`] op, which then only hands them over.
    pub with_weights: Option<bool>,
    pub weights_slot: Stash<(CpuStorage, Shape)>,
}

/// Which columns of which argument q, k and v are.
#[derive(Clone, Copy)]
pub(super) enum Parts {
    /// One `(·, ·, 3E)` argument.
    Packed,
    /// Three `(·, ·, E)` arguments.
    Separate,
}

impl Parts {
    /// The argument that holds part `i` (0: q, 1: k, 2: v) among `args` (one when packed).
    pub(super) fn arg<G>(self, args: &[G], i: usize) -> &G {
        match self {
            Parts::Packed => &args[0],
            Parts::Separate => &args[i],
        }
    }

    /// The first column of part `i` (0: q, 1: k, 2: v) in its argument.
    pub(super) fn col0(self, i: usize, e: usize) -> usize {
        match self {
            Parts::Packed => i * e,
            Parts::Separate => 0,
        }
    }
}

impl FusedAttention {
    pub(crate) fn e(&self) -> usize {
        self.geom.h * self.geom.d
    }

    /// Row map of a `(A, B, C)` layout (A, B in the caller's order), the head split of
    /// columns `[col0, col0 + E)`, relative to the layout's [`slice`].
    pub(super) fn map_of(&self, layout: &Layout, col0: usize) -> Result<RowMap> {
        let (dims, st) = (layout.dims(), layout.stride());
        if dims.len() != 3 || st[2] != 1 {
            candle::bail!(
                "fused attention: expected a 3-D projection with unit last stride, got dims {dims:?} strides {st:?}"
            )
        }
        let (sb, si) = if self.seq_first {
            (st[1], st[0])
        } else {
            (st[0], st[1])
        };
        Ok(RowMap {
            off: col0,
            sb,
            sh: self.geom.d,
            si,
        })
    }

    /// Row map of a contiguous `(A, B, width)` buffer at column `col0`.
    pub(super) fn contiguous_map(&self, len: usize, width: usize, col0: usize) -> RowMap {
        let (sb, si) = if self.seq_first {
            (width, self.geom.n * width)
        } else {
            (len * width, width)
        };
        RowMap {
            off: col0,
            sb,
            sh: self.geom.d,
            si,
        }
    }

    pub(super) fn out_shape(&self, len: usize, width: usize) -> Shape {
        let n = self.geom.n;
        if self.seq_first {
            (len, n, width).into()
        } else {
            (n, len, width).into()
        }
    }

    pub(super) fn with_masks<T: Elem, R>(
        &self,
        f: impl FnOnce(Masks<T>) -> Result<R>,
    ) -> Result<R> {
        let attn = self.attn_mask.as_ref().map(|m| m.storage_and_layout());
        let kpm = self
            .key_padding_mask
            .as_ref()
            .map(|m| m.storage_and_layout());
        let attn_slice = match &attn {
            Some((g, l)) => Some((contiguous::<T, _>(OP, &**g, l)?, l.dims().len() == 3)),
            None => None,
        };
        let kpm_slice = match &kpm {
            Some((g, l)) => Some(contiguous::<T, _>(OP, &**g, l)?),
            None => None,
        };
        f(Masks {
            attn: attn_slice,
            kpm: kpm_slice,
        })
    }

    fn store_lse<T: Elem>(&self, lse: Vec<T>) -> Result<()> {
        let g = &self.geom;
        let t = Tensor::from_vec(lse, (g.n, g.h, g.l), &Device::Cpu)?;
        self.lse.put(t);
        Ok(())
    }

    /// Part `i` (0: q, 1: k, 2: v) of a forward argument as rows.
    pub(super) fn arg_rows<'a, T: Elem>(
        &self,
        parts: Parts,
        (s, l): (&'a CpuStorage, &Layout),
        i: usize,
    ) -> Result<Rows<'a, T>> {
        Ok(Rows {
            data: slice(OP, s, l)?,
            map: self.map_of(l, parts.col0(i, self.e()))?,
        })
    }

    fn fwd_t<T: Elem>(&self, parts: Parts, args: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        let rows = |i: usize| self.arg_rows::<T>(parts, args[i], i);
        self.fwd_rows((rows(0)?, rows(1)?, rows(2)?))
    }

    /// The forward pass on a contiguous packed `(·, ·, 3E)` projection in the caller's layout
    /// (the projected self-attention's own buffer).
    pub(super) fn fwd_packed_slice<T: Elem>(&self, qkv: &[T]) -> Result<(CpuStorage, Shape)> {
        let rows = |i: usize| self.packed_rows(qkv, i);
        self.fwd_rows((rows(0)?, rows(1)?, rows(2)?))
    }

    /// [`fwd_packed_slice`](Self::fwd_packed_slice) writing the context into `out` (the
    /// context's size, any contents: every element is written), returning its shape.
    pub(super) fn fwd_packed_into<T: Elem>(&self, qkv: &[T], out: &mut [T]) -> Result<Shape> {
        let rows = |i: usize| self.packed_rows(qkv, i);
        self.fwd_rows_into((rows(0)?, rows(1)?, rows(2)?), out)
    }

    /// Elements of the attention context `(·, ·, E)`.
    pub(super) fn context_len(&self) -> usize {
        self.geom.n * self.geom.l * self.e()
    }

    /// Part `i` (0: q, 1: k, 2: v) of a contiguous packed `(·, ·, 3E)` buffer as rows.
    fn packed_rows<'a, T: Elem>(&self, qkv: &'a [T], i: usize) -> Result<Rows<'a, T>> {
        let (g, e) = (&self.geom, self.e());
        if qkv.len() != g.n * g.l * 3 * e {
            candle::bail!(
                "fused attention: packed projection of {} elements, expected {}x{}x{}",
                qkv.len(),
                g.n,
                g.l,
                3 * e
            )
        }
        Ok(Rows {
            data: qkv,
            map: self.contiguous_map(g.l, 3 * e, i * e),
        })
    }

    fn fwd_rows<T: Elem>(&self, qkv: (Rows<T>, Rows<T>, Rows<T>)) -> Result<(CpuStorage, Shape)> {
        let mut out = vec![T::ZERO; self.context_len()];
        let shape = self.fwd_rows_into(qkv, &mut out)?;
        Ok((T::to_cpu_storage_owned(out), shape))
    }

    /// The forward kernel (with the weights when asked for) writing every element of the
    /// context `out`; returns its shape.
    fn fwd_rows_into<T: Elem>(
        &self,
        (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
        out: &mut [T],
    ) -> Result<Shape> {
        let g = &self.geom;
        let e = self.e();
        if out.len() != self.context_len() {
            candle::bail!(
                "fused attention: context buffer of {} elements, expected {}",
                out.len(),
                self.context_len()
            )
        }
        let mut lse = vec![T::ZERO; g.n * g.h * g.l];
        let out_rows = RowsMut::new(out, self.contiguous_map(g.l, e, 0));
        if let Some(average) = self.with_weights {
            let shape = self.weights_shape(average);
            // SAFETY: forward_with_weights writes every element of the weights.
            let weights = unsafe {
                filled_vec(shape.elem_count(), |weights| {
                    self.with_masks(|masks| {
                        kernel::forward_with_weights(
                            g,
                            (q, k, v),
                            masks,
                            self.dropout.as_ref(),
                            out_rows,
                            &mut lse,
                            weights,
                            average,
                        );
                        Ok(())
                    })
                })?
            };
            self.weights_slot
                .put((T::to_cpu_storage_owned(weights), shape));
        } else {
            self.with_masks(|masks| {
                kernel::forward(g, q, k, v, masks, self.dropout.as_ref(), out_rows, &mut lse);
                Ok(())
            })?;
        }
        self.store_lse(lse)?;
        Ok(self.out_shape(g.l, e))
    }

    fn fwd(&self, parts: Parts, args: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        match args[0].0 {
            CpuStorage::F32(_) => self.fwd_t::<f32>(parts, args),
            CpuStorage::F64(_) => self.fwd_t::<f64>(parts, args),
            other => Err(unsupported_dtype(OP, other.dtype())),
        }
    }

    /// The forward pass on a packed `(·, ·, 3E)` projection.
    fn fwd_packed(&self, [x]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        self.fwd(Parts::Packed, [x, x, x])
    }

    fn fwd_separate(&self, qkv: [CpuArg; 3]) -> Result<(CpuStorage, Shape)> {
        self.fwd(Parts::Separate, qkv)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd_packed(
        &self,
        [x]: [(&candle::CudaStorage, &Layout); 1],
    ) -> Result<(candle::CudaStorage, Shape)> {
        self.cuda_fwd_parts(Parts::Packed, [x, x, x])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd_separate(
        &self,
        qkv: [(&candle::CudaStorage, &Layout); 3],
    ) -> Result<(candle::CudaStorage, Shape)> {
        self.cuda_fwd_parts(Parts::Separate, qkv)
    }

    /// The gradients of the op's `N` arguments (one packed `(·, ·, 3E)` projection, or q, k
    /// and v), on the arguments' device.
    fn grads<const N: usize>(
        &self,
        args: [&Tensor; N],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads<N>> {
        let parts = if N == 1 {
            Parts::Packed
        } else {
            Parts::Separate
        };
        let g = match args[0].dtype() {
            #[cfg(feature = "cuda")]
            _ if args[0].device().is_cuda() => self.cuda_bwd(parts, &args, res, grad)?,
            DType::F32 => self.bwd_t::<f32>(parts, &args, res, grad)?,
            DType::F64 => self.bwd_t::<f64>(parts, &args, res, grad)?,
            dt => return Err(unsupported_dtype(OP, dt)),
        };
        let mut g = g.into_iter();
        Ok(std::array::from_fn(|_| g.next()))
    }

    /// The gradient of a contiguous packed `(·, ·, 3E)` projection (the projected
    /// self-attention's own buffer), written into `dqkv` (same size, any contents).
    pub(super) fn bwd_packed_slice<T: Elem>(
        &self,
        qkv: &[T],
        res: &Tensor,
        grad: &Tensor,
        dqkv: &mut [T],
    ) -> Result<()> {
        on_output(res, grad, |o| self.bwd_packed_slices(qkv, o, dqkv))
    }

    /// The backward kernel of packed self-attention on slices: the projection `qkv`, the
    /// context `o` and its gradient `d_out` (contiguous, the op's layout) into `dqkv`.
    pub(super) fn bwd_packed_slices<T: Elem>(
        &self,
        qkv: &[T],
        (o, d_out): (&[T], &[T]),
        dqkv: &mut [T],
    ) -> Result<()> {
        let rows = |i: usize| self.packed_rows(qkv, i);
        let (q, k, v) = (rows(0)?, rows(1)?, rows(2)?);
        self.packed_rows(dqkv, 0)?;
        let (g, e) = (&self.geom, self.e());
        let at = |part: usize| self.contiguous_map(g.l, 3 * e, part * e);
        let grads = (
            RowsMut::new(dqkv, at(0)),
            RowsMut::new(dqkv, at(1)),
            RowsMut::new(dqkv, at(2)),
        );
        self.bwd_into((q, k, v), (o, d_out), grads)
    }

    /// The backward kernel from q, k, v rows, the output `o` and its gradient `d_out`
    /// (contiguous, the op's layout) into `grads`.
    fn bwd_into<T: Elem>(
        &self,
        (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
        (o, d_out): (&[T], &[T]),
        grads: (RowsMut<T>, RowsMut<T>, RowsMut<T>),
    ) -> Result<()> {
        let g = &self.geom;
        let e = self.e();
        let lse_t = self.lse.get(OP)?;
        let lg = lse_t.storage_and_layout();
        let out_map = self.contiguous_map(g.l, e, 0);
        let o = Rows {
            data: o,
            map: out_map,
        };
        let d_out = Rows {
            data: d_out,
            map: out_map,
        };
        let lse = contiguous(OP, &*lg.0, lg.1)?;
        for (what, len, want) in [
            ("output", o.data.len(), g.n * g.l * e),
            ("output gradient", d_out.data.len(), g.n * g.l * e),
            ("row log-sum-exp", lse.len(), g.n * g.h * g.l),
        ] {
            if len != want {
                candle::bail!("fused attention backward: {what} of {len} elements, expected {want}")
            }
        }
        self.with_masks(|masks| {
            let drop = self.dropout.as_ref();
            kernel::backward(g, (q, k, v), o, d_out, lse, masks, drop, grads);
            Ok(())
        })
    }

    /// Gradients of q, k, v: one `(·, ·, 3E)` tensor when packed, else three.
    fn bwd_t<T: Elem>(
        &self,
        parts: Parts,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<Vec<Tensor>> {
        let g = &self.geom;
        let e = self.e();
        let guards: Vec<_> = args.iter().map(|t| t.storage_and_layout()).collect();
        let input = |i: usize| -> Result<Rows<T>> {
            let (guard, layout) = parts.arg(&guards, i);
            Ok(Rows {
                data: slice(OP, &**guard, layout)?,
                map: self.map_of(layout, parts.col0(i, e))?,
            })
        };
        let (q, k, v) = (input(0)?, input(1)?, input(2)?);
        match parts {
            Parts::Packed => {
                let mut buf = vec![T::ZERO; g.n * g.l * 3 * e];
                let at = |part: usize| self.contiguous_map(g.l, 3 * e, part * e);
                let (mq, mk, mv) = (at(0), at(1), at(2));
                let grads = (
                    RowsMut::new(&mut buf, mq),
                    RowsMut::new(&mut buf, mk),
                    RowsMut::new(&mut buf, mv),
                );
                on_output(res, grad, |o| self.bwd_into((q, k, v), o, grads))?;
                Ok(vec![Tensor::from_vec(
                    buf,
                    self.out_shape(g.l, 3 * e),
                    &Device::Cpu,
                )?])
            }
            Parts::Separate => {
                let mut dq = vec![T::ZERO; g.n * g.l * e];
                let mut dk = vec![T::ZERO; g.n * g.s * e];
                let mut dv = vec![T::ZERO; g.n * g.s * e];
                let (mq, mkv) = (
                    self.contiguous_map(g.l, e, 0),
                    self.contiguous_map(g.s, e, 0),
                );
                let grads = (
                    RowsMut::new(&mut dq, mq),
                    RowsMut::new(&mut dk, mkv),
                    RowsMut::new(&mut dv, mkv),
                );
                on_output(res, grad, |o| self.bwd_into((q, k, v), o, grads))?;
                Ok(vec![
                    Tensor::from_vec(dq, self.out_shape(g.l, e), &Device::Cpu)?,
                    Tensor::from_vec(dk, self.out_shape(g.s, e), &Device::Cpu)?,
                    Tensor::from_vec(dv, self.out_shape(g.s, e), &Device::Cpu)?,
                ])
            }
        }
    }
}

/// The output `res` and its gradient as contiguous slices of `T`, for `f`.
fn on_output<T: Elem, R>(
    res: &Tensor,
    grad: &Tensor,
    f: impl FnOnce((&[T], &[T])) -> Result<R>,
) -> Result<R> {
    with_slice(OP, res, |o| with_slice(OP, grad, |d| f((o, d))))
}

crate::cpu::custom_op!(CustomOp1 for FusedAttention, "fused-attention-packed",
    fwd: fwd_packed, bwd: grads, cuda: cuda_fwd_packed);
crate::cpu::custom_op!(CustomOp3 for FusedAttention, "fused-attention",
    fwd: fwd_separate, bwd: grads, cuda: cuda_fwd_separate);
