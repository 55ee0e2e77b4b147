//! The tanh approximation of the GELU (GPT-2's `gelu_new`), `0.5·x·(1 + tanh(u))` with
//! `u = √(2/π)·(x + 0.044715·x³)`, and its derivative, on CPU rows: PyTorch's formulas
//! (`F.gelu(x, approximate="tanh")` and its backward). f32 computes `tanh(u)` as
//! `1 − 2/(e^{2u} + 1)` with the crate's branch-free `exp`, so that the rows vectorise
//! (compiled again with AVX2 and AVX-512, chosen at run time); f64 uses the standard library.

use super::simd::{exp_f32, Isa};

/// `√(2/π)`.
const BETA: f64 = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
const KAPPA: f64 = 0.044715;

/// `y = gelu_tanh(x)` on an f64 row.
pub(super) fn forward_row_f64(x: &[f64], y: &mut [f64]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = 0.5 * x * (1.0 + (BETA * (x + KAPPA * x * x * x)).tanh());
    }
}

/// `dx = g·gelu_tanh'(x)` on an f64 row.
pub(super) fn backward_row_f64(x: &[f64], g: &[f64], dx: &mut [f64]) {
    for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
        let t = (BETA * (x + KAPPA * x * x * x)).tanh();
        let right = 0.5 * x * (1.0 - t * t) * BETA * (1.0 + 3.0 * KAPPA * x * x);
        *dx = g * (0.5 * (1.0 + t) + right);
    }
}

/// `tanh(u)` of `x` in f32: `1 − 2/(e^{2u} + 1)` (±1 where `e^{2u}` saturates).
#[inline(always)]
fn tanh_inner(x: f32) -> f32 {
    let u = BETA as f32 * (x + KAPPA as f32 * x * x * x);
    1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0)
}

#[inline(always)]
fn forward_lanes(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = 0.5 * x * (1.0 + tanh_inner(x));
    }
}

#[inline(always)]
fn backward_lanes(x: &[f32], g: &[f32], dx: &mut [f32]) {
    for ((dx, &x), &g) in dx.iter_mut().zip(x).zip(g) {
        let t = tanh_inner(x);
        let right = 0.5 * x * (1.0 - t * t) * BETA as f32 * (1.0 + 3.0 * KAPPA as f32 * x * x);
        *dx = g * (0.5 * (1.0 + t) + right);
    }
}

/// `y = gelu_tanh(x)` on an f32 row.
pub(super) fn forward_row_f32(x: &[f32], y: &mut [f32]) {
    // SAFETY (each arm): the CPU has the instruction set `Isa::detect` returned.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { x86::forward_avx512(x, y) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { x86::forward_avx2(x, y) },
        _ => forward_lanes(x, y),
    }
}

/// `dx = g·gelu_tanh'(x)` on an f32 row.
pub(super) fn backward_row_f32(x: &[f32], g: &[f32], dx: &mut [f32]) {
    // SAFETY (each arm): as above.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { x86::backward_avx512(x, g, dx) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { x86::backward_avx2(x, g, dx) },
        _ => backward_lanes(x, g, dx),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{backward_lanes, forward_lanes};

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward_avx2(x: &[f32], y: &mut [f32]) {
        forward_lanes(x, y)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn forward_avx512(x: &[f32], y: &mut [f32]) {
        forward_lanes(x, y)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward_avx2(x: &[f32], g: &[f32], dx: &mut [f32]) {
        backward_lanes(x, g, dx)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn backward_avx512(x: &[f32], g: &[f32], dx: &mut [f32]) {
        backward_lanes(x, g, dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 rows against PyTorch's formulas in f64 (the standard library's `tanh`), from
    /// far below zero to far above, and at the saturated ends.
    #[test]
    fn f32_rows_match_the_f64_formulas() {
        let xs: Vec<f32> = (0..2003).map(|i| -15.0 + i as f32 * 0.015).collect();
        let gs: Vec<f32> = (0..2003).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let (mut y, mut dx) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        forward_row_f32(&xs, &mut y);
        backward_row_f32(&xs, &gs, &mut dx);
        let x64: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
        let g64: Vec<f64> = gs.iter().map(|&g| f64::from(g)).collect();
        let (mut ey, mut edx) = (vec![0f64; xs.len()], vec![0f64; xs.len()]);
        forward_row_f64(&x64, &mut ey);
        backward_row_f64(&x64, &g64, &mut edx);
        for i in 0..xs.len() {
            let x = x64[i];
            let tol = 4e-7 * x.abs().max(1.0);
            assert!(
                (f64::from(y[i]) - ey[i]).abs() <= tol,
                "gelu_tanh({x}) = {} vs {}",
                y[i],
                ey[i]
            );
            let tol = 1e-6 * g64[i] * x.abs().max(1.0);
            assert!(
                (f64::from(dx[i]) - edx[i]).abs() <= tol,
                "gelu_tanh'({x}): {} vs {}",
                dx[i],
                edx[i]
            );
        }
        let (mut ends, mut dends) = ([0f32; 2], [0f32; 2]);
        forward_row_f32(&[-200.0, 200.0], &mut ends);
        backward_row_f32(&[-200.0, 200.0], &[1.0, 1.0], &mut dends);
        assert_eq!(ends, [0.0, 200.0]);
        assert_eq!(dends, [0.0, 1.0]);
    }
}
