//! The large products of [`gemm`](super::gemm) on Intel MKL's `cblas_sgemm`/`cblas_dgemm`
//! (the `mkl` feature; candle-core's `mkl` feature links the library).

use candle::DType;

use super::{Elem, Operand};

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// One row-major `c = beta·c + alpha·op(a)·op(b)`, its matrices untyped and its scalars f64.
struct Call {
    trans: (i32, i32),
    mnk: (i32, i32, i32),
    alpha: f64,
    a: (*const u8, i32),
    b: (*const u8, i32),
    beta: f64,
    c: (*mut u8, i32),
}

/// `cblas_?gemm` of one element type (LP64: `i32` sizes) and its call from a [`Call`].
macro_rules! cblas_gemm {
    ($call:ident, $name:ident, $t:ty) => {
        extern "C" {
            fn $name(
                layout: i32,
                trans_a: i32,
                trans_b: i32,
                m: i32,
                n: i32,
                k: i32,
                alpha: $t,
                a: *const $t,
                lda: i32,
                b: *const $t,
                ldb: i32,
                beta: $t,
                c: *mut $t,
                ldc: i32,
            );
        }

        /// # Safety
        /// The matrices hold this element type and cover what the sizes address.
        unsafe fn $call(g: &Call) {
            let ((ta, tb), (m, n, k)) = (g.trans, g.mnk);
            $name(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                g.alpha as $t,
                g.a.0.cast(),
                g.a.1,
                g.b.0.cast(),
                g.b.1,
                g.beta as $t,
                g.c.0.cast(),
                g.c.1,
            )
        }
    };
}
cblas_gemm!(sgemm, cblas_sgemm, f32);
cblas_gemm!(dgemm, cblas_dgemm, f64);

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
/// column-major and `dst` row-major; `false` (nothing done) when MKL cannot take them.
///
/// # Safety
/// As [`gemm`](super::gemm).
pub(super) unsafe fn gemm<T: Elem>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    [lhs, rhs]: [Operand<T>; 2],
    alpha: T,
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
    match T::DTYPE {
        DType::F32 => sgemm(&call),
        DType::F64 => dgemm(&call),
        _ => return false,
    }
    true
}
