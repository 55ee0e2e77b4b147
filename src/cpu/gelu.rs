//! The exact GELU `x·Φ(x)` and its derivative on CPU slices, in parallel.
//!
//! f32 uses PyTorch's own CPU `erf` for floats (Abramowitz–Stegun 7.1.26: `1 − p(t)·e^(−z²)`,
//! `t = 1/(1 + 0.3275911·z)`, absolute error ≤ 1.5e-7), on eight AVX2 lanes where the CPU has
//! them; its `e^(−x²/2)` is also the density the backward pass needs. f64 uses candle's `erf`
//! (the precision path).

use candle::cpu::erf::erf_f64;
use rayon::prelude::*;

use super::simd::exp_f32;
use super::{written_vec, Elem};

/// `1/√(2π)`.
const INV_SQRT_2PI: f64 = 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
/// Abramowitz–Stegun 7.1.26 (as in PyTorch's `Vectorized<float>::erf`).
const AS_P: f32 = 0.327_591_1;
const AS_A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_8,
    -1.453_152,
    1.061_405_4,
];

/// Elements per rayon task.
const CHUNK: usize = 4096;

/// Which GELU: exact, or its tanh approximation.
///
/// PyTorch equivalent: `F.gelu(x, approximate="none" | "tanh")`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// `x·Φ(x)` (`approximate="none"`).
    #[default]
    None,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (`approximate="tanh"`; GPT-2's
    /// `gelu_new`).
    Tanh,
}

/// `y = x·Φ(x)` on an f64 row (candle's `erf`).
pub(super) fn forward_row_f64(x: &[f64], y: &mut [f64]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = 0.5 * x * (1.0 + erf_f64(x * std::f64::consts::FRAC_1_SQRT_2));
    }
}

/// `dx = g·(Φ(x) + x·φ(x))` on an f64 row.
pub(super) fn backward_row_f64(x: &[f64], g: &[f64], dx: &mut [f64]) {
    for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
        let cdf = 0.5 * (1.0 + erf_f64(x * std::f64::consts::FRAC_1_SQRT_2));
        let pdf = (-0.5 * x * x).exp() * INV_SQRT_2PI;
        *dx = g * (cdf + x * pdf);
    }
}

/// `(Φ(x), φ(x))` for f32.
#[inline(always)]
fn cdf_pdf_f32(x: f32) -> (f32, f32) {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + AS_P * z);
    let mut p = AS_A[4];
    for a in AS_A[..4].iter().rev() {
        p = p * t + a;
    }
    let e = exp_f32(-0.5 * x * x);
    let erf = 1.0 - p * t * e;
    let erf = if x < 0.0 { -erf } else { erf };
    (0.5 * (1.0 + erf), e * INV_SQRT_2PI as f32)
}

/// `y = x·Φ(x)` on an f32 row (AVX2 where the CPU has it).
pub(super) fn forward_row_f32(x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { avx2::forward(x, y) };
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x * cdf_pdf_f32(x).0;
    }
}

/// `dx = g·(Φ(x) + x·φ(x))` on an f32 row (AVX2 where the CPU has it).
pub(super) fn backward_row_f32(x: &[f32], g: &[f32], dx: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2() {
        // SAFETY: as above.
        return unsafe { avx2::backward(x, g, dx) };
    }
    for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
        let (cdf, pdf) = cdf_pdf_f32(x);
        *dx = g * (cdf + x * pdf);
    }
}

/// [`cdf_pdf_f32`] on eight lanes; the scalar function does the tails.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{cdf_pdf_f32, AS_A, AS_P, INV_SQRT_2PI};
    use crate::cpu::simd::exp256;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn cdf_pdf(x: __m256) -> (__m256, __m256) {
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0));
        let ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let z = _mm256_mul_ps(ax, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(AS_P), z, one));
        let mut p = _mm256_set1_ps(AS_A[4]);
        for a in AS_A[..4].iter().rev() {
            p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(*a));
        }
        let e = exp256(_mm256_mul_ps(_mm256_set1_ps(-0.5), _mm256_mul_ps(x, x)));
        // 1 − p·t·e ≥ 0, so setting the sign bit is copysign.
        let erf = _mm256_or_ps(_mm256_fnmadd_ps(_mm256_mul_ps(p, t), e, one), sign);
        let cdf = _mm256_mul_ps(_mm256_set1_ps(0.5), _mm256_add_ps(one, erf));
        (cdf, _mm256_mul_ps(e, _mm256_set1_ps(INV_SQRT_2PI as f32)))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward(x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let (cdf, _) = cdf_pdf(v);
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(v, cdf));
            i += 8;
        }
        for j in i..n {
            y[j] = x[j] * cdf_pdf_f32(x[j]).0;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward(x: &[f32], g: &[f32], dx: &mut [f32]) {
        let n = x.len().min(g.len()).min(dx.len());
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let (cdf, pdf) = cdf_pdf(v);
            let d = _mm256_fmadd_ps(v, pdf, cdf);
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            _mm256_storeu_ps(dx.as_mut_ptr().add(i), _mm256_mul_ps(gv, d));
            i += 8;
        }
        for j in i..n {
            let (cdf, pdf) = cdf_pdf_f32(x[j]);
            dx[j] = g[j] * (cdf + x[j] * pdf);
        }
    }
}

/// `gelu(x)` elementwise, in parallel.
pub(crate) fn gelu<T: Elem>(x: &[T], approximate: GeluApproximate) -> Vec<T> {
    // SAFETY: the row function writes every element of its output (no zero fill first: a
    // pass over a buffer as large as the hidden layer).
    unsafe { written_vec(x.len(), |y| gelu_into(x, y, approximate)) }
}

/// [`gelu`] written into `y` (as long as `x`; any contents on entry).
pub(crate) fn gelu_into<T: Elem>(x: &[T], y: &mut [T], approximate: GeluApproximate) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| T::gelu_row(x, y, approximate))
}

/// `g·gelu'(x)` elementwise (the GELU's input gradient; exact: `g·(Φ(x) + x·φ(x))`), in
/// parallel.
pub(crate) fn gelu_grad<T: Elem>(x: &[T], g: &[T], approximate: GeluApproximate) -> Vec<T> {
    // SAFETY: as in `gelu`.
    unsafe { written_vec(x.len(), |dx| gelu_grad_into(x, g, dx, approximate)) }
}

/// [`gelu_grad`] written into `dx` (as long as `x`; any contents on entry).
pub(crate) fn gelu_grad_into<T: Elem>(
    x: &[T],
    g: &[T],
    dx: &mut [T],
    approximate: GeluApproximate,
) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
        .for_each(|(dx, (x, g))| T::gelu_grad_row(x, g, dx, approximate));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 rows (AVX2 where the CPU has it, scalar tails) against the exact GELU and its
    /// derivative in f64, and against the scalar formula.
    #[test]
    fn f32_rows_match_exact_gelu() {
        let xs: Vec<f32> = (0..1003).map(|i| -12.0 + i as f32 * 0.024).collect();
        let gs: Vec<f32> = (0..1003).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let (mut y, mut dx) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        forward_row_f32(&xs, &mut y);
        backward_row_f32(&xs, &gs, &mut dx);
        let (mut ey, mut edx) = (vec![0f64; xs.len()], vec![0f64; xs.len()]);
        let x64: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
        let g64: Vec<f64> = gs.iter().map(|&g| f64::from(g)).collect();
        forward_row_f64(&x64, &mut ey);
        backward_row_f64(&x64, &g64, &mut edx);
        for i in 0..xs.len() {
            let x = x64[i];
            // erf within 1.5e-7, plus f32 rounding.
            let tol = 2.5e-7 * x.abs().max(1.0);
            assert!(
                (f64::from(y[i]) - ey[i]).abs() <= tol,
                "gelu({x}) = {} vs {}",
                y[i],
                ey[i]
            );
            let tol = 4e-7 * g64[i] * x.abs().max(1.0);
            assert!(
                (f64::from(dx[i]) - edx[i]).abs() <= tol,
                "gelu'({x}): {} vs {}",
                dx[i],
                edx[i]
            );
            let (cdf, pdf) = cdf_pdf_f32(xs[i]);
            let scalar = xs[i] * cdf;
            assert!(
                (y[i] - scalar).abs() <= 1e-6 * scalar.abs().max(1.0),
                "lanes vs scalar at {x}"
            );
            let scalar = gs[i] * (cdf + xs[i] * pdf);
            assert!(
                (dx[i] - scalar).abs() <= 1e-6 * scalar.abs().max(1.0),
                "lanes vs scalar at {x}"
            );
        }
        let (mut inf, mut dinf) = ([0f32; 2], [0f32; 2]);
        forward_row_f32(&[f32::NEG_INFINITY, -200.0], &mut inf);
        backward_row_f32(&[-200.0, 200.0], &[1.0, 1.0], &mut dinf);
        assert_eq!(inf[1], 0.0);
        assert_eq!(dinf, [0.0, 1.0]);
    }
}
