//! The one matrix product of the CPU kernels, over the `gemm` crate (run-time dispatched SIMD
//! micro-kernels), or Intel MKL's with the `mkl` feature.

use super::Elem;

/// What an output element holds before the product is added to it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start<T> {
    /// Nothing: the output is overwritten (its contents may be uninitialised).
    Zero,
    /// Its current value (`c += …`).
    Dst,
    /// Element `j` of a row, the same for every output row (a linear layer's bias: filled
    /// into the output before the `gemm` crate's product, added as the register tiles of the
    /// attention kernel store). The pointer is the row's element for the call's output
    /// column 0.
    Row(*const T),
}

// SAFETY: a `Row` is only ever read (a bias row the caller keeps alive for the product), so
// the threads of one product may share it as they share `&[T]`.
unsafe impl<T: Sync> Send for Start<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Start<T> {}

impl<T> Start<T> {
    /// The same start for the part of the output from column `j` on.
    pub(crate) fn shifted(self, j: usize) -> Self {
        match self {
            // SAFETY (of the pointer arithmetic): the row covers the output's columns.
            Start::Row(r) => Start::Row(r.wrapping_add(j)),
            other => other,
        }
    }
}

impl<T> From<bool> for Start<T> {
    /// `accumulate`: `true` is [`Start::Dst`], `false` [`Start::Zero`].
    fn from(accumulate: bool) -> Self {
        match accumulate {
            true => Start::Dst,
            false => Start::Zero,
        }
    }
}

/// A matrix operand: pointer to its first element, row stride, column stride (in elements).
pub(crate) type Operand<T> = (*const T, usize, usize);

/// How many threads one product may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threads {
    /// The calling thread only: the caller is already one of many rayon tasks (the attention
    /// tiles).
    One,
    /// candle's thread count (one large product: the linear layers).
    All,
}

/// `dst[m×n] = [dst +] alpha · lhs[m×k] · rhs[k×n]`, every matrix given by pointer, row stride
/// and column stride. With `k = 0` the product is zero: `dst` is zeroed unless `accumulate`.
///
/// # Safety
/// Every addressed element must be in bounds; `dst` must not overlap the operands.
#[inline]
pub(crate) unsafe fn gemm<T: Elem>(
    dims: (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
    threads: Threads,
) {
    gemm_from(dims, dst, accumulate.into(), lhs, rhs, alpha, threads)
}

/// [`gemm`] from any [`Start`]: `dst = start + alpha · lhs · rhs`; a [`Start::Row`] (a linear
/// layer's bias, `n` elements) is filled into `dst` first (the `gemm` crate has no row start).
///
/// # Safety
/// As [`gemm`]; a [`Start::Row`] covers `n` elements.
pub(crate) unsafe fn gemm_from<T: Elem>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    start: Start<T>,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
    threads: Threads,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Every row of dst set to element c of `value(c)` (the gemm crate has no row start, and
    // with k = 0 the start is the result).
    let fill = |value: &dyn Fn(usize) -> T| {
        for r in 0..m {
            for c in 0..n {
                *dst.0.add(r * dst.1 + c * dst.2) = value(c);
            }
        }
    };
    if k == 0 {
        match start {
            Start::Zero => fill(&|_| T::ZERO),
            Start::Dst => {}
            Start::Row(row) => fill(&|c| *row.add(c)),
        }
        return;
    }
    // On all threads only where the work is worth a fork-join (`par`).
    let all = threads == Threads::All && super::par::parallel(m * n * k);
    // The `gemm` crate has no row start: the row is filled in first.
    let accumulate = match start {
        Start::Zero => false,
        Start::Dst => true,
        Start::Row(row) => {
            fill(&|c| *row.add(c));
            true
        }
    };
    // The products a caller runs on all threads (the linear layers); the attention kernel's
    // tiles (`Threads::One`) always take the plain product.
    if threads == Threads::All {
        // Under `autocast`: bf16 operands.
        if T::DTYPE == candle::DType::F32
            && super::bf16::precision() == super::bf16::Precision::Bf16
        {
            let f = |(p, rs, cs): Operand<T>| (p.cast::<f32>(), rs, cs);
            let alpha = alpha.to_f64() as f32;
            let dst = (dst.0.cast::<f32>(), dst.1, dst.2);
            super::bf16::gemm((m, n, k), dst, accumulate, f(lhs), f(rhs), alpha, all);
            return;
        }
        // A few rows against a weight read by rows (`x·Wᵀ` while decoding): one dot product
        // per output, each weight row streamed once, the rows split between the threads.
        if m <= DOT_ROWS && lhs.2 == 1 && rhs.1 == 1 && dst.2 == 1 {
            let all = super::par::parallel_pass(n * k);
            dots(
                (m, n, k),
                dst,
                accumulate,
                lhs,
                (rhs.0, rhs.2),
                alpha,
                all,
                T::dot,
            );
            return;
        }
    }
    product((m, n, k), dst, accumulate, lhs, rhs, alpha, threads, all)
}

/// Output rows up to which [`gemm_from`] takes dot products (below a register tile's height,
/// the packing of a blocked product costs more than it saves).
pub(super) const DOT_ROWS: usize = 4;

/// Weight rows per task of [`dots`]: 64 rows of a 768-wide weight are 192 KiB.
const DOT_BLOCK: usize = 64;

/// `dst[i][j] = [dst[i][j] +] alpha · dot(lhs[i], w[j])` for a weight `w (n×k)` of row stride
/// `ld` (the right operand `wᵀ`, its elements `T` or bf16 bits), with `lhs` rows contiguous:
/// one dot product per output, in blocks of [`DOT_BLOCK`] weight rows, on all threads when
/// `all`.
///
/// # Safety
/// As [`gemm`]; `lhs.2 == 1`, `dst.2 == 1`, `w` holds `n` rows of `k` elements `ld` apart.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dots<T: Elem, W>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    lhs: Operand<T>,
    (w, ld): (*const W, usize),
    alpha: T,
    all: bool,
    dot: impl Fn(&[T], &[W]) -> T + Sync,
) {
    struct Ptrs<T, W>(*mut T, *const T, *const W);
    // SAFETY: the operands are only read; each block writes its own columns of dst.
    unsafe impl<T, W> Sync for Ptrs<T, W> {}
    let p = Ptrs(dst.0, lhs.0, w);
    let block = |b: usize| {
        let p = &p;
        for j in b * DOT_BLOCK..((b + 1) * DOT_BLOCK).min(n) {
            // SAFETY: row j of w and every row of lhs hold k elements (the caller).
            let w = unsafe { std::slice::from_raw_parts(p.2.add(j * ld), k) };
            for i in 0..m {
                let x = unsafe { std::slice::from_raw_parts(p.1.add(i * lhs.1), k) };
                let v = alpha * dot(x, w);
                // SAFETY: (i, j) is an output element; no other block writes column j.
                let o = unsafe { &mut *p.0.add(i * dst.1 + j) };
                *o = if accumulate { *o + v } else { v };
            }
        }
    };
    super::par::for_each_init(n.div_ceil(DOT_BLOCK), all, || (), |_, b| block(b));
}

/// `dst = [dst +] alpha·lhs·rhs` on MKL (where linked, for `Threads::All`) or the `gemm`
/// crate, on all threads when `all`.
///
/// # Safety
/// As [`gemm`]; `k > 0`, `m, n > 0`.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(feature = "mkl"), allow(unused_variables))]
pub(super) unsafe fn product<T: Elem>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
    threads: Threads,
    all: bool,
) {
    // MKL's products where it is linked, for the products a caller runs on all threads (the
    // linear layers): split over rayon's threads where the product is worth a fork-join.
    #[cfg(feature = "mkl")]
    if threads == Threads::All {
        let parts = if all { num_threads() } else { 1 };
        if super::mkl::gemm((m, n, k), dst, accumulate, [lhs, rhs], alpha, parts) {
            return;
        }
    }
    let parallelism = match (all, num_threads()) {
        (true, t) if t > 1 => gemm::Parallelism::Rayon(t),
        _ => gemm::Parallelism::None,
    };
    // gemm's arguments: column stride before row stride; `dst = 1·dst + alpha·lhs·rhs`.
    gemm::gemm(
        m,
        n,
        k,
        dst.0,
        dst.2 as isize,
        dst.1 as isize,
        accumulate,
        lhs.0,
        lhs.2 as isize,
        lhs.1 as isize,
        rhs.0,
        rhs.2 as isize,
        rhs.1 as isize,
        T::ONE,
        alpha,
        false,
        false,
        false,
        parallelism,
    )
}

/// candle's thread count, read once: `candle::utils::get_num_threads` parses `/proc/cpuinfo`
/// on every call when `RAYON_NUM_THREADS` is unset, which costs a sizeable share of a
/// one-token decoding step.
pub(super) fn num_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(candle::utils::get_num_threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gemm_from` with a bias row against a plain loop on each of its paths: one thread, all
    /// threads (forced parallel; with MKL, split by output rows and by columns), operands
    /// stored transposed, a right operand with no unit stride, and `k = 0` (the row alone);
    /// f32 and f64. Nothing past column `n` is written.
    #[test]
    fn starts_from_a_row_on_every_path() {
        fn check<T: Elem + Into<f64>>(tol: f64) {
            let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f64 / 251.0 - 2.0;
            // (dims, threads, rhs column stride: 1 or 2 (neither stride unit), lhs and rhs
            // stored transposed)
            let cases = [
                ((9, 21, 13), Threads::One, 1, (false, false)),
                ((70, 37, 300), Threads::All, 1, (false, false)),
                ((70, 37, 300), Threads::All, 2, (false, false)),
                ((70, 37, 300), Threads::All, 1, (true, true)),
                ((20, 90, 50), Threads::All, 1, (false, false)),
                ((20, 90, 50), Threads::All, 1, (true, true)),
                ((5, 7, 0), Threads::All, 1, (false, false)),
                // A few rows against a weight read by rows: the dot products.
                ((1, 700, 300), Threads::All, 1, (false, true)),
                ((4, 130, 70), Threads::All, 1, (false, true)),
            ];
            for ((m, n, k), threads, bcs, (lhs_t, rhs_t)) in cases {
                let a: Vec<T> = (0..m * k).map(|i| T::from_f64(val(i, 1))).collect();
                // a[i][p] at i·ars + p·acs; b[p][j] at p·brs + j·bcs.
                let (ars, acs) = if lhs_t { (1, m) } else { (k, 1) };
                let (brs, bcs) = if rhs_t { (1, k) } else { (bcs * n + 1, bcs) };
                let b: Vec<T> = (0..k.max(1) * (bcs * n + 1).max(brs))
                    .map(|i| T::from_f64(val(i, 2)))
                    .collect();
                let row: Vec<T> = (0..n).map(|j| T::from_f64(val(j, 4))).collect();
                let ld = n + 1;
                let mut c = vec![T::from_f64(f64::NAN); m * ld];
                for i in 0..m {
                    c[i * ld + n] = T::from_f64(7.0);
                }
                crate::cpu::par::force(Some(threads == Threads::All));
                // SAFETY: a holds m·k elements at (ars, acs), b covers k rows of stride brs
                // and n columns of stride bcs, c m rows of stride ld, the row n elements.
                unsafe {
                    gemm_from(
                        (m, n, k),
                        (c.as_mut_ptr(), ld, 1),
                        Start::Row(row.as_ptr()),
                        (a.as_ptr(), ars, acs),
                        (b.as_ptr(), brs, bcs),
                        T::from_f64(0.5),
                        threads,
                    )
                };
                crate::cpu::par::force(None);
                for i in 0..m {
                    assert_eq!(
                        c[i * ld + n].into(),
                        7.0,
                        "({m},{n},{k}) wrote past column {n}"
                    );
                    for j in 0..n {
                        let dot: f64 = (0..k)
                            .map(|p| a[i * ars + p * acs].into() * b[p * brs + j * bcs].into())
                            .sum();
                        let (got, want) = (c[i * ld + j].into(), row[j].into() + 0.5 * dot);
                        assert!(
                            (got - want).abs() <= tol * (1.0 + want.abs()),
                            "({m},{n},{k}) bcs={bcs} transposed {lhs_t}/{rhs_t}: \
                             c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
        check::<f32>(1e-4);
        check::<f64>(1e-12);
    }

    /// The `gemm` crate's sums are the same bits with no threads and with 2–4 (it splits the
    /// output between threads, never the inner dimension), for a weight gradient (left operand
    /// read transposed, deep) and in-place products: `on_all_threads` gives it the backward
    /// products with AVX-512, and training resumes bit-identically on another thread count.
    #[test]
    fn the_crates_sums_do_not_depend_on_its_threads() {
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f32 / 251.0 - 2.0;
        for (m, n, k, lhs_t) in [
            (300, 200, 2100, true),
            (512, 1100, 1300, true),
            (1000, 700, 900, false),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
            let (ars, acs) = if lhs_t { (1, m) } else { (k, 1) };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap();
            let run = |parallelism| {
                let mut c = vec![0f32; m * n];
                // SAFETY: a holds m×k at strides (ars, acs), b k×n by rows, c m×n by rows.
                pool.install(|| unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        acs as isize,
                        ars as isize,
                        b.as_ptr(),
                        1,
                        n as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        parallelism,
                    )
                });
                c
            };
            let one = run(gemm::Parallelism::None);
            for threads in [2, 3, 4] {
                let c = run(gemm::Parallelism::Rayon(threads));
                // Finite values: equal means the same bits (up to the sign of a zero).
                assert_eq!(c, one, "({m},{n},{k}) lhs_t={lhs_t}: {threads} threads");
            }
        }
    }
}
