//! The dot products of decoding under [`crate::autocast`]: f32 rows that hold bf16 values
//! against a weight's rows, f32 sums.
//!
//! Against a weight's bf16 copy the row is read as 32-bit words, each two bf16 numbers: the
//! high one is the word with its low half cleared, the low one the word shifted up, so a
//! vector of words gives two vectors of f32 in two instructions. The f32 row is laid out to
//! match once per product ([`pair_order`]): each block of [`BLOCK`] elements as its even then
//! its odd elements. Against f32 rows (a weight the scope does not keep) each element is
//! rounded as it is read.

use super::bf16::{round, widen};
use super::simd::Isa;

/// Elements per block of [`pair_order`]: one AVX-512 vector of words, two of AVX2.
pub(crate) const BLOCK: usize = 32;

/// `x` laid out for [`dot_pairs`]: each whole block of [`BLOCK`] elements as its even elements
/// then its odd ones; the elements after the last whole block as they are.
pub(crate) fn pair_order(x: &[f32], out: &mut [f32]) {
    let whole = x.len() / BLOCK * BLOCK;
    for (src, dst) in x[..whole]
        .chunks_exact(BLOCK)
        .zip(out[..whole].chunks_exact_mut(BLOCK))
    {
        for i in 0..BLOCK / 2 {
            dst[i] = src[2 * i];
            dst[BLOCK / 2 + i] = src[2 * i + 1];
        }
    }
    out[whole..x.len()].copy_from_slice(&x[whole..]);
}

/// `Σ x[j]·w[j]` of a row `x` in [`pair_order`] and bf16 bits `w` (the same length), f32 sums.
pub(crate) fn dot_pairs(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len(), "bf16 dot: row lengths");
    // SAFETY (each arm): the CPU has the instruction set `Isa::detect` returned.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { x86::dot_pairs_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { x86::dot_pairs_avx2(x, w) },
        _ => dot_pairs_scalar(x, w, 0, 0.0),
    }
}

/// [`dot_pairs`] one element at a time from block `from` on, added to `sum`.
fn dot_pairs_scalar(x: &[f32], w: &[u16], from: usize, mut sum: f32) -> f32 {
    let whole = x.len() / BLOCK * BLOCK;
    for (xb, wb) in x[from * BLOCK..whole]
        .chunks_exact(BLOCK)
        .zip(w[from * BLOCK..whole].chunks_exact(BLOCK))
    {
        for i in 0..BLOCK / 2 {
            sum += xb[i] * widen(wb[2 * i]) + xb[BLOCK / 2 + i] * widen(wb[2 * i + 1]);
        }
    }
    let tail = x[whole..].iter().zip(&w[whole..]);
    sum + tail.map(|(a, b)| a * widen(*b)).sum::<f32>()
}

/// `Σ x[j]·bf16(w[j])` of a row `x` as it is and f32 `w`, each `w[j]` rounded as it is read.
pub(crate) fn dot_rounded(x: &[f32], w: &[f32]) -> f32 {
    // SAFETY (each arm): as above.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { x86::dot_rounded_avx512(x, w) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { x86::dot_rounded_avx2(x, w) },
        _ => dot_rounded_lanes(x, w),
    }
}

#[inline(always)]
fn dot_rounded_lanes(x: &[f32], w: &[f32]) -> f32 {
    super::simd::dot_lanes(x, w, |v| widen(round(v)))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{dot_pairs_scalar, dot_rounded_lanes, BLOCK};

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rounded_avx2(x: &[f32], w: &[f32]) -> f32 {
        dot_rounded_lanes(x, w)
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dot_rounded_avx512(x: &[f32], w: &[f32]) -> f32 {
        dot_rounded_lanes(x, w)
    }

    /// Two blocks per step into four accumulators (locals, so that they stay in registers);
    /// a block left over alone.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dot_pairs_avx512(x: &[f32], w: &[u16]) -> f32 {
        let blocks = x.len() / BLOCK;
        let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        // Block b's products: (even, odd) elements times their x. SAFETY: b < blocks.
        let pair = |b: usize| unsafe {
            let words = _mm512_loadu_si512(wp.add(b * BLOCK).cast());
            let even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
            let odd = _mm512_castsi512_ps(_mm512_and_si512(words, high));
            let xe = _mm512_loadu_ps(xp.add(b * BLOCK));
            let xo = _mm512_loadu_ps(xp.add(b * BLOCK + 16));
            (even, xe, odd, xo)
        };
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
        );
        let mut b = 0;
        while b + 2 <= blocks {
            let (e0, x0, o0, y0) = pair(b);
            let (e1, x1, o1, y1) = pair(b + 1);
            a0 = _mm512_fmadd_ps(e0, x0, a0);
            a1 = _mm512_fmadd_ps(o0, y0, a1);
            a2 = _mm512_fmadd_ps(e1, x1, a2);
            a3 = _mm512_fmadd_ps(o1, y1, a3);
            b += 2;
        }
        if b < blocks {
            let (e0, x0, o0, y0) = pair(b);
            a0 = _mm512_fmadd_ps(e0, x0, a0);
            a1 = _mm512_fmadd_ps(o0, y0, a1);
        }
        let sum = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        dot_pairs_scalar(x, w, blocks, _mm512_reduce_add_ps(sum))
    }

    /// One block per step (two vectors of words) into four accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_pairs_avx2(x: &[f32], w: &[u16]) -> f32 {
        let blocks = x.len() / BLOCK;
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        let mut acc = [_mm256_setzero_ps(); 4];
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        for b in 0..blocks {
            for half in 0..2 {
                // Words 8·half.. of the block: its even and odd elements 8·half.. .
                let words = _mm256_loadu_si256(wp.add(b * BLOCK + 16 * half).cast());
                let even = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
                let odd = _mm256_castsi256_ps(_mm256_and_si256(words, high));
                let xe = _mm256_loadu_ps(xp.add(b * BLOCK + 8 * half));
                let xo = _mm256_loadu_ps(xp.add(b * BLOCK + 16 + 8 * half));
                acc[2 * half] = _mm256_fmadd_ps(even, xe, acc[2 * half]);
                acc[2 * half + 1] = _mm256_fmadd_ps(odd, xo, acc[2 * half + 1]);
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        dot_pairs_scalar(x, w, blocks, lanes.iter().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both dot products on every instruction set the CPU has (and one element at a time)
    /// against f64 sums of the rounded values, for lengths around the block.
    #[test]
    fn dots_equal_f64_sums_of_rounded_values() {
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f32 / 97.0 - 5.0;
        for n in [0, 1, 31, 32, 33, 64, 95, 768, 3072 + 7] {
            let x: Vec<f32> = (0..n).map(|i| widen(round(val(i, 1)))).collect();
            let w32: Vec<f32> = (0..n).map(|i| val(i, 2)).collect();
            let w16: Vec<u16> = w32.iter().map(|&v| round(v)).collect();
            let want: f64 = x
                .iter()
                .zip(&w16)
                .map(|(a, b)| *a as f64 * widen(*b) as f64)
                .sum();
            let mut paired = vec![0f32; n];
            pair_order(&x, &mut paired);
            let tol = 1e-4 * (1.0 + n as f64);
            let mut got = vec![
                ("scalar pairs", dot_pairs_scalar(&paired, &w16, 0, 0.0)),
                ("lanes rounded", dot_rounded_lanes(&x, &w32)),
                ("pairs", dot_pairs(&paired, &w16)),
                ("rounded", dot_rounded(&x, &w32)),
            ];
            #[cfg(target_arch = "x86_64")]
            for isa in Isa::available() {
                // SAFETY: the CPU has `isa`.
                got.extend(unsafe {
                    match isa {
                        Isa::Avx512 => [
                            ("avx512 pairs", x86::dot_pairs_avx512(&paired, &w16)),
                            ("avx512 rounded", x86::dot_rounded_avx512(&x, &w32)),
                        ],
                        Isa::Avx2 => [
                            ("avx2 pairs", x86::dot_pairs_avx2(&paired, &w16)),
                            ("avx2 rounded", x86::dot_rounded_avx2(&x, &w32)),
                        ],
                    }
                });
            }
            for (name, g) in got {
                assert!(
                    (g as f64 - want).abs() <= tol,
                    "{name} n={n}: {g}, want {want}"
                );
            }
        }
    }
}
