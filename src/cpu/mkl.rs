//! The large products of [`gemm`](super::gemm) on Intel MKL's `cblas_sgemm`/`cblas_dgemm`, and
//! under [`autocast`](crate::autocast) its `cblas_gemm_bf16bf16f32` (the `mkl` feature;
//! candle-core's `mkl` feature links the library).
//!
//! Each call runs MKL sequentially (`mkl_set_num_threads_local(1)`, restored after) and a
//! product on all threads is split into one block of output rows or columns per rayon
//! thread: MKL's own OpenMP threads would spin after each product on the cores that rayon's
//! element-wise work and attention tiles need next.

use candle::DType;

use super::{Elem, Operand};

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

extern "C" {
    /// Sets the calling thread's MKL thread count (0: the global setting) and returns the
    /// previous one (`mkl_set_num_threads_local` in C; the lower-case symbol is Fortran's,
    /// which takes a pointer).
    fn MKL_Set_Num_Threads_Local(nt: i32) -> i32;
}

/// One row-major `c = beta·c + alpha·op(a)·op(b)`, its matrices untyped and its scalars f64.
#[derive(Clone, Copy)]
struct Call {
    trans: (i32, i32),
    mnk: (i32, i32, i32),
    alpha: f64,
    a: (*const u8, i32),
    b: (*const u8, i32),
    beta: f64,
    c: (*mut u8, i32),
}

/// A cblas product (LP64: `i32` sizes) of operands `$ab` into `$c` (scalars `$c` too) and its
/// call from a [`Call`].
macro_rules! cblas_gemm {
    ($call:ident, $name:ident, $ab:ty, $c:ty) => {
        extern "C" {
            fn $name(
                layout: i32,
                trans_a: i32,
                trans_b: i32,
                m: i32,
                n: i32,
                k: i32,
                alpha: $c,
                a: *const $ab,
                lda: i32,
                b: *const $ab,
                ldb: i32,
                beta: $c,
                c: *mut $c,
                ldc: i32,
            );
        }

        /// # Safety
        /// The matrices hold these element types and cover what the sizes address.
        unsafe fn $call(g: &Call) {
            let ((ta, tb), (m, n, k)) = (g.trans, g.mnk);
            $name(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                g.alpha as $c,
                g.a.0.cast(),
                g.a.1,
                g.b.0.cast(),
                g.b.1,
                g.beta as $c,
                g.c.0.cast(),
                g.c.1,
            )
        }
    };
}
cblas_gemm!(sgemm, cblas_sgemm, f32, f32);
cblas_gemm!(dgemm, cblas_dgemm, f64, f64);
// bf16 operands (`MKL_BF16`: the upper half of an f32), f32 output and sums.
cblas_gemm!(bf16_gemm, cblas_gemm_bf16bf16f32, u16, f32);

// SAFETY: a `Call`'s pointers are only dereferenced by MKL during `run`; the parts of one
// product that threads run at once read shared operands and write disjoint blocks of `c`.
unsafe impl Send for Call {}
// SAFETY: as above.
unsafe impl Sync for Call {}

impl Call {
    /// The same product restricted to output rows (`rows`) or columns (`!rows`) `range`:
    /// `op(a)`'s rows or `op(b)`'s columns move with them.
    /// `ab` and `c` are the operands' and the output's element sizes in bytes.
    fn part(&self, rows: bool, range: std::ops::Range<usize>, (ab, c): (usize, usize)) -> Self {
        let (m, n, k) = self.mnk;
        let len = (range.end - range.start) as i32;
        let offset = |ld: i32, trans: i32, along_op_rows: bool| -> usize {
            // Element offset of index `range.start` along op(matrix)'s rows or columns, for a
            // row-major matrix of leading dimension `ld` that `trans` reads transposed or not.
            match (trans == NO_TRANS) == along_op_rows {
                true => range.start * ld as usize,
                false => range.start,
            }
        };
        let mut part = *self;
        if rows {
            part.mnk = (len, n, k);
            let a = offset(self.a.1, self.trans.0, true);
            part.a.0 = self.a.0.wrapping_add(a * ab);
            part.c.0 = self.c.0.wrapping_add(range.start * self.c.1 as usize * c);
        } else {
            part.mnk = (m, len, k);
            let b = offset(self.b.1, self.trans.1, false);
            part.b.0 = self.b.0.wrapping_add(b * ab);
            part.c.0 = self.c.0.wrapping_add(range.start * c);
        }
        part
    }

    /// Runs the product with `product` (the call of its element type) on MKL's sequential
    /// path on this thread.
    ///
    /// # Safety
    /// As [`gemm`]; `product` is the call of the matrices' element type.
    unsafe fn run(&self, product: unsafe fn(&Call)) {
        let previous = MKL_Set_Num_Threads_Local(1);
        product(self);
        MKL_Set_Num_Threads_Local(previous);
    }
}

/// How cblas reads a `rows × cols` operand of strides `(rs, cs)`: row-major as it is
/// (`cs = 1`) or transposed (`rs = 1`), with its leading dimension; `None` when neither stride
/// is 1 or the leading dimension is too small for cblas (a broadcast operand).
fn layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(i32, i32)> {
    let ld = |stride: usize| i32::try_from(stride).ok();
    match (rs, cs) {
        (_, 1) if rows == 1 || rs >= cols => Some((NO_TRANS, ld(rs.max(cols).max(1))?)),
        (1, _) if cols == 1 || cs >= rows => Some((TRANS, ld(cs.max(rows).max(1))?)),
        _ => None,
    }
}

/// `dst = beta·dst + alpha·lhs·rhs` (`beta` 0 or 1) on MKL when the operands are row- or
/// column-major and `dst` row-major, in `parts` blocks of output rows or columns on rayon's
/// threads (1: on this thread); `false` (nothing done) when MKL cannot take them.
///
/// # Safety
/// As [`gemm`](super::gemm).
pub(crate) unsafe fn gemm<T: Elem>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    [lhs, rhs]: [Operand<T>; 2],
    alpha: T,
    parts: usize,
) -> bool {
    let (Ok(mi), Ok(ni), Ok(ki)) = (i32::try_from(m), i32::try_from(n), i32::try_from(k)) else {
        return false;
    };
    let (Some((ta, lda)), Some((tb, ldb)), Some((NO_TRANS, ldc))) = (
        layout(m, k, lhs.1, lhs.2),
        layout(k, n, rhs.1, rhs.2),
        layout(m, n, dst.1, dst.2),
    ) else {
        return false;
    };
    let call = Call {
        trans: (ta, tb),
        mnk: (mi, ni, ki),
        alpha: alpha.to_f64(),
        a: (lhs.0.cast(), lda),
        b: (rhs.0.cast(), ldb),
        beta: if accumulate { 1.0 } else { 0.0 },
        c: (dst.0.cast(), ldc),
    };
    let product: unsafe fn(&Call) = match T::DTYPE {
        DType::F32 => sgemm,
        DType::F64 => dgemm,
        _ => return false,
    };
    let size = std::mem::size_of::<T>();
    call.run_parts(product, (size, size), parts);
    true
}

/// `dst = beta·dst + alpha·a·b` (`beta` 0 or 1) of two packed bf16 operands, f32 sums, in
/// `parts` blocks on rayon's threads; `false` (nothing done) when the sizes exceed cblas's
/// or `dst` is not row-major.
///
/// # Safety
/// As [`gemm`](super::gemm); `a` is `m × k`, `b` `k × n`.
pub(crate) unsafe fn gemm_bf16(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, usize, usize),
    accumulate: bool,
    [a, b]: [&super::bf16::Packed<u16>; 2],
    alpha: f32,
    parts: usize,
) -> bool {
    let ld = |p: &super::bf16::Packed<u16>| {
        let trans = if p.transposed { TRANS } else { NO_TRANS };
        Some((trans, i32::try_from(p.ld.max(1)).ok()?))
    };
    let (Ok(mi), Ok(ni), Ok(ki)) = (i32::try_from(m), i32::try_from(n), i32::try_from(k)) else {
        return false;
    };
    let (Some((ta, lda)), Some((tb, ldb)), Some((NO_TRANS, ldc))) =
        (ld(a), ld(b), layout(m, n, dst.1, dst.2))
    else {
        return false;
    };
    let call = Call {
        trans: (ta, tb),
        mnk: (mi, ni, ki),
        alpha: alpha as f64,
        a: (a.data.as_ptr().cast(), lda),
        b: (b.data.as_ptr().cast(), ldb),
        beta: if accumulate { 1.0 } else { 0.0 },
        c: (dst.0.cast(), ldc),
    };
    call.run_parts(bf16_gemm, (2, 4), parts);
    true
}

impl Call {
    /// Runs the product in `parts` blocks of the longer side of the output (`m, n > 0`), in
    /// blocks of whole vectors where it allows, on rayon's threads (1: on this thread).
    /// `sizes`: the operands' and the output's element sizes in bytes.
    ///
    /// # Safety
    /// As [`Call::run`].
    unsafe fn run_parts(&self, product: unsafe fn(&Call), sizes: (usize, usize), parts: usize) {
        let (m, n, _) = self.mnk;
        let (m, n) = (m as usize, n as usize);
        let (rows, len) = if m >= n { (true, m) } else { (false, n) };
        let parts = parts.clamp(1, len.div_ceil(16));
        if parts == 1 {
            self.run(product);
            return;
        }
        let block = len.div_ceil(parts).next_multiple_of(16).min(len);
        use rayon::prelude::*;
        (0..len.div_ceil(block)).into_par_iter().for_each(|i| {
            let range = i * block..((i + 1) * block).min(len);
            // SAFETY: each part writes its own block of dst; the operands are only read.
            unsafe { self.part(rows, range, sizes).run(product) }
        });
    }
}
