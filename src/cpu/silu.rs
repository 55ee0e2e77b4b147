//! SwiGLU's gate `silu(g)·u` and its two input gradients on CPU slices, in parallel.
//!
//! f32 on eight AVX2 lanes where the CPU has them, with the crate's `exp` (about 1 ulp); f64
//! with the standard library's. The sigmoid is `1/(1 + e^(−g))` as PyTorch's CPU `silu`
//! computes it (`x / (1 + exp(-x))`).

use rayon::prelude::*;

use super::simd::exp_f32;
use super::{written_vec, Elem};

/// Elements per rayon task.
const CHUNK: usize = 4096;

/// `y = silu(g)·u` on an f64 row.
pub(super) fn forward_row_f64(g: &[f64], u: &[f64], y: &mut [f64]) {
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        *y = g / (1.0 + (-g).exp()) * u;
    }
}

/// `dg = d·u·σ(g)·(1 + g·(1 − σ(g)))`, `du = d·g·σ(g)` on an f64 row.
pub(super) fn backward_row_f64(g: &[f64], u: &[f64], d: &[f64], dg: &mut [f64], du: &mut [f64]) {
    for i in 0..dg.len().min(du.len()) {
        let s = 1.0 / (1.0 + (-g[i]).exp());
        dg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        du[i] = d[i] * g[i] * s;
    }
}

/// `y = silu(g)·u` on an f32 row (AVX2 where the CPU has it).
pub(super) fn forward_row_f32(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { avx2::forward(g, u, y) };
    }
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        *y = g / (1.0 + exp_f32(-g)) * u;
    }
}

/// The two input gradients of [`forward_row_f32`] (AVX2 where the CPU has it).
pub(super) fn backward_row_f32(g: &[f32], u: &[f32], d: &[f32], dg: &mut [f32], du: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2() {
        // SAFETY: as above.
        return unsafe { avx2::backward(g, u, d, dg, du) };
    }
    for i in 0..dg.len().min(du.len()) {
        let s = 1.0 / (1.0 + exp_f32(-g[i]));
        dg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        du[i] = d[i] * g[i] * s;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::cpu::simd::{exp256, exp_f32};

    /// `σ(g) = 1/(1 + e^(−g))`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sigmoid(g: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_div_ps(one, _mm256_add_ps(one, e))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward(g: &[f32], u: &[f32], y: &mut [f32]) {
        let n = g.len().min(u.len()).min(y.len());
        let mut i = 0;
        while i + 8 <= n {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let uv = _mm256_loadu_ps(u.as_ptr().add(i));
            let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(silu, uv));
            i += 8;
        }
        for j in i..n {
            y[j] = g[j] / (1.0 + exp_f32(-g[j])) * u[j];
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward(g: &[f32], u: &[f32], d: &[f32], dg: &mut [f32], du: &mut [f32]) {
        let n = g
            .len()
            .min(u.len())
            .min(d.len())
            .min(dg.len())
            .min(du.len());
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let uv = _mm256_loadu_ps(u.as_ptr().add(i));
            let dv = _mm256_loadu_ps(d.as_ptr().add(i));
            let s = sigmoid(gv);
            // 1 + g·(1 − σ)
            let slope = _mm256_fmadd_ps(gv, _mm256_sub_ps(one, s), one);
            let ds = _mm256_mul_ps(dv, s);
            _mm256_storeu_ps(
                dg.as_mut_ptr().add(i),
                _mm256_mul_ps(_mm256_mul_ps(ds, uv), slope),
            );
            _mm256_storeu_ps(du.as_mut_ptr().add(i), _mm256_mul_ps(ds, gv));
            i += 8;
        }
        for j in i..n {
            let s = 1.0 / (1.0 + exp_f32(-g[j]));
            dg[j] = d[j] * u[j] * s * (1.0 + g[j] * (1.0 - s));
            du[j] = d[j] * g[j] * s;
        }
    }
}

/// `silu(g)·u` elementwise, in parallel (`g` and `u` as long).
pub(crate) fn silu_mul<T: Elem>(g: &[T], u: &[T]) -> Vec<T> {
    // SAFETY: the row function writes every element of its output.
    unsafe {
        written_vec(g.len(), |y| {
            y.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
                .for_each(|(y, (g, u))| T::silu_mul_row(g, u, y))
        })
    }
}

/// The gradients of `g` and `u` given the output's `d` (all as long), in parallel.
pub(crate) fn silu_mul_grad<T: Elem>(g: &[T], u: &[T], d: &[T]) -> (Vec<T>, Vec<T>) {
    let n = g.len();
    let mut du = Vec::with_capacity(n);
    // SAFETY: the row function writes every element of both outputs; `du`'s capacity is `n`
    // and its length is set only after the pass.
    let dg = unsafe {
        written_vec(n, |dg| {
            let du = std::slice::from_raw_parts_mut(du.as_mut_ptr(), n);
            dg.par_chunks_mut(CHUNK)
                .zip(du.par_chunks_mut(CHUNK))
                .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
                .zip(d.par_chunks(CHUNK))
                .for_each(|(((dg, du), (g, u)), d)| T::silu_mul_grad_row(g, u, d, dg, du))
        })
    };
    // SAFETY: every element was written above.
    unsafe { du.set_len(n) };
    (dg, du)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 rows (AVX2 where the CPU has it, scalar tails) against the f64 formula.
    #[test]
    fn f32_rows_match_f64() {
        let n = 1003;
        let g: Vec<f32> = (0..n).map(|i| -30.0 + i as f32 * 0.06).collect();
        let u: Vec<f32> = (0..n).map(|i| 0.5 - (i % 11) as f32 * 0.2).collect();
        let d: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let (mut y, mut dg, mut du) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        forward_row_f32(&g, &u, &mut y);
        backward_row_f32(&g, &u, &d, &mut dg, &mut du);
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let (g64, u64_, d64) = (wide(&g), wide(&u), wide(&d));
        let (mut ey, mut edg, mut edu) = (vec![0f64; n], vec![0f64; n], vec![0f64; n]);
        forward_row_f64(&g64, &u64_, &mut ey);
        backward_row_f64(&g64, &u64_, &d64, &mut edg, &mut edu);
        for i in 0..n {
            let close = |got: f32, want: f64, scale: f64| {
                (f64::from(got) - want).abs() <= 1e-6 * scale.max(1.0)
            };
            let scale = (g64[i].abs() + 1.0) * (u64_[i].abs() + 1.0) * d64[i];
            assert!(
                close(y[i], ey[i], scale),
                "y at g={}: {} vs {}",
                g[i],
                y[i],
                ey[i]
            );
            assert!(
                close(dg[i], edg[i], scale),
                "dg at g={}: {} vs {}",
                g[i],
                dg[i],
                edg[i]
            );
            assert!(
                close(du[i], edu[i], scale),
                "du at g={}: {} vs {}",
                g[i],
                du[i],
                edu[i]
            );
        }
        // Far out the gate saturates: σ(g) rounds to 1.
        assert_eq!(y[n - 1], g[n - 1] * u[n - 1]);
    }

    /// The parallel drivers cover every element, across chunk boundaries.
    #[test]
    fn drivers_cover_every_chunk() {
        let n = 3 * CHUNK + 5;
        let g: Vec<f64> = (0..n).map(|i| (i % 13) as f64 * 0.3 - 2.0).collect();
        let u: Vec<f64> = (0..n).map(|i| (i % 5) as f64 - 2.0).collect();
        let d = vec![1.5f64; n];
        let y = silu_mul(&g, &u);
        let (dg, du) = silu_mul_grad(&g, &u, &d);
        for i in 0..n {
            let s = 1.0 / (1.0 + (-g[i]).exp());
            assert_eq!(y[i], g[i] / (1.0 + (-g[i]).exp()) * u[i]);
            assert!((du[i] - 1.5 * g[i] * s).abs() < 1e-15);
            assert!((dg[i] - 1.5 * u[i] * s * (1.0 + g[i] * (1.0 - s))).abs() < 1e-15);
        }
    }
}
