//! Mean cross-entropy over selected rows of logits as one op with its backward: one pass per
//! row forward (max, log-sum-exp, the target's logit) and one backward (softmax minus the
//! target's one-hot), where candle's `log_softmax` + `gather` + mask take about fifteen passes
//! over the logits and their gradients.

use crate::cpu::CpuArg;
use crate::cpu::Grads;
use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Result, Shape, Tensor};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use crate::cpu::{contiguous, filled_vec, fused, unsupported_dtype, Elem, ROWS_PER_TASK as ROWS};
use crate::numerics::softmax_dtype;

const OP: &str = "fused cross-entropy";

/// The op over `logits (…, V)` (R rows of V in memory order, any leading dims: a reshape to
/// `(R, V)` would be one more autograd node, whose gradient candle adds into a fresh zero
/// tensor as large as the logits): the targets and which rows count are data of the op (they
/// have no gradient).
pub(super) struct CrossEntropy {
    targets: Vec<u32>,
    keep: Vec<bool>,
    count: f64,
}

impl CrossEntropy {
    /// The op for `r` rows of `v` logits: `targets (R)` (u32/i64) and `mask (R)` (u8) read and
    /// checked (some row counts; every counted target in `[0, V)`).
    pub(super) fn new(targets: &Tensor, mask: &Tensor, r: usize, v: usize) -> Result<Self> {
        let keep: Vec<bool> = mask
            .ne(0u8)?
            .to_vec1::<u8>()?
            .into_iter()
            .map(|k| k != 0)
            .collect();
        let count = keep.iter().filter(|k| **k).count();
        if count == 0 {
            candle::bail!("the loss mask selects no position")
        }
        let ids = targets.to_dtype(DType::U32)?.to_vec1::<u32>()?;
        if keep.len() != r || ids.len() != r {
            candle::bail!(
                "cross-entropy: {r} rows of logits, {} targets, {} mask entries",
                ids.len(),
                keep.len()
            )
        }
        if let Some((&t, _)) = ids
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .find(|(t, _)| **t as usize >= v)
        {
            candle::bail!("targets must be in [0, {v}) (the vocabulary), got {t}")
        }
        Ok(Self {
            targets: ids,
            keep,
            count: count as f64,
        })
    }

    /// How many rows count.
    pub(super) fn count(&self) -> f64 {
        self.count
    }

    /// The mean loss over the kept rows of `x` (rows of `v`), in f64.
    pub(super) fn mean<T: Elem>(&self, x: &[T], v: usize) -> f64 {
        self.forward(x, v) / self.count
    }

    /// `Σ (lse(row) − row[target])` over the kept rows, in f64.
    fn forward<T: Elem>(&self, x: &[T], v: usize) -> f64 {
        self.chunk_sums(x, v, 0).into_iter().sum()
    }

    /// The terms of [`Self::forward`] for rows `first..` given as `x` (`first` a multiple of
    /// `ROWS_PER_TASK`), one per chunk of that many rows: adding the chunks of successive
    /// calls in order gives the sum of one call over all the rows, bit for bit.
    pub(super) fn chunk_sums<T: Elem>(&self, x: &[T], v: usize, first: usize) -> Vec<f64> {
        debug_assert_eq!(first % ROWS, 0);
        x.par_chunks(v * ROWS)
            .enumerate()
            .map(|(k, rows)| {
                let mut buf = vec![T::ZERO; v];
                let mut sum = 0f64;
                for (i, row) in rows.chunks_exact(v).enumerate() {
                    let r = first + k * ROWS + i;
                    if !self.keep[r] {
                        continue;
                    }
                    let m = T::row_max(row);
                    buf.copy_from_slice(row);
                    let s = T::exp_shift_sum(&mut buf, m);
                    let lse = m.to_f64() + s.to_f64().ln();
                    sum += lse - row[self.targets[r] as usize].to_f64();
                }
                sum
            })
            // Collected in chunk order and added in that order: the same sum whichever thread
            // ran which chunk (rayon's own `sum` follows its work-stealing splits).
            .collect()
    }

    /// `g/count · (softmax(row) − onehot(target))` on kept rows, zeros elsewhere.
    fn backward<T: Elem>(&self, x: &[T], v: usize, g: f64) -> Result<Vec<T>> {
        let scale = g / self.count;
        // SAFETY: every row is written whole (a copy of the logits row) before it is read as
        // initialised. No zero fill first: a pass over a buffer as large as the logits.
        unsafe {
            filled_vec(x.len(), |dx| {
                dx.par_chunks_mut(v * ROWS)
                    .zip(x.par_chunks(v * ROWS))
                    .enumerate()
                    .for_each(|(k, (dx, rows))| {
                        for (i, (d, row)) in
                            dx.chunks_exact_mut(v).zip(rows.chunks_exact(v)).enumerate()
                        {
                            for (o, x) in d.iter_mut().zip(row) {
                                o.write(*x);
                            }
                            // SAFETY (in the call's unsafe block): all v elements were just
                            // written. Each row is processed while it is in cache.
                            let d = &mut *(d as *mut [MaybeUninit<T>] as *mut [T]);
                            self.grad_row(k * ROWS + i, d, scale);
                        }
                    });
                Ok(())
            })
        }
    }

    /// Rows of logits `d` (rows of `v`) replaced by `scale · (softmax(row) − onehot(target))`
    /// where the row counts, zeros elsewhere: the gradient of `scale·count` times the mean
    /// loss.
    pub(super) fn grad_in_place<T: Elem>(&self, d: &mut [T], v: usize, scale: f64) {
        self.grad_in_place_from(d, v, scale, 0)
    }

    /// [`Self::grad_in_place`] on rows `first..` of the logits, given as `d`.
    pub(super) fn grad_in_place_from<T: Elem>(
        &self,
        d: &mut [T],
        v: usize,
        scale: f64,
        first: usize,
    ) {
        d.par_chunks_mut(v * ROWS)
            .enumerate()
            .for_each(|(k, rows)| {
                for (i, d) in rows.chunks_exact_mut(v).enumerate() {
                    self.grad_row(first + k * ROWS + i, d, scale);
                }
            });
    }

    /// Row `r` of the logits, `d`, replaced by its gradient (see [`Self::grad_in_place`]).
    fn grad_row<T: Elem>(&self, r: usize, d: &mut [T], scale: f64) {
        if !self.keep[r] {
            d.fill(T::ZERO);
            return;
        }
        let m = T::row_max(d);
        let s = T::exp_shift_sum(d, m).to_f64();
        let f = T::from_f64(scale / s);
        d.iter_mut().for_each(|p| *p *= f);
        let t = self.targets[r] as usize;
        d[t] = T::from_f64(d[t].to_f64() - scale);
    }
}

crate::cpu::custom_op!(CustomOp1 for CrossEntropy, "fused-cross-entropy", fwd: fwd, bwd: bwd);

impl CrossEntropy {
    fn fwd(&self, [(s, l)]: [CpuArg; 1]) -> Result<(CpuStorage, Shape)> {
        let v = last_dim(l.dims())?;
        let loss = match s {
            CpuStorage::F32(_) => {
                CpuStorage::F32(vec![self.mean(contiguous::<f32, _>(OP, s, l)?, v) as f32])
            }
            CpuStorage::F64(_) => {
                CpuStorage::F64(vec![self.mean(contiguous::<f64, _>(OP, s, l)?, v)])
            }
            other => return Err(unsupported_dtype(OP, other.dtype())),
        };
        Ok((loss, Shape::from(())))
    }

    fn bwd(&self, [x]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Result<Grads<1>> {
        let g = grad.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let v = last_dim(x.dims())?;
        let (xs, xl) = x.storage_and_layout();
        let dx = match x.dtype() {
            DType::F32 => {
                let dx = self.backward(contiguous::<f32, _>(OP, &*xs, xl)?, v, g)?;
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            DType::F64 => {
                let dx = self.backward(contiguous::<f64, _>(OP, &*xs, xl)?, v, g)?;
                Tensor::from_vec(dx, x.shape(), x.device())?
            }
            dt => return Err(unsupported_dtype(OP, dt)),
        };
        Ok([Some(dx)])
    }
}

/// The row length `V` of `(…, V)`.
pub(super) fn last_dim(dims: &[usize]) -> Result<usize> {
    match dims {
        [_, .., v] => Ok(*v),
        _ => candle::bail!("{OP}: expected logits (…, V) of rank 2 or more, got dims {dims:?}"),
    }
}

/// Mean of `−log softmax(logits[r])[targets[r]]` over the rows `r` where `mask[r] != 0`, for
/// `logits (…, V)` (`R` rows: the product of the leading dims), `targets (R)` (u32/i64),
/// `mask (R)` (u8): one op on the CPU in f32/f64,
/// candle's `log_softmax` + `gather` elsewhere. Errors when no row counts or a counted target is
/// outside `[0, V)`. f16/bf16 logits are normalised and summed in f32 and the result is f32
/// (summed in bf16, thousands of log-probabilities lose most of their value); other dtypes
/// give their own.
///
/// PyTorch equivalent: `F.cross_entropy(logits[mask], targets[mask])` (which also accumulates
/// in f32, but returns the logits' dtype).
pub fn cross_entropy_rows(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let v = last_dim(logits.dims())?;
    let r: usize = logits.dims()[..logits.rank() - 1].iter().product();
    let ce = CrossEntropy::new(targets, mask, r, v)?;
    if !fused(logits) {
        // Rows that do not count may hold any target (padding): gather from column 0 there.
        let ids: Vec<u32> = ce
            .targets
            .iter()
            .zip(&ce.keep)
            .map(|(&t, &k)| if k { t } else { 0 })
            .collect();
        let ids = Tensor::from_vec(ids, (r, 1), logits.device())?;
        let dt = softmax_dtype(logits.dtype());
        let logits = logits.reshape((r, v))?.to_dtype(dt)?;
        let logp = candle_nn::ops::log_softmax(&logits, candle::D::Minus1)?;
        let picked = logp.gather(&ids, 1)?.squeeze(1)?;
        let weights = mask.ne(0u8)?.to_dtype(dt)?;
        return (picked * weights)?.sum_all()? / -ce.count;
    }
    logits.contiguous()?.apply_op1(ce)
}
