//! A model's output layer and its loss as one op: `cross_entropy(x·Wᵀ + b)` from the final
//! hidden states, so that the logits never become a tensor of candle's graph.
//!
//! As two ops the logits `(R, V)` are the head's output tensor, the cross-entropy's backward
//! writes their gradient into a new tensor, and candle's backward pass adds that gradient into
//! a fresh zero tensor before the head's backward reads it: four buffers as large as the
//! logits, allocated every step (faulted in anew under glibc's defaults once they pass its
//! `mmap` threshold: 8 MiB for the `mha train --text` model, hundreds of MiB with a large
//! vocabulary), and two passes over them. Here the forward pass computes the logits, the loss
//! from them, then the logits' gradient over them in place, which the backward pass feeds to
//! the head's two products: one buffer instead of four, and no pass that adds into zeros.
//!
//! The gradient is computed for an upstream gradient of 1 (what `loss.backward()` seeds) and
//! scaled by the actual one in the backward pass; for 1 the results equal the two ops' bit for
//! bit.
//!
//! A frozen head (no gradient for `w` or `b`: LoRA, a tied embedding that is not trained)
//! needs only `dx = d·w` from the logits' gradient, so the forward pass makes it there, a block
//! of rows at a time, and keeps `dx (R, K)` instead of `d (R, V)`: the logits are never whole,
//! and what stays until the backward pass is `V / K` times smaller (65× for GPT-2).

use crate::cpu::CpuArg;
use std::sync::Mutex;

use candle::backend::BackendStorage;
use candle::{CpuStorage, Result, Shape, Tensor};

use super::cross_entropy::{cross_entropy_rows, last_dim, CrossEntropy};
use crate::cpu::workspace;
use crate::cpu::{
    contiguous, filled_vec, fused, input_grad_into, linear, linear_backward_slice, linear_forward,
    linear_forward_into, unsupported_dtype, Elem, Grads3, NeedsGrad, ROWS_PER_TASK as ROWS,
};

const OP: &str = "fused linear cross-entropy";

/// Bytes of logits a frozen head computes at once: large enough that each block's two
/// products stream the weight for many rows, small next to a step's activations.
const BLOCK_BYTES: usize = 32 << 20;

/// The op over `(x, w, b)`: targets and kept rows are data of the op; the logits' gradient
/// (or, for a frozen head, the input's) is kept between the passes.
struct LinearCrossEntropy {
    ce: CrossEntropy,
    /// A plain allocation, not the workspace pool's: a pooled buffer held from the forward pass
    /// to the end of the graph left the pool short of the blocks' scratch buffers, which it then
    /// dropped and made anew every step (more page faults per step in a scratch probe).
    grad: Mutex<Option<CpuStorage>>,
    /// `Some(rows)`: `w` and `b` take no gradient; `grad` holds `dx`, made `rows` rows (a
    /// multiple of `ROWS_PER_TASK`) at a time.
    frozen_block: Option<usize>,
}

impl LinearCrossEntropy {
    fn fwd(&self, x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
        let loss = match x.0 {
            CpuStorage::F32(_) => CpuStorage::F32(vec![self.fwd_as::<f32>(x, w, b)? as f32]),
            CpuStorage::F64(_) => CpuStorage::F64(vec![self.fwd_as::<f64>(x, w, b)?]),
            other => return Err(unsupported_dtype(OP, other.dtype())),
        };
        Ok((loss, Shape::from(())))
    }

    fn fwd_as<T: Elem>(&self, x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<f64> {
        if let Some(rows) = self.frozen_block {
            return self.fwd_frozen::<T>(x, w, b, rows);
        }
        let (mut logits, shape) = linear_forward::<T>(x, w, b)?;
        let v = last_dim(shape.dims())?;
        let loss = self.ce.mean(&logits, v);
        self.ce.grad_in_place(&mut logits, v, 1.0 / self.ce.count());
        *self.grad.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(T::to_cpu_storage_owned(logits));
        Ok(loss)
    }

    /// The loss and `dx` of a frozen head, `rows` rows of logits at a time in one reused
    /// buffer: each block's logits, its loss terms, its gradient in place, then its rows of
    /// `dx = d·w`: the whole product's numbers within rounding (a short block's products may
    /// round otherwise), the loss terms added in the same order.
    fn fwd_frozen<T: Elem>(
        &self,
        (xs, xl): CpuArg,
        w: CpuArg,
        b: Option<CpuArg>,
        rows: usize,
    ) -> Result<f64> {
        let (xd, wd) = (
            contiguous::<T, _>(OP, xs, xl)?,
            contiguous::<T, _>(OP, w.0, w.1)?,
        );
        let (v, k) = w.1.shape().dims2()?;
        let m = xd.len() / k.max(1);
        // Not the workspace pool's: a block this large would stay in it, handed to the
        // blocks' smaller scratch buffers, whose sizes the pool then makes anew.
        let mut logits = vec![T::ZERO; rows.min(m) * v];
        let scale = 1.0 / self.ce.count();
        let mut sum = 0f64;
        // SAFETY: every block writes its `rr·k` elements of dx (the product overwrites).
        let dx = unsafe {
            filled_vec(m * k, |dx| {
                for first in (0..m).step_by(rows) {
                    let rr = rows.min(m - first);
                    let at = xl.start_offset() + first * k;
                    let block = candle::Layout::contiguous_with_offset((rr, k), at);
                    let d = &mut logits[..rr * v];
                    linear_forward_into((xs, &block), w, b, d)?;
                    sum = (self.ce.chunk_sums(d, v, first).into_iter()).fold(sum, |s, c| s + c);
                    self.ce.grad_in_place_from(d, v, scale, first);
                    input_grad_into(d, wd, (rr, k, v), dx[first * k..].as_mut_ptr().cast());
                }
                Ok(())
            })?
        };
        *self.grad.lock().unwrap_or_else(|p| p.into_inner()) = Some(T::to_cpu_storage_owned(dx));
        Ok(sum / self.ce.count())
    }

    fn bwd(&self, [x, w, _, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
        let g = grad.to_dtype(candle::DType::F64)?.to_scalar::<f64>()?;
        let kept = self.grad.lock().unwrap_or_else(|p| p.into_inner());
        if self.frozen_block.is_some() {
            if needs.w || needs.b {
                candle::bail!("{OP}: the head was frozen when the loss was computed")
            }
            let dx = match kept.as_ref() {
                Some(CpuStorage::F32(dx)) => Tensor::from_slice(dx, x.shape(), x.device())?,
                Some(CpuStorage::F64(dx)) => Tensor::from_slice(dx, x.shape(), x.device())?,
                Some(_) => candle::bail!("{OP}: the kept gradient has another dtype"),
                None => candle::bail!("{OP}: backward pass without a forward pass"),
            };
            let dx = match g == 1.0 {
                true => dx,
                false => dx.affine(g, 0.0)?,
            };
            return Ok((needs.x.then_some(dx), None, None));
        }
        match kept.as_ref() {
            Some(CpuStorage::F32(d)) => backward_scaled(x, w, d, g, needs),
            Some(CpuStorage::F64(d)) => backward_scaled(x, w, d, g, needs),
            _ => candle::bail!("{OP}: backward pass without a forward pass"),
        }
    }
}

/// The head's gradients from the logits' gradient `d` (for an upstream 1) times `g`.
fn backward_scaled<T: Elem>(
    x: &Tensor,
    w: &Tensor,
    d: &[T],
    g: f64,
    needs: NeedsGrad,
) -> Result<Grads3> {
    if g == 1.0 {
        return linear_backward_slice(x, w, d, needs);
    }
    // A scaled copy: the kept gradient stays as it is for another backward pass.
    let mut scaled = workspace::take::<T>(d.len());
    let gt = T::from_f64(g);
    scaled.iter_mut().zip(d).for_each(|(s, d)| *s = *d * gt);
    linear_backward_slice(x, w, &scaled, needs)
}

crate::cpu::op_with_optional_bias!(LinearCrossEntropy, "fused-linear-cross-entropy");

/// Mean of `−log softmax(x·wᵀ + b)[r][targets[r]]` over the rows `r` where `mask[r] != 0`:
/// a linear layer then [`cross_entropy_rows`], as one op on the CPU in f32/f64 (the
/// logits `(R, V)` are never a tensor), the two ops elsewhere. Errors as they do.
///
/// PyTorch equivalent: `F.cross_entropy(F.linear(x, w, b)[mask], targets[mask])`.
///
/// # Shapes
/// - `x`: `(…, K)` with `R` rows in all; `w`: `(V, K)`; `b`: `(V)`;
/// - `targets`: `(R)` (u32/i64); `mask`: `(R)` (u8);
/// - result: a scalar.
pub fn linear_cross_entropy(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    targets: &Tensor,
    mask: &Tensor,
) -> Result<Tensor> {
    linear_cross_entropy_blocked(x, w, b, targets, mask, BLOCK_BYTES)
}

/// [`linear_cross_entropy`] with a frozen head's logits made about `block_bytes` at a time.
pub(super) fn linear_cross_entropy_blocked(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    targets: &Tensor,
    mask: &Tensor,
    block_bytes: usize,
) -> Result<Tensor> {
    if !(fused(x) && x.rank() >= 2) {
        return cross_entropy_rows(&linear(x, w, b)?, targets, mask);
    }
    let (v, k) = w.dims2()?;
    if x.dims().last() != Some(&k) {
        candle::bail!(
            "{OP}: x {:?} must end in the weight's K = {k} (weight {:?})",
            x.dims(),
            w.dims()
        )
    }
    let frozen = !w.track_op() && !b.is_some_and(|b| b.track_op()) && w.is_contiguous();
    let row_bytes = v.max(1) * x.dtype().size_in_bytes();
    let op = LinearCrossEntropy {
        ce: CrossEntropy::new(targets, mask, x.elem_count() / k.max(1), v)?,
        grad: Mutex::new(None),
        frozen_block: frozen.then(|| (block_bytes / row_bytes / ROWS).max(1) * ROWS),
    };
    let x = x.contiguous()?;
    crate::cpu::keep_weights(&[w]);
    match b {
        Some(b) => x.apply_op3(w, b, op),
        None => x.apply_op2(w, op),
    }
}

#[cfg(test)]
mod tests {
    use candle::{DType, Device, Result, Tensor, Var};

    use super::{linear_cross_entropy, linear_cross_entropy_blocked};
    use crate::nn::cross_entropy_rows;
    use crate::nn::tests::{check, tol};
    use crate::rng::normal;

    /// The head + loss op against the linear op and the cross-entropy op: the same loss and, for
    /// `loss.backward()`, the same gradients of x, w and b bit for bit (f32, f64; with and
    /// without the bias; rows that do not count, one with a target outside the vocabulary); a
    /// scaled loss within rounding; the graph backpropagated twice; errors that name the problem.
    #[test]
    fn linear_cross_entropy_equals_the_two_ops() -> Result<()> {
        use crate::cpu::linear;
        let dev = Device::Cpu;
        let (r, k, v) = (15, 7, 11);
        let mut targets: Vec<u32> = (0..r as u32).map(|i| (i * 4) % v as u32).collect();
        let keep: Vec<u8> = (0..r).map(|i| u8::from(i % 4 != 2)).collect();
        targets[2] = 99; // not counted: any value
        let t = Tensor::from_vec(targets, r, &dev)?;
        let m = Tensor::from_vec(keep, r, &dev)?;
        let bits =
            |a: &Tensor| -> Result<Vec<f64>> { a.to_dtype(DType::F64)?.flatten_all()?.to_vec1() };
        for (case, dtype) in [DType::F32, DType::F64].into_iter().enumerate() {
            for with_bias in [true, false] {
                let seed = 900 + 10 * case as u64;
                let x = Var::from_tensor(&normal(0.0, 1.0, (3, 5, k), dtype, &dev, seed)?)?;
                let w = Var::from_tensor(&normal(0.0, 0.7, (v, k), dtype, &dev, seed + 1)?)?;
                let b = Var::from_tensor(&normal(0.0, 0.5, v, dtype, &dev, seed + 2)?)?;
                let b = with_bias.then_some(b.as_tensor());
                let fused = linear_cross_entropy(&x, &w, b, &t, &m)?;
                // The graph is the op and its variables: no logits node.
                assert_eq!(fused.sorted_nodes().len(), 3 + usize::from(with_bias));
                let two = cross_entropy_rows(&linear(&x, &w, b)?, &t, &m)?;
                let what = format!("{dtype:?} bias {with_bias}");
                assert_eq!(bits(&fused)?, bits(&two)?, "{what} loss");
                let (gf, gt) = (fused.backward()?, two.backward()?);
                let mut vars = vec![("x", x.as_tensor()), ("w", w.as_tensor())];
                vars.extend(b.map(|b| ("b", b)));
                for (name, var) in &vars {
                    let (a, e) = (gf.get(var).expect("fused"), gt.get(var).expect("two ops"));
                    assert_eq!(bits(a)?, bits(e)?, "{what} d{name}");
                }
                // Again from the same graph: the kept gradient was not used up.
                let again = fused.backward()?;
                assert_eq!(
                    bits(again.get(&x).expect("x"))?,
                    bits(gf.get(&x).expect("x"))?
                );
                // An upstream gradient other than 1 (gradient accumulation's weights).
                let (sf, st) = ((&fused * 2.5)?.backward()?, (&two * 2.5)?.backward()?);
                for (name, var) in &vars {
                    let (a, e) = (sf.get(var).expect("fused"), st.get(var).expect("two ops"));
                    check(&format!("{what} scaled d{name}"), a, e, tol(dtype))?;
                }
            }
        }
        let x = Tensor::zeros((2, 3, 4), DType::F32, &dev)?;
        let w = Tensor::zeros((5, 6), DType::F32, &dev)?;
        let (t6, m6) = (
            Tensor::zeros(6, DType::U32, &dev)?,
            Tensor::ones(6, DType::U8, &dev)?,
        );
        let e = linear_cross_entropy(&x, &w, None, &t6, &m6).unwrap_err();
        assert!(
            e.to_string()
                .contains("x [2, 3, 4] must end in the weight's K = 6"),
            "{e}"
        );
        let w = Tensor::zeros((5, 4), DType::F32, &dev)?;
        let e = linear_cross_entropy(&x, &w, None, &t6, &m6.zeros_like()?).unwrap_err();
        assert!(
            e.to_string().contains("the loss mask selects no position"),
            "{e}"
        );
        let t6 = Tensor::full(5u32, 6, &dev)?;
        let e = linear_cross_entropy(&x, &w, None, &t6, &m6).unwrap_err();
        assert!(e.to_string().contains("targets must be in [0, 5)"), "{e}");
        Ok(())
    }

    /// A frozen head (`w` and `b` plain tensors): the loss and `dx` made a block of rows at a
    /// time in the forward pass equal the two ops' within rounding (a short block's products may
    /// round otherwise), in one block or several (the last one short), for an upstream 1 and
    /// another; `w` and `b` get no gradient.
    #[test]
    fn a_frozen_head_makes_dx_in_blocks_as_the_two_ops() -> Result<()> {
        use crate::cpu::linear;
        let dev = Device::Cpu;
        let (r, k, v) = (75, 6, 13);
        let targets: Vec<u32> = (0..r as u32).map(|i| (i * 5) % v as u32).collect();
        let keep: Vec<u8> = (0..r).map(|i| u8::from(i % 5 != 3)).collect();
        let (t, m) = (
            Tensor::from_vec(targets, r, &dev)?,
            Tensor::from_vec(keep, r, &dev)?,
        );
        for dtype in [DType::F32, DType::F64] {
            let x = Var::from_tensor(&normal(0.0, 1.0, (3, 25, k), dtype, &dev, 31)?)?;
            let w = normal(0.0, 0.7, (v, k), dtype, &dev, 32)?;
            let b = normal(0.0, 0.5, v, dtype, &dev, 33)?;
            let two = cross_entropy_rows(&linear(&x, &w, Some(&b))?, &t, &m)?;
            let g_two = two.backward()?;
            let dx_two = g_two.get(&x).expect("two ops: dx");
            // 1 byte: blocks of 32 rows (32 + 32 + 11); the default: one block.
            for block_bytes in [1, 1 << 20] {
                let what = format!("{dtype:?} blocks of {block_bytes} bytes");
                let fused = linear_cross_entropy_blocked(&x, &w, Some(&b), &t, &m, block_bytes)?;
                check(&format!("{what}: loss"), &fused, &two, tol(dtype))?;
                let g = fused.backward()?;
                assert!(
                    g.get(&w).is_none() && g.get(&b).is_none(),
                    "{what}: head grads"
                );
                check(
                    &format!("{what}: dx"),
                    g.get(&x).expect("dx"),
                    dx_two,
                    tol(dtype),
                )?;
                let scaled = (&fused * 2.5)?.backward()?;
                let expected = (dx_two * 2.5)?;
                check(&what, scaled.get(&x).expect("dx"), &expected, tol(dtype))?;
            }
        }
        Ok(())
    }
}
