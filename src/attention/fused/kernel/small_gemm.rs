//! A matrix product for the attention kernels' tiles (AVX-512 or AVX2 + FMA, f32 and f64): no
//! packing inside the product.
//!
//! The `gemm` crate packs both operands on every call; for the tiles of the attention kernels
//! (inner dimension the head dim, 32–128, or a tile of 32–256 keys) that packing and the
//! call's set-up cost as much as the product itself, so such tiles run far below the core's
//! peak. Here the right-hand operand is read by rows of vectors, as it lies (unit column
//! stride) or packed once per head in panels (`super::panels`), and the left-hand one one
//! element at a time (broadcast), with any strides: register tiles of up to `MR` rows × two
//! vectors (`crate::cpu::lanes`), accumulated over the whole inner dimension. [`tile_gemm`]
//! takes this product where the tile fits it and the CPU layer's `gemm` (on the calling
//! thread) elsewhere.
//!
//! AVX-512 is chosen at run time where the CPU has it and the `force-avx2` feature is off
//! (twice the lanes and registers, so each register tile does twice the work per instruction;
//! see `docs/benchmarks.md`), else AVX2 + FMA, else the caller's fallback. The `gemm` crate is
//! built with its `x86-v4` feature for the same reason.

use crate::cpu::lanes::Lanes;
#[cfg(target_arch = "x86_64")]
use crate::cpu::lanes::Vector;
use crate::cpu::simd::Isa;
use crate::cpu::{gemm, Elem, Operand, Start, Threads};

/// Columns of a panel of a packed right operand.
pub(crate) const PANEL: usize = 16;

/// The largest dimensions [`tile_gemm`] sends to the unpacked product: with 256-row tiles read
/// by rows (not packed) the `gemm` crate's packed kernel is as fast or faster, with tiles of
/// 32–128 the unpacked one is faster.
const SMALL_GEMM: usize = 128;

/// `dst[m×n] = [dst +] alpha · lhs[m×k] · rhs[k×n]` on the calling thread (the kernels' tasks
/// are already spread over the pool): the unpacked register tiles where the dimensions are at
/// most [`SMALL_GEMM`] and `rhs` and `dst` are read by rows, the CPU layer's `gemm` elsewhere.
///
/// # Safety
/// As `crate::cpu::gemm`.
pub(crate) unsafe fn tile_gemm<T: Elem>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    accumulate: bool,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
) {
    if m > 0
        && n > 0
        && k > 0
        && k <= SMALL_GEMM
        && m <= SMALL_GEMM
        && n <= SMALL_GEMM
        && rhs.2 == 1
        && dst.2 == 1
        && small_gemm::<T>(
            (m, n, k),
            lhs,
            (rhs.0, rhs.1, PANEL, 0),
            (dst.0, dst.1),
            alpha,
            accumulate.into(),
        )
    {
        return;
    }
    gemm((m, n, k), dst, accumulate, lhs, rhs, alpha, Threads::One)
}

/// `c[m×n] = start + alpha · a[m×k] · b[k×n]` (`start`: nothing, `c` itself or a row, see
/// [`Start`]): `a(i, p)` at `a + i·ars + p·acs`, `c(i, j)` at
/// `c + i·ldc + j`, and `b` in panels of [`PANEL`] columns: with `J = j0 + j`, `b(p, j)` at
/// `b + (J / 16)·bps + p·ldb + J % 16`. A plain row-major `b` is `bps = 16`, `j0 = 0`; a
/// packed one (see `super::panels`) has `ldb = 16` and a panel stride `bps`, and `j0` says
/// where in it column 0 is. Uses the best instruction set the CPU has; returns `false` (and
/// does nothing) where it has neither AVX-512 nor AVX2 with FMA.
///
/// # Safety
/// Every addressed element must be in bounds; `c` must not overlap `a` or `b`.
pub(crate) unsafe fn small_gemm<T: Lanes>(
    dims: (usize, usize, usize),
    a: (*const T, usize, usize),
    b: (*const T, usize, usize, usize),
    c: (*mut T, usize),
    alpha: T,
    start: Start<T>,
) -> bool {
    match Isa::detect() {
        Some(isa) => {
            small_gemm_with(isa, dims, a, b, c, alpha, start);
            true
        }
        None => false,
    }
}

/// [`small_gemm`] with a chosen instruction set (the tests run both) and any [`Start`]:
/// `c = start + alpha · a · b`.
///
/// # Safety
/// As [`small_gemm`]; and the CPU has `isa` (see [`Isa::detect`]); a [`Start::Row`] covers
/// `n` elements.
pub(crate) unsafe fn small_gemm_with<T: Lanes>(
    isa: Isa,
    dims: (usize, usize, usize),
    a: (*const T, usize, usize),
    b: (*const T, usize, usize, usize),
    c: (*mut T, usize),
    alpha: T,
    start: Start<T>,
) {
    product_with(isa, dims, a, b, c, alpha, start)
}

/// The dispatch to the instruction set's entry.
unsafe fn product_with<T: Lanes>(
    isa: Isa,
    dims: (usize, usize, usize),
    a: (*const T, usize, usize),
    b: (*const T, usize, usize, usize),
    c: (*mut T, usize),
    alpha: T,
    start: Start<T>,
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 => tiles::product_avx512(dims, a, b, c, alpha, start),
        Isa::Avx2 => tiles::product_avx2(dims, a, b, c, alpha, start),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, dims, a, b, c, alpha, start);
}

#[cfg(target_arch = "x86_64")]
mod tiles {
    use super::*;

    /// An entry point: the generic body compiled with `$features` for the vectors `$isa`.
    macro_rules! entry {
        ($(#[$doc:meta])* $name:ident, $features:literal, $isa:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<T: Lanes>(
                dims: (usize, usize, usize),
                a: (*const T, usize, usize),
                b: (*const T, usize, usize, usize),
                c: (*mut T, usize),
                alpha: T,
                start: Start<T>,
            ) {
                product::<T, T::$isa>(dims, a, b, c, alpha, start)
            }
        };
    }

    entry!(
        /// The AVX2 entry.
        product_avx2,
        "avx2,fma",
        Avx2
    );
    entry!(
        /// The AVX-512 entry.
        product_avx512,
        "avx512f,avx2,fma",
        Avx512
    );

    /// Register tiles of `S::MR` rows × two vectors, every one within a panel of `b`.
    #[inline(always)]
    unsafe fn product<T: Lanes, S: Vector<T>>(
        (m, n, k): (usize, usize, usize),
        (a, ars, acs): (*const T, usize, usize),
        (b, ldb, bps, j0): (*const T, usize, usize, usize),
        (c, ldc): (*mut T, usize),
        alpha: T,
        start: Start<T>,
    ) {
        let w = S::W;
        // From one tile's first row of `a` to the next's.
        let ats = S::MR * ars;
        // `b`'s element of row 0 at absolute column `at`.
        let at_col = |at: usize| b.add(at / PANEL * bps + at % PANEL);
        let mut j = 0;
        while j < n {
            // A strip of up to two vectors, each starting at a multiple of W (W divides the
            // panel width, so a vector never crosses a panel); the first one after an
            // unaligned start is shorter.
            let at = j0 + j;
            let cols = (n - j).min(match at % w {
                0 => 2 * w,
                r => w - r,
            });
            let b0 = at_col(at);
            let b1 = match cols > w {
                true => at_col(at + w),
                false => b0,
            };
            let cj = c.add(j);
            let start = start.shifted(j);
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(S::MR);
                let t = Tile {
                    k,
                    a: a.add(i / S::MR * ats),
                    ars,
                    acs,
                    b: (b0, b1),
                    ldb,
                    c: cj.add(i * ldc),
                    ldc,
                    alpha,
                    start,
                    cols,
                };
                macro_rules! rows {
                    ($($r:literal)*) => {
                        match (rows, cols == 2 * w) {
                            $(($r, true) => t.run::<S, $r, false>(),
                              ($r, false) => t.run::<S, $r, true>(),)*
                            _ => unreachable!("tile rows {rows} > {}", S::MR),
                        }
                    };
                }
                rows!(1 2 3 4 5 6 7 8 9 10 11 12);
                i += rows;
            }
            j += cols;
        }
    }

    /// One register tile: rows `0..R` × `cols` (≤ two vectors) columns of `c`.
    struct Tile<T> {
        k: usize,
        a: *const T,
        ars: usize,
        acs: usize,
        /// Row 0 of the two vectors' columns.
        b: (*const T, *const T),
        ldb: usize,
        c: *mut T,
        ldc: usize,
        alpha: T,
        start: Start<T>,
        cols: usize,
    }

    impl<T: Copy> Tile<T> {
        /// `MASKED`: fewer columns than two vectors (loads and stores through lane masks).
        #[inline(always)]
        unsafe fn run<S: Vector<T>, const R: usize, const MASKED: bool>(&self) {
            let w = S::W;
            let (n0, n1) = match MASKED {
                true => (self.cols, self.cols.saturating_sub(w)),
                false => (w, w),
            };
            let two = n1 > 0;
            let mut acc = [[S::zero(); 2]; R];
            for p in 0..self.k {
                let (b0, b1) = (self.b.0.add(p * self.ldb), self.b.1.add(p * self.ldb));
                let ap = self.a.add(p * self.acs);
                let v0 = S::load(b0, n0);
                match two {
                    true => {
                        let v1 = S::load(b1, n1);
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let x = S::broadcast(ap.add(r * self.ars));
                            acc[0] = S::fmadd(x, v0, acc[0]);
                            acc[1] = S::fmadd(x, v1, acc[1]);
                        }
                    }
                    false => {
                        for (r, acc) in acc.iter_mut().enumerate() {
                            acc[0] = S::fmadd(S::broadcast(ap.add(r * self.ars)), v0, acc[0]);
                        }
                    }
                }
            }
            let alpha = S::splat(self.alpha);
            for (r, acc) in acc.iter().enumerate() {
                let cp = self.c.add(r * self.ldc);
                // What the tile's row starts from: c itself, the bias row or nothing.
                let from = match self.start {
                    Start::Zero => None,
                    Start::Dst => Some(cp.cast_const()),
                    Start::Row(row) => Some(row),
                };
                let mut x0 = S::mul(acc[0], alpha);
                if let Some(from) = from {
                    x0 = S::add(x0, S::load(from, n0));
                }
                S::store(cp, x0, n0);
                if two {
                    let mut x1 = S::mul(acc[1], alpha);
                    if let Some(from) = from {
                        x1 = S::add(x1, S::load(from.add(w), n1));
                    }
                    S::store(cp.add(w), x1, n1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Elem;

    /// Against an f64 triple loop, for every instruction set this CPU has, in f32 and f64:
    /// every row and column remainder of the register tiles, a transposed and a strided `a`, a
    /// plain `b` and `c` wider than the product, a `b` in panels with a gap between them (NaN,
    /// as every element no product may read) and column offsets inside a panel, starting from
    /// nothing, from `c` (accumulating) or from a row (a bias), with and without scaling.
    #[test]
    fn matches_a_plain_loop() {
        let isas = Isa::available();
        for isa in isas {
            check::<f32>(isa, 1e-4);
            check::<f64>(isa, 1e-12);
        }
    }

    fn check<T: Elem + Lanes + Into<f64>>(isa: Isa, tol: f64) {
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f64 / 251.0 - 2.0;
        for &(m, n, k) in &[
            (1, 1, 1),
            (6, 16, 7),
            (7, 17, 32),
            (13, 40, 64),
            (12, 32, 5),
            (25, 33, 9),
            (32, 32, 32),
            (64, 5, 3),
            (5, 64, 128),
        ] {
            // start: 0 overwrite, 1 accumulate, 2 from a row (a bias).
            for &(transposed_a, panels, j0, start, alpha) in &[
                (false, false, 0, 0, 1.0),
                (true, false, 0, 1, 0.125),
                (false, true, 0, 1, -2.0),
                (true, true, 3, 0, 1.0),
                (false, true, 13, 1, 0.5),
                (true, false, 0, 2, 1.0),
                (false, true, 13, 2, -0.5),
            ] {
                // a stored m×k with row stride k+3, or k×m (read transposed) with row stride m+2.
                let (ars, acs, a_len) = match transposed_a {
                    false => (k + 3, 1, m * (k + 3)),
                    true => (1, m + 2, k * (m + 2)),
                };
                // b: row-major with row stride n+5, or panels of 16 columns with 5 elements
                // between them; column j of the product is b's column j0 + j.
                let (ldb, bps) = match panels {
                    false => (n + 5, PANEL),
                    true => (PANEL, k * PANEL + 5),
                };
                let b_at = |p: usize, j: usize| (j0 + j) / PANEL * bps + p * ldb + (j0 + j) % PANEL;
                let b_len = b_at(k - 1, n - 1) + 1;
                let mut b = vec![T::from_f64(f64::NAN); b_len];
                for p in 0..k {
                    for j in 0..n {
                        b[b_at(p, j)] = T::from_f64(val(p * n + j, 2));
                    }
                }
                let ldc = n + 1;
                let a: Vec<T> = (0..a_len).map(|i| T::from_f64(val(i, 1))).collect();
                let c0: Vec<T> = (0..m * ldc).map(|i| T::from_f64(val(i, 3))).collect();
                let mut c = c0.clone();
                let row: Vec<T> = (0..n).map(|j| T::from_f64(val(j, 4))).collect();
                let from = match start {
                    0 => Start::Zero,
                    1 => Start::Dst,
                    _ => Start::Row(row.as_ptr()),
                };
                // SAFETY: the strides and lengths above cover every addressed element; the
                // CPU has `isa`.
                unsafe {
                    small_gemm_with(
                        isa,
                        (m, n, k),
                        (a.as_ptr(), ars, acs),
                        (b.as_ptr(), ldb, bps, j0),
                        (c.as_mut_ptr(), ldc),
                        T::from_f64(alpha),
                        from,
                    )
                };
                for i in 0..m {
                    for j in 0..ldc {
                        let (got, old): (f64, f64) =
                            (c[i * ldc + j].into(), c0[i * ldc + j].into());
                        let case = format!(
                            "{isa:?} ({m},{n},{k}) t={transposed_a} panels={panels} j0={j0}"
                        );
                        if j >= n {
                            assert_eq!(got, old, "{case} wrote past column {n}");
                            continue;
                        }
                        let dot: f64 = (0..k)
                            .map(|p| a[i * ars + p * acs].into() * b[b_at(p, j)].into())
                            .sum();
                        let want = alpha * dot
                            + match start {
                                0 => 0.0,
                                1 => old,
                                _ => row[j].into(),
                            };
                        assert!(
                            (got - want).abs() <= tol * (1.0 + want.abs()),
                            "{case} start={start}: c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }
}
