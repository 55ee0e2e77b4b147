//! The large products of [`gemm`](super::gemm) on Intel MKL's `cblas_sgemm`/`cblas_dgemm`
//! (the `mkl` feature; candle-core's `mkl` feature links the library).

use candle::DType;

use super::{Elem, Operand};

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

extern "C" {
    fn cblas_sgemm(
        layout: i32,
        trans_a: i32,
        trans_b: i32,
        m: i32,
        n: i32,
        k: i32,
        alpha: f32,
        a: *const f32,
        lda: i32,
        b: *const f32,
        ldb: i32,
        beta: f32,
        c: *mut f32,
        ldc: i32,
    );
    fn cblas_dgemm(
        layout: i32,
        trans_a: i32,
        trans_b: i32,
        m: i32,
        n: i32,
        k: i32,
        alpha: f64,
        a: *const f64,
        lda: i32,
        b: *const f64,
        ldb: i32,
        beta: f64,
        c: *mut f64,
        ldc: i32,
    );
}

/// How cblas reads a `rows × cols` operand of strides `(rs, cs)`: row-major as it is
/// (`cs = 1`) or transposed (`rs = 1`), with its leading dimension; `None` when neither stride
/// is 1 or the leading dimension is too small for cblas (a broadcast operand).
fn layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(i32, i32)> {
    let ld =
        |stride: usize, min: usize| i32::try_from(stride).ok().filter(|_| stride >= min.max(1));
    match (rs, cs) {
        (_, 1) if rows == 1 || rs >= cols => Some((NO_TRANS, ld(rs.max(cols), cols)?)),
        (1, _) if cols == 1 || cs >= rows => Some((TRANS, ld(cs.max(rows), rows)?)),
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
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
) -> bool {
    let dims = (i32::try_from(m), i32::try_from(n), i32::try_from(k));
    let (Ok(mi), Ok(ni), Ok(ki)) = dims else {
        return false;
    };
    let (Some((ta, lda)), Some((tb, ldb))) =
        (layout(m, k, lhs.1, lhs.2), layout(k, n, rhs.1, rhs.2))
    else {
        return false;
    };
    let Some((NO_TRANS, ldc)) = layout(m, n, dst.1, dst.2) else {
        return false;
    };
    let beta = if accumulate { 1.0 } else { 0.0 };
    match T::DTYPE {
        DType::F32 => cblas_sgemm(
            ROW_MAJOR,
            ta,
            tb,
            mi,
            ni,
            ki,
            alpha.to_f64() as f32,
            lhs.0.cast(),
            lda,
            rhs.0.cast(),
            ldb,
            beta as f32,
            dst.0.cast(),
            ldc,
        ),
        DType::F64 => cblas_dgemm(
            ROW_MAJOR,
            ta,
            tb,
            mi,
            ni,
            ki,
            alpha.to_f64(),
            lhs.0.cast(),
            lda,
            rhs.0.cast(),
            ldb,
            beta,
            dst.0.cast(),
            ldc,
        ),
        _ => return false,
    }
    true
}
