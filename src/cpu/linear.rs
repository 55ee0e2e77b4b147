//! `x @ w.T + b` as one CPU op: the bias is the product's starting value, added to each
//! register tile as it is stored (no separate broadcast add, which costs candle as much as
//! half the product, and no fill of the output first), backward included.
//!
//! PyTorch equivalent: `F.linear(x, w, b)` (`addmm`).

use candle::backend::BackendStorage;
use candle::{CpuStorage, DType, Device, Layout, Result, Shape, Storage, Tensor};
use rayon::prelude::*;

use super::workspace::{self, AnyBuf, Buf};
use super::CpuArg;
use super::{
    contiguous, fused, gemm, gemm_from, par, slice, unsupported_dtype, with_slice, written_vec,
    Elem, Grads3, NeedsGrad, Start, Threads,
};

const OP: &str = "fused linear";

/// The fused linear op on `x (…, K)` (2-D with any row stride, or contiguous), `w (Nout, K)`
/// and optional `b (Nout)`, giving `(…, Nout)`: no reshapes around it, so no extra autograd
/// nodes (candle accumulates every node's gradient into a fresh zero tensor).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedLinear;

/// A 2-D operand: data from the layout's offset, row and column strides.
struct Mat<'a, T> {
    data: &'a [T],
    rs: usize,
    cs: usize,
}

fn mat<'a, T: Elem>(s: &'a CpuStorage, l: &Layout) -> Result<Mat<'a, T>> {
    let st = l.stride();
    if st.len() != 2 {
        candle::bail!(
            "fused linear: expected a 2-D operand, got dims {:?}",
            l.dims()
        )
    }
    Ok(Mat {
        data: slice(OP, s, l)?,
        rs: st[0],
        cs: st[1],
    })
}

/// `out (m×n) = x·wᵀ + bias` (each output row starting from `bias`, added as the register
/// tiles are stored: no pass over the output to fill it in first) or `x·wᵀ`; what `out` holds
/// on entry is ignored and every element written.
fn product<T: Elem>(
    x: Mat<T>,
    w: Mat<T>,
    bias: Option<&[T]>,
    (m, k, n): (usize, usize, usize),
    out: &mut [T],
) {
    let out = &mut out[..m * n];
    let start = match bias {
        Some(row) => {
            assert_eq!(row.len(), n, "bias row length");
            Start::Row(row.as_ptr())
        }
        None => Start::Zero,
    };
    // SAFETY: x is m×k, w is n×k (read transposed), out is m×n, the bias row n elements.
    unsafe {
        gemm_from(
            (m, n, k),
            (out.as_mut_ptr(), n, 1),
            start,
            (x.data.as_ptr(), x.rs, x.cs),
            (w.data.as_ptr(), w.cs, w.rs),
            T::ONE,
            Threads::All,
        );
    }
}

/// The bias `(n)` (any stride) as one contiguous row.
fn bias_row<T: Elem>((s, l): CpuArg, n: usize) -> Result<Vec<T>> {
    let b = mat1::<T>(s, l)?;
    Ok((0..n).map(|j| b.data[j * b.cs]).collect())
}

/// `(M, K, Nout)` of `x (…, K)` (M = the product of the leading dims) and `w (Nout, K)`.
fn dims(xd: &[usize], wd: &[usize]) -> Result<(usize, usize, usize)> {
    match (xd.split_last(), wd) {
        (Some((&k, lead)), &[n, wk]) if k == wk && !lead.is_empty() => {
            Ok((lead.iter().product(), k, n))
        }
        _ => candle::bail!("fused linear: x {xd:?} and w {wd:?} do not chain"),
    }
}

/// `x (…, K)` as an `(M, K)` operand: rows must be evenly spaced, which a contiguous `x` is.
fn rows_of<'a, T: Elem>(s: &'a CpuStorage, l: &Layout) -> Result<Mat<'a, T>> {
    if l.dims().len() == 2 {
        return mat(s, l);
    }
    if !l.is_contiguous() {
        candle::bail!(
            "fused linear: x must be contiguous, got strides {:?}",
            l.stride()
        )
    }
    Ok(Mat {
        data: slice(OP, s, l)?,
        rs: *l.dims().last().unwrap_or(&1),
        cs: 1,
    })
}

/// `x (…, K) · w (Nout, K)ᵀ + b` as a `Vec` and its shape `(…, Nout)`.
pub(crate) fn linear_forward<T: Elem>(
    x: CpuArg,
    w: CpuArg,
    b: Option<CpuArg>,
) -> Result<(Vec<T>, Shape)> {
    let mnk = dims(x.1.dims(), w.1.dims())?;
    let out = linear_vec(rows_of(x.0, x.1)?, w, b, mnk)?;
    Ok((out, out_shape(x.1.dims(), mnk.2)))
}

/// [`linear_forward`] on `x` given as a contiguous slice of shape `x_dims (…, K)`.
pub(crate) fn linear_forward_slice<T: Elem>(
    (x, x_dims): (&[T], &[usize]),
    w: CpuArg,
    b: Option<CpuArg>,
) -> Result<(Vec<T>, Shape)> {
    let (m, k, n) = dims(x_dims, w.1.dims())?;
    if x.len() != m * k {
        candle::bail!(
            "fused linear: x of {} elements for dims {x_dims:?}",
            x.len()
        )
    }
    let x = Mat {
        data: x,
        rs: k,
        cs: 1,
    };
    let out = linear_vec(x, w, b, (m, k, n))?;
    Ok((out, out_shape(x_dims, n)))
}

/// `x (m×k) · w (n×k)ᵀ + b` as a fresh `Vec` (every element written by the product).
fn linear_vec<T: Elem>(
    x: Mat<T>,
    w: CpuArg,
    b: Option<CpuArg>,
    (m, k, n): (usize, usize, usize),
) -> Result<Vec<T>> {
    let bias = b.map(|b| bias_row::<T>(b, n)).transpose()?;
    let w = mat(w.0, w.1)?;
    // SAFETY: the product writes every element (no zero fill first).
    Ok(unsafe { written_vec(m * n, |out| product(x, w, bias.as_deref(), (m, k, n), out)) })
}

/// `x (…, K) · w (Nout, K)ᵀ + b` written into `out` (at least `M·Nout` elements, any
/// contents), returning the shape `(…, Nout)`: the kernel, for ops that go on from the
/// product into a buffer of their own (the projected self-attention).
pub(crate) fn linear_forward_into<T: Elem>(
    x: CpuArg,
    w: CpuArg,
    b: Option<CpuArg>,
    out: &mut [T],
) -> Result<Shape> {
    let (m, k, n) = dims(x.1.dims(), w.1.dims())?;
    if out.len() < m * n {
        candle::bail!(
            "fused linear: output buffer of {} elements for a ({m}, {n}) product",
            out.len()
        )
    }
    let bias = b.map(|b| bias_row::<T>(b, n)).transpose()?;
    product(
        rows_of(x.0, x.1)?,
        mat(w.0, w.1)?,
        bias.as_deref(),
        (m, k, n),
        out,
    );
    Ok(out_shape(x.1.dims(), n))
}

/// `(…, Nout)` from `x (…, K)`.
fn out_shape(x: &[usize], n: usize) -> Shape {
    let mut shape = x.to_vec();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    shape.into()
}

/// The output-projection size of [`linear_forward_into`]: `M·Nout`.
pub(crate) fn linear_out_len(x: &Layout, w: &Layout) -> Result<usize> {
    let (m, _, n) = dims(x.dims(), w.dims())?;
    Ok(m * n)
}

fn fwd(x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
    match x.0 {
        CpuStorage::F32(_) => {
            let (v, shape) = linear_forward::<f32>(x, w, b)?;
            Ok((CpuStorage::F32(v), shape))
        }
        CpuStorage::F64(_) => {
            let (v, shape) = linear_forward::<f64>(x, w, b)?;
            Ok((CpuStorage::F64(v), shape))
        }
        other => Err(unsupported_dtype(OP, other.dtype())),
    }
}

/// A 1-D operand as a row.
fn mat1<'a, T: Elem>(s: &'a CpuStorage, l: &Layout) -> Result<Mat<'a, T>> {
    if l.dims().len() != 1 {
        candle::bail!("fused linear: expected a 1-D bias, got dims {:?}", l.dims())
    }
    Ok(Mat {
        data: slice(OP, s, l)?,
        rs: 0,
        cs: l.stride()[0],
    })
}

/// Gradients of `x·wᵀ + b` from the output gradient (a candle tensor):
/// [`linear_backward_slice`] on its data.
fn linear_backward(x: &Tensor, w: &Tensor, grad: &Tensor, needs: NeedsGrad) -> Result<Grads3> {
    let grad = grad.contiguous()?;
    let (gs, gl) = grad.storage_and_layout();
    match &*gs {
        Storage::Cpu(CpuStorage::F32(_)) => {
            linear_backward_slice(x, w, contiguous::<f32, _>(OP, &*gs, gl)?, needs)
        }
        Storage::Cpu(CpuStorage::F64(_)) => {
            linear_backward_slice(x, w, contiguous::<f64, _>(OP, &*gs, gl)?, needs)
        }
        other => Err(unsupported_dtype(OP, other.dtype())),
    }
}

/// Gradients `(dx, dw, db)` of `x·wᵀ + b` from the output gradient as a slice `(M, Nout)` of
/// the kernel's dtype (for the fused ops, a pooled buffer that never becomes a tensor):
/// `dx = g·w` and `dw = gᵀ·x` as one GEMM each on all threads, `db` the column sums; each
/// only where `needs` says so.
pub(crate) fn linear_backward_slice<T: Elem>(
    x: &Tensor,
    w: &Tensor,
    grad: &[T],
    needs: NeedsGrad,
) -> Result<Grads3> {
    let (n, k) = w.dims2()?;
    let m = x.elem_count() / k.max(1);
    if grad.len() != m * n {
        candle::bail!(
            "fused linear: gradient of {} elements for a ({m}, {n}) output",
            grad.len()
        )
    }
    let dx = needs
        .x
        .then(|| {
            with_slice(OP, w, |wd| {
                // SAFETY: dx is m·k elements, every one written by the product (no zero fill
                // first, a memory pass as long as the product's output).
                let dx = unsafe {
                    written_vec(m * k, |dx| {
                        input_grad_into(grad, wd, (m, k, n), dx.as_mut_ptr())
                    })
                };
                Tensor::from_vec(dx, x.shape(), &Device::Cpu)
            })
        })
        .transpose()?;
    let dw = needs
        .w
        .then(|| with_slice(OP, x, |xd| weight_grad(grad, xd, (m, k, n))))
        .transpose()?;
    let db = needs.b.then(|| bias_grad(grad, m, n)).transpose()?;
    Ok((dx, dw, db))
}

/// `dx (m×k) = g (m×n) · w (n×k)`, every element of `dx` written (all threads).
///
/// # Safety
/// `dx` must be valid for writes of `m·k` elements and not overlap `grad` or `w`.
pub(crate) unsafe fn input_grad_into<T: Elem>(
    grad: &[T],
    w: &[T],
    (m, k, n): (usize, usize, usize),
    dx: *mut T,
) {
    assert!(grad.len() >= m * n && w.len() >= n * k);
    // SAFETY: grad is m×n, w n×k (checked above); dx holds m×k elements (the caller's
    // contract).
    unsafe {
        gemm(
            (m, k, n),
            (dx, k, 1),
            false,
            (grad.as_ptr(), n, 1),
            (w.as_ptr(), k, 1),
            T::ONE,
            Threads::All,
        )
    }
}

/// `dw (n×k) = g (m×n)ᵀ · x (m×k)` (all threads).
pub(crate) fn weight_grad<T: Elem>(
    grad: &[T],
    x: &[T],
    (m, k, n): (usize, usize, usize),
) -> Result<Tensor> {
    assert!(grad.len() >= m * n && x.len() >= m * k);
    // SAFETY: grad is m×n (read transposed), x m×k (checked above); dw is n×k, every element
    // written.
    let dw = unsafe {
        written_vec(n * k, |dw| {
            gemm(
                (n, k, m),
                (dw.as_mut_ptr(), k, 1),
                false,
                (grad.as_ptr(), 1, n),
                (x.as_ptr(), k, 1),
                T::ONE,
                Threads::All,
            )
        })
    };
    Tensor::from_vec(dw, (n, k), &Device::Cpu)
}

/// `db (n)`: the column sums of `g (m×n)`.
pub(crate) fn bias_grad<T: Elem>(grad: &[T], m: usize, n: usize) -> Result<Tensor> {
    Tensor::from_vec(column_sums_of(grad, m, n), n, &Device::Cpu)
}

/// Rows per block of [`column_sums_of`]: fixed, so that the sums do not depend on the
/// thread count.
const SUM_ROWS: usize = 256;

/// Rows of a row-major `(rows, cols)` slice added up: blocks of [`SUM_ROWS`] rows in
/// parallel, each added row by row into its own accumulator, then the blocks' sums in block
/// order (the same result on any number of threads, so training resumes bit-identically).
fn column_sums_of<T: Elem>(data: &[T], rows: usize, cols: usize) -> Vec<T> {
    let cols1 = cols.max(1);
    let block_sum = |block: &[T]| {
        let mut acc = vec![T::ZERO; cols];
        for r in block.chunks_exact(cols1) {
            acc.iter_mut().zip(r).for_each(|(a, x)| *a += *x);
        }
        acc
    };
    let (data, chunk) = (&data[..rows * cols], SUM_ROWS * cols1);
    let blocks: Vec<Vec<T>> = match par::parallel_pass(rows * cols) {
        true => data.par_chunks(chunk).map(block_sum).collect(),
        false => data.chunks(chunk).map(block_sum).collect(),
    };
    let mut blocks = blocks.into_iter();
    let mut acc = blocks.next().unwrap_or_else(|| vec![T::ZERO; cols]);
    for b in blocks {
        acc.iter_mut().zip(&b).for_each(|(a, x)| *a += *x);
    }
    acc
}

impl FusedLinear {
    fn fwd(&self, x: CpuArg, w: CpuArg, b: Option<CpuArg>) -> Result<(CpuStorage, Shape)> {
        fwd(x, w, b)
    }

    fn bwd(&self, [x, w, _, grad]: [&Tensor; 4], needs: NeedsGrad) -> Result<Grads3> {
        linear_backward(x, w, grad, needs)
    }
}

super::op_with_optional_bias!(FusedLinear, "fused-linear");

/// `x (…, K) @ w (Nout, K).T + b` → `(…, Nout)`: one op on the CPU in f32/f64, candle's
/// `matmul` + `broadcast_add` elsewhere.
///
/// PyTorch equivalent: `F.linear(x, w, b)`.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    if !(fused(x) && x.rank() >= 2) {
        let (k, n) = (w.dim(1)?, w.dim(0)?);
        let mut shape = x.dims().to_vec();
        let m = x.elem_count() / k.max(1);
        let y = x.reshape((m, k))?.matmul(&w.t()?)?;
        let y = match b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        return y.reshape(shape);
    }
    let x = if x.rank() == 2 {
        x.clone()
    } else {
        x.contiguous()?
    };
    super::keep_weights(&[w]);
    match b {
        Some(b) => x.apply_op3(w, b, FusedLinear),
        None => x.apply_op2(w, FusedLinear),
    }
}

/// The forward pass of a linear layer whose input `(…, K)` is a pooled buffer of either dtype
/// rather than a tensor (the attention context, the MLP's hidden activation: kept out of
/// candle's graph and linked to it by a one-element token).
pub(crate) fn linear_forward_kept(
    (x, shape): (&AnyBuf, &Shape),
    w: CpuArg,
    b: Option<CpuArg>,
) -> Result<(CpuStorage, Shape)> {
    match x {
        AnyBuf::F32(x) => {
            let (v, s) = linear_forward_slice::<f32>((x, shape.dims()), w, b)?;
            Ok((CpuStorage::F32(v), s))
        }
        AnyBuf::F64(x) => {
            let (v, s) = linear_forward_slice::<f64>((x, shape.dims()), w, b)?;
            Ok((CpuStorage::F64(v), s))
        }
    }
}

/// The backward pass of [`linear_forward_kept`]'s layer from its output gradient: `d x = g·w`
/// into a pooled buffer handed to `keep` (for the op that made `x`) when the token needs a
/// gradient, the token then a zero one (what links the two backward passes in candle's
/// graph); `d w = gᵀ·x` and `d b` the column sums of `g`, as `needs` says. `x` is `None` when
/// the forward pass let it go, the weight taking no gradient.
pub(crate) fn linear_backward_kept(
    op: &str,
    x: Option<&AnyBuf>,
    (token, w, grad): (&Tensor, &Tensor, &Tensor),
    needs: NeedsGrad,
    keep: impl FnOnce(AnyBuf) -> Result<()>,
) -> Result<Grads3> {
    let mismatch = || candle::Error::Msg(format!("{op}: the kept input has another dtype"));
    match grad.dtype() {
        DType::F32 => {
            let x = x.map(|x| f32::of_any(x).ok_or_else(mismatch)).transpose()?;
            backward_kept::<f32>(op, x, (token, w, grad), needs, keep)
        }
        DType::F64 => {
            let x = x.map(|x| f64::of_any(x).ok_or_else(mismatch)).transpose()?;
            backward_kept::<f64>(op, x, (token, w, grad), needs, keep)
        }
        dt => Err(unsupported_dtype(op, dt)),
    }
}

fn backward_kept<T: Elem>(
    op: &str,
    x: Option<&[T]>,
    (token, w, grad): (&Tensor, &Tensor, &Tensor),
    needs: NeedsGrad,
    keep: impl FnOnce(AnyBuf) -> Result<()>,
) -> Result<Grads3>
where
    AnyBuf: From<Buf<T>>,
{
    let (n, k) = w.dims2()?;
    with_slice(op, grad, |g: &[T]| {
        let m = g.len() / n.max(1);
        if g.len() != m * n || x.is_some_and(|x| x.len() != m * k) {
            candle::bail!(
                "{op}: output gradient of {} elements for a ({m}, {n}) output of an input of {:?}",
                g.len(),
                x.map(<[T]>::len)
            )
        }
        let x = match (x, needs.w) {
            (Some(x), _) => x,
            (None, false) => &[],
            (None, true) => candle::bail!("{op}: the weight's gradient needs the input it let go"),
        };
        let d_token = needs
            .x
            .then(|| {
                with_slice(op, w, |wd| {
                    let mut dx = workspace::take::<T>(m * k);
                    // SAFETY: dx holds m·k elements and is this call's own buffer.
                    unsafe { input_grad_into(g, wd, (m, k, n), dx.as_mut_ptr()) };
                    keep(dx.into())?;
                    token.zeros_like()
                })
            })
            .transpose()?;
        let dw = needs.w.then(|| weight_grad(g, x, (m, k, n))).transpose()?;
        let db = needs.b.then(|| bias_grad(g, m, n)).transpose()?;
        Ok((d_token, dw, db))
    })
}

#[cfg(test)]
mod tests {
    use super::column_sums_of;

    /// Several blocks (1000 rows): the sums of an f64 loop, and the same bits on one thread
    /// and on four (block order, not thread order).
    #[test]
    fn column_sums_span_blocks_and_do_not_depend_on_threads() {
        let (rows, cols) = (1000, 7);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| column_sums_of(&data, rows, cols))
        };
        let (one, four) = (on(1), on(4));
        assert_eq!(
            one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            four.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        for (c, &got) in one.iter().enumerate() {
            let want: f64 = (0..rows).map(|r| data[r * cols + c] as f64).sum();
            assert!(
                (got as f64 - want).abs() < 1e-3,
                "column {c}: {got} vs {want}"
            );
        }
        assert_eq!(column_sums_of::<f32>(&[], 0, 3), vec![0.0; 3]);
    }
}
