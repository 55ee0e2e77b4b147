//! A matrix product for the attention kernels' tiles (AVX2 + FMA, f32 and f64): no packing
//! inside the product.
//!
//! The `gemm` crate packs both operands on every call; for the tiles of the attention kernels
//! (inner dimension the head dim, 32–128, or a tile of 32–256 keys) that packing and the
//! call's set-up cost as much as the product: a (32, 32, 32) product ran at 54 GFLOP/s and a
//! (64, 64, 64) at 100 on one Zen 3 core whose peak is ~125. Here the right-hand operand is read
//! by rows of 16 elements, as it lies (unit column stride) or packed once per head in panels
//! (`super::panels`), and the left-hand one one element at a time (broadcast), with any
//! strides: register tiles of up to 6 rows × two vectors (16 f32 or 8 f64 columns),
//! accumulated over the whole inner dimension.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of the register tile.
const MR: usize = 6;

/// Columns of a panel of a packed right operand (and of an f32 register tile).
pub(crate) const PANEL: usize = 16;

/// `c[m×n] = [c +] alpha · a[m×k] · b[k×n]`: `a(i, p)` at `a + i·ars + p·acs`, `c(i, j)` at
/// `c + i·ldc + j`, and `b` in panels of [`PANEL`] columns: with `J = j0 + j`, `b(p, j)` at
/// `b + (J / 16)·bps + p·ldb + J % 16`. A plain row-major `b` is `bps = 16`, `j0 = 0`; a
/// packed one (see `super::panels`) has `ldb = 16` and a panel stride `bps`, and `j0` says
/// where in it column 0 is. Returns `false` (and does nothing) where the CPU lacks AVX2 or
/// FMA.
///
/// # Safety
/// Every addressed element must be in bounds; `c` must not overlap `a` or `b`.
pub(crate) unsafe fn small_gemm<T: Lanes>(
    dims: (usize, usize, usize),
    a: (*const T, usize, usize),
    b: (*const T, usize, usize, usize),
    c: (*mut T, usize),
    alpha: T,
    accumulate: bool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if !super::simd::avx2() {
            return false;
        }
        avx2::product(dims, a, b, c, alpha, accumulate);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dims, a, b, c, alpha, accumulate);
        false
    }
}

/// The element types with a register-tile product: their AVX2 vector and its operations.
pub(crate) trait Lanes: Copy {
    /// Elements per vector (8 f32, 4 f64); a register tile is two vectors wide.
    const W: usize;
    #[cfg(target_arch = "x86_64")]
    type V: Copy;
    #[cfg(target_arch = "x86_64")]
    unsafe fn zero() -> Self::V;
    #[cfg(target_arch = "x86_64")]
    unsafe fn splat(x: Self) -> Self::V;
    #[cfg(target_arch = "x86_64")]
    unsafe fn broadcast(p: *const Self) -> Self::V;
    /// Loads lanes `0..count` (all when `count ≥ W`), zero elsewhere.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load(p: *const Self, count: usize) -> Self::V;
    /// Stores lanes `0..count`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store(p: *mut Self, v: Self::V, count: usize);
    #[cfg(target_arch = "x86_64")]
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    #[cfg(target_arch = "x86_64")]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    #[cfg(target_arch = "x86_64")]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
}

/// Lanes `0..count` of eight 32-bit lanes set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn mask32(count: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(count.min(8) as i32), idx)
}

/// Lanes `0..count` of four 64-bit lanes set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn mask64(count: usize) -> __m256i {
    let idx = _mm256_setr_epi64x(0, 1, 2, 3);
    _mm256_cmpgt_epi64(_mm256_set1_epi64x(count.min(4) as i64), idx)
}

/// The f32 and f64 impls: the same operations, other intrinsics and lane counts.
macro_rules! lanes {
    ($t:ty, $w:literal, $v:ty, $mask:ident, $zero:ident, $splat:ident, $bcast:ident,
     $load:ident, $mload:ident, $store:ident, $mstore:ident, $fmadd:ident, $mul:ident, $add:ident) => {
        impl Lanes for $t {
            const W: usize = $w;
            #[cfg(target_arch = "x86_64")]
            type V = $v;
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn zero() -> $v {
                $zero()
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn splat(x: $t) -> $v {
                $splat(x)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn broadcast(p: *const $t) -> $v {
                $bcast(&*p)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load(p: *const $t, count: usize) -> $v {
                match count >= $w {
                    true => $load(p),
                    false => $mload(p, $mask(count)),
                }
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn store(p: *mut $t, v: $v, count: usize) {
                match count >= $w {
                    true => $store(p, v),
                    false => $mstore(p, $mask(count), v),
                }
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn fmadd(a: $v, b: $v, c: $v) -> $v {
                $fmadd(a, b, c)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn mul(a: $v, b: $v) -> $v {
                $mul(a, b)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn add(a: $v, b: $v) -> $v {
                $add(a, b)
            }
        }
    };
}

lanes!(
    f32,
    8,
    __m256,
    mask32,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_broadcast_ss,
    _mm256_loadu_ps,
    _mm256_maskload_ps,
    _mm256_storeu_ps,
    _mm256_maskstore_ps,
    _mm256_fmadd_ps,
    _mm256_mul_ps,
    _mm256_add_ps
);
lanes!(
    f64,
    4,
    __m256d,
    mask64,
    _mm256_setzero_pd,
    _mm256_set1_pd,
    _mm256_broadcast_sd,
    _mm256_loadu_pd,
    _mm256_maskload_pd,
    _mm256_storeu_pd,
    _mm256_maskstore_pd,
    _mm256_fmadd_pd,
    _mm256_mul_pd,
    _mm256_add_pd
);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn product<T: Lanes>(
        (m, n, k): (usize, usize, usize),
        (a, ars, acs): (*const T, usize, usize),
        (b, ldb, bps, j0): (*const T, usize, usize, usize),
        (c, ldc): (*mut T, usize),
        alpha: T,
        accumulate: bool,
    ) {
        // Strips of two vectors; they end at panel boundaries (absolute column `j0 + j`; the
        // strip width divides the panel's).
        let strip = 2 * T::W;
        let mut j = 0;
        while j < n {
            let at = j0 + j;
            let cols = (n - j).min(strip - at % strip);
            let (bj, cj) = (b.add(at / PANEL * bps + at % PANEL), c.add(j));
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(MR);
                let t = Tile {
                    k,
                    a: a.add(i * ars),
                    ars,
                    acs,
                    b: bj,
                    ldb,
                    c: cj.add(i * ldc),
                    ldc,
                    alpha,
                    accumulate,
                    cols,
                };
                match (rows, cols == strip) {
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

    /// One register tile: rows `0..R` (R ≤ 6) × `cols` (≤ two vectors) columns of `c`.
    struct Tile<T> {
        k: usize,
        a: *const T,
        ars: usize,
        acs: usize,
        b: *const T,
        ldb: usize,
        c: *mut T,
        ldc: usize,
        alpha: T,
        accumulate: bool,
        cols: usize,
    }

    impl<T: Lanes> Tile<T> {
        /// `MASKED`: fewer columns than two vectors (loads and stores through lane masks).
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<const R: usize, const MASKED: bool>(&self) {
            let w = T::W;
            let (n0, n1) = match MASKED {
                true => (self.cols, self.cols.saturating_sub(w)),
                false => (w, w),
            };
            let mut acc = [[T::zero(); 2]; R];
            for p in 0..self.k {
                let bp = self.b.add(p * self.ldb);
                let (b0, b1) = (T::load(bp, n0), T::load(bp.add(w), n1));
                let ap = self.a.add(p * self.acs);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = T::broadcast(ap.add(r * self.ars));
                    acc[0] = T::fmadd(x, b0, acc[0]);
                    acc[1] = T::fmadd(x, b1, acc[1]);
                }
            }
            let alpha = T::splat(self.alpha);
            for (r, acc) in acc.iter().enumerate() {
                let cp = self.c.add(r * self.ldc);
                let (mut x0, mut x1) = (T::mul(acc[0], alpha), T::mul(acc[1], alpha));
                if self.accumulate {
                    x0 = T::add(x0, T::load(cp, n0));
                    x1 = T::add(x1, T::load(cp.add(w), n1));
                }
                T::store(cp, x0, n0);
                T::store(cp.add(w), x1, n1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::small_gemm;

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
                    small_gemm::<f32>(
                        (m, n, k),
                        (a.as_ptr(), ars, acs),
                        (b.as_ptr(), ldb, 16, 0),
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
