//! A matrix product for the attention kernels' small tiles in f32 (AVX2 + FMA): no packing.
//!
//! The `gemm` crate packs both operands on every call; for the tiles of the attention kernels
//! (inner dimension the head dim, 32–128, or a tile of 32–256 keys) that packing and the
//! call's set-up cost as much as the product: a (32, 32, 32) product ran at 54 GFLOP/s and a
//! (64, 64, 64) at 100 on one Zen 3 core whose peak is ~125. Here the right-hand operand must
//! have unit column stride (its rows are read as vectors, as they lie: a head's rows of `v`,
//! `q`, `k`, `dO`, or a transposed copy made once per head) and the left-hand one is read one
//! element at a time (broadcast), with any strides: register tiles of up to 6 rows × 16
//! columns, accumulated over the whole inner dimension.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of the register tile.
const MR: usize = 6;

/// `c[m×n] = [c +] alpha · a[m×k] · b[k×n]` in f32: `a(i, p)` at `a + i·ars + p·acs`,
/// `b(p, j)` at `b + p·ldb + j`, `c(i, j)` at `c + i·ldc + j`. Returns `false` (and does
/// nothing) where the CPU lacks AVX2 or FMA.
///
/// # Safety
/// Every addressed element must be in bounds; `c` must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_small(
    (m, n, k): (usize, usize, usize),
    (a, ars, acs): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    alpha: f32,
    accumulate: bool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if !super::simd::avx2() {
            return false;
        }
        avx2::product(
            (m, n, k),
            (a, ars, acs),
            (b, ldb),
            (c, ldc),
            alpha,
            accumulate,
        );
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (
            (m, n, k),
            (a, ars, acs),
            (b, ldb),
            (c, ldc),
            alpha,
            accumulate,
        );
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    /// Lanes `0..count` (at most 8) set.
    #[inline(always)]
    unsafe fn lanes(count: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(count.min(8) as i32), idx)
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn product(
        (m, n, k): (usize, usize, usize),
        (a, ars, acs): (*const f32, usize, usize),
        (b, ldb): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
        alpha: f32,
        accumulate: bool,
    ) {
        let mut j = 0;
        while j < n {
            let cols = (n - j).min(16);
            let (bj, cj) = (b.add(j), c.add(j));
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(MR);
                let ai = a.add(i * ars);
                let ci = cj.add(i * ldc);
                let t = Tile {
                    k,
                    a: ai,
                    ars,
                    acs,
                    b: bj,
                    ldb,
                    c: ci,
                    ldc,
                    alpha,
                    accumulate,
                    cols,
                };
                match (rows, cols == 16) {
                    (6, true) => t.run::<6, false>(),
                    (5, true) => t.run::<5, false>(),
                    (4, true) => t.run::<4, false>(),
                    (3, true) => t.run::<3, false>(),
                    (2, true) => t.run::<2, false>(),
                    (1, true) => t.run::<1, false>(),
                    (6, false) => t.run::<6, true>(),
                    (5, false) => t.run::<5, true>(),
                    (4, false) => t.run::<4, true>(),
                    (3, false) => t.run::<3, true>(),
                    (2, false) => t.run::<2, true>(),
                    _ => t.run::<1, true>(),
                }
                i += rows;
            }
            j += cols;
        }
    }

    /// One register tile: rows `0..R` (R ≤ 6) × `cols` (≤ 16) columns of `c`.
    struct Tile {
        k: usize,
        a: *const f32,
        ars: usize,
        acs: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        accumulate: bool,
        cols: usize,
    }

    impl Tile {
        /// `MASKED`: fewer than 16 columns (loads and stores through lane masks).
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<const R: usize, const MASKED: bool>(&self) {
            let (m0, m1) = (lanes(self.cols), lanes(self.cols.saturating_sub(8)));
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for p in 0..self.k {
                let bp = self.b.add(p * self.ldb);
                let (b0, b1) = if MASKED {
                    (
                        _mm256_maskload_ps(bp, m0),
                        _mm256_maskload_ps(bp.add(8), m1),
                    )
                } else {
                    (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
                };
                let ap = self.a.add(p * self.acs);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*ap.add(r * self.ars));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
            }
            let alpha = _mm256_set1_ps(self.alpha);
            for (r, acc) in acc.iter().enumerate() {
                let cp = self.c.add(r * self.ldc);
                let (mut x0, mut x1) = (_mm256_mul_ps(acc[0], alpha), _mm256_mul_ps(acc[1], alpha));
                if MASKED {
                    if self.accumulate {
                        x0 = _mm256_add_ps(x0, _mm256_maskload_ps(cp, m0));
                        x1 = _mm256_add_ps(x1, _mm256_maskload_ps(cp.add(8), m1));
                    }
                    _mm256_maskstore_ps(cp, m0, x0);
                    _mm256_maskstore_ps(cp.add(8), m1, x1);
                } else {
                    if self.accumulate {
                        x0 = _mm256_add_ps(x0, _mm256_loadu_ps(cp));
                        x1 = _mm256_add_ps(x1, _mm256_loadu_ps(cp.add(8)));
                    }
                    _mm256_storeu_ps(cp, x0);
                    _mm256_storeu_ps(cp.add(8), x1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sgemm_small;

    /// Against an f64 triple loop: every row and column remainder of the register tile, a
    /// transposed and a strided `a`, a `b` and `c` wider than the product, with and without
    /// accumulation and scaling.
    #[test]
    fn matches_a_plain_loop() {
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f32 / 251.0 - 2.0;
        for &(m, n, k) in &[
            (1, 1, 1),
            (6, 16, 7),
            (7, 17, 32),
            (13, 40, 64),
            (32, 32, 32),
            (64, 5, 3),
            (5, 64, 128),
        ] {
            for &(transposed_a, accumulate, alpha) in &[
                (false, false, 1.0f32),
                (true, true, 0.125),
                (false, true, -2.0),
            ] {
                // a stored m×k with row stride k+3, or k×m (read transposed) with row stride m+2.
                let (ars, acs, a_len) = match transposed_a {
                    false => (k + 3, 1, m * (k + 3)),
                    true => (1, m + 2, k * (m + 2)),
                };
                let (ldb, ldc) = (n + 5, n + 1);
                let a: Vec<f32> = (0..a_len).map(|i| val(i, 1)).collect();
                let b: Vec<f32> = (0..k * ldb).map(|i| val(i, 2)).collect();
                let c0: Vec<f32> = (0..m * ldc).map(|i| val(i, 3)).collect();
                let mut c = c0.clone();
                // SAFETY: the strides and lengths above cover every addressed element.
                let ran = unsafe {
                    sgemm_small(
                        (m, n, k),
                        (a.as_ptr(), ars, acs),
                        (b.as_ptr(), ldb),
                        (c.as_mut_ptr(), ldc),
                        alpha,
                        accumulate,
                    )
                };
                if !ran {
                    return; // no AVX2 here: nothing to compare
                }
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= n {
                            assert_eq!(got, c0[i * ldc + j], "({m},{n},{k}) wrote past column {n}");
                            continue;
                        }
                        let dot: f64 = (0..k)
                            .map(|p| a[i * ars + p * acs] as f64 * b[p * ldb + j] as f64)
                            .sum();
                        let want = alpha as f64 * dot
                            + if accumulate {
                                c0[i * ldc + j] as f64
                            } else {
                                0.0
                            };
                        assert!(
                            (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "({m},{n},{k}) t={transposed_a} acc={accumulate}: c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }
}
