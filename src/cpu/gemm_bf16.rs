//! The blocked bf16 product of CPUs with AVX-512 BF16 (AMD Zen 4 and later, Intel Cooper Lake
//! and later) when MKL is not linked: `vdpbf16ps` multiplies pairs of bf16 numbers and adds
//! them into f32 lanes, twice the multiply-adds of an f32 FMA per instruction.
//!
//! - The left operand is packed as rows of 32-bit words, each two bf16 numbers adjacent along
//!   `k` (a pair), broadcast one word at a time.
//! - The right operand is packed in panels of [`NR`] columns: for each pair of `k`, the
//!   panel's 32 columns as words of two bf16 numbers (two vectors).
//! - A register tile is up to [`MR`] rows × [`NR`] columns of f32 sums, over the whole `k`;
//!   tiles are split between the threads by panels and blocks of rows.

use super::bf16::{round, Packed};
use super::Operand;

/// Columns per panel of the right operand: two vectors of 16 f32 lanes.
const NR: usize = 32;
/// Rows per register tile: `2·MR` accumulators, two panel vectors and a broadcast fit in the
/// 32 registers.
const MR: usize = 12;
/// Rows per task (whole tiles).
const MC: usize = 16 * MR;

/// Whether this CPU runs [`gemm`]: AVX-512 (as our other kernels choose it) and AVX-512 BF16.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::Isa::detect() == Some(super::simd::Isa::Avx512)
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// An operand of [`gemm`]: a weight's bf16 copy, or f32 values rounded as they are packed.
pub(crate) enum Bf16Operand {
    Copy(Packed<u16>),
    F32(Operand<f32>),
}

impl Bf16Operand {
    /// The bf16 bits of element `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` is inside the operand.
    #[inline(always)]
    unsafe fn at(&self, r: usize, c: usize) -> u16 {
        match self {
            Bf16Operand::Copy(p) => {
                let (ptr, rs, cs) = p.operand();
                *ptr.add(r * rs + c * cs)
            }
            Bf16Operand::F32((ptr, rs, cs)) => round(*ptr.add(r * rs + c * cs)),
        }
    }
}

// SAFETY: only read, by the packing tasks.
unsafe impl Sync for Bf16Operand {}

/// Two bf16 numbers as one word, `lo` first along `k`.
#[inline(always)]
fn word(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// `a (m × k)` as `m` rows of `k.div_ceil(2)` words (an odd `k` ends in a zero).
fn pack_lhs(a: &Bf16Operand, m: usize, k: usize) -> Vec<u32> {
    let kp = k.div_ceil(2);
    let mut out = vec![0u32; m * kp];
    let parallel = super::par::parallel_pass(m * k);
    super::par::for_each_chunk_mut(&mut out, kp.max(1) * MR, parallel, |t, chunk| {
        for (r, row) in chunk.chunks_mut(kp.max(1)).enumerate() {
            let i = t * MR + r;
            for (p, w) in row.iter_mut().enumerate() {
                // SAFETY: i < m and 2p < k; 2p + 1 only when below k.
                unsafe {
                    let hi = if 2 * p + 1 < k { a.at(i, 2 * p + 1) } else { 0 };
                    *w = word(a.at(i, 2 * p), hi);
                }
            }
        }
    });
    out
}

/// `b (k × n)` as `n.div_ceil(NR)` panels of `k.div_ceil(2) × NR` words (columns past `n` and
/// an odd `k`'s last half zero).
fn pack_rhs(b: &Bf16Operand, k: usize, n: usize) -> Vec<u32> {
    let kp = k.div_ceil(2);
    let panel = kp * NR;
    let mut out = vec![0u32; n.div_ceil(NR) * panel];
    let parallel = super::par::parallel_pass(k * n);
    super::par::for_each_chunk_mut(&mut out, panel.max(1), parallel, |t, words| {
        for j in t * NR..((t + 1) * NR).min(n) {
            for p in 0..kp {
                // SAFETY: j < n and 2p < k; 2p + 1 only when below k.
                unsafe {
                    let hi = if 2 * p + 1 < k { b.at(2 * p + 1, j) } else { 0 };
                    words[p * NR + j % NR] = word(b.at(2 * p, j), hi);
                }
            }
        }
    });
    out
}

/// `dst = [dst +] alpha · a · b` of bf16 operands `a (m × k)` and `b (k × n)` with f32 sums,
/// `dst` row-major (`dst.2 == 1`), on all threads when `all`.
///
/// # Safety
/// As [`gemm`](super::gemm); [`available`] is true; `dst.2 == 1`.
pub(crate) unsafe fn gemm(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, usize, usize),
    accumulate: bool,
    [a, b]: [&Bf16Operand; 2],
    alpha: f32,
    all: bool,
) {
    debug_assert_eq!(dst.2, 1);
    let (a, b) = (pack_lhs(a, m, k), pack_rhs(b, k, n));
    let kp = k.div_ceil(2);
    let (panels, blocks) = (n.div_ceil(NR), m.div_ceil(MC));
    struct Out(*mut f32);
    // SAFETY: each task writes its own tiles of dst.
    unsafe impl Sync for Out {}
    let out = Out(dst.0);
    let out = &out;
    let task = |t: usize| {
        let (panel, block) = (t % panels, t / panels);
        let cols = (n - panel * NR).min(NR);
        let b = &b[panel * kp * NR..(panel + 1) * kp * NR];
        for i in (block * MC..((block + 1) * MC).min(m)).step_by(MR) {
            let rows = (m - i).min(MR);
            let a = &a[i * kp..(i + rows) * kp];
            // SAFETY: the tile (rows × cols at (i, panel·NR)) is inside dst.
            let c = (unsafe { out.0.add(i * dst.1 + panel * NR) }, dst.1);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX-512 BF16 (the caller).
            unsafe {
                x86::tile(a, b, kp, rows, cols, c, accumulate, alpha)
            };
        }
    };
    super::par::for_each_init(panels * blocks, all, || (), |_, t| task(t));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// One register tile: `c[r][j] = [c[r][j] +] alpha · Σ_p dot(a[r][p], b[p][j])` for
    /// `r < rows` (≤ [`MR`]), `j < cols` (≤ [`NR`]); `a` holds `rows` rows of `kp` words, `b`
    /// a panel of `kp × NR` words; `c` is (first element, row stride).
    ///
    /// # Safety
    /// The CPU has AVX-512 BF16; the tile lies inside `c`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile(
        a: &[u32],
        b: &[u32],
        kp: usize,
        rows: usize,
        cols: usize,
        c: (*mut f32, usize),
        accumulate: bool,
        alpha: f32,
    ) {
        let (mut a, mut c, mut rows) = (a, c, rows);
        while rows > 0 {
            let t = (b, kp, cols, c, accumulate, alpha);
            let done = match rows {
                12.. => tile_rows::<12>(a, t),
                8..=11 => tile_rows::<8>(a, t),
                4..=7 => tile_rows::<4>(a, t),
                _ => tile_rows::<1>(a, t),
            };
            (a, c, rows) = (&a[done * kp..], (c.0.add(done * c.1), c.1), rows - done);
        }
    }

    /// [`tile`] of exactly `R` rows (`t`: its other arguments); returns `R`.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    unsafe fn tile_rows<const R: usize>(
        a: &[u32],
        (b, kp, cols, (c, ldc), accumulate, alpha): (
            &[u32],
            usize,
            usize,
            (*mut f32, usize),
            bool,
            f32,
        ),
    ) -> usize {
        debug_assert!(R <= MR && a.len() >= R * kp && b.len() >= kp * NR);
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for p in 0..kp {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR).cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR + 16).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let w: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*ap.add(r * kp + p) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], w, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], w, b1);
            }
        }
        let scale = _mm512_set1_ps(alpha);
        for (r, acc) in acc.iter().enumerate() {
            for (h, v) in acc.iter().enumerate() {
                let count = cols.saturating_sub(16 * h).min(16);
                if count == 0 {
                    continue;
                }
                let mask: __mmask16 = ((1u32 << count) - 1) as u16;
                let p = c.add(r * ldc + 16 * h);
                let mut v = _mm512_mul_ps(*v, scale);
                if accumulate {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p));
                }
                _mm512_mask_storeu_ps(p, mask, v);
            }
        }
        R
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::bf16::{pack, widen};

    /// Against f64 sums of the bf16 operands, on shapes around the tile and panel sizes, with
    /// either operand stored transposed, accumulating or not; nothing outside the output is
    /// written.
    #[test]
    fn equals_f64_products_of_bf16_operands() {
        if !available() {
            eprintln!("skipped: no AVX-512 BF16 on this CPU");
            return;
        }
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f32 / 211.0 - 2.4;
        for (m, n, k) in [
            (1, 1, 1),
            (13, 33, 7),
            (12, 32, 64),
            (25, 70, 301),
            (200, 45, 96),
        ] {
            for (lhs_t, rhs_t, accumulate) in [
                (false, false, false),
                (true, true, true),
                (false, true, true),
            ] {
                let a: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
                let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
                let (ars, acs) = if lhs_t { (1, m) } else { (k, 1) };
                let (brs, bcs) = if rhs_t { (1, k) } else { (n, 1) };
                let ld = n + 3;
                let mut c: Vec<f32> = (0..m * ld).map(|i| val(i, 3)).collect();
                let before = c.clone();
                // SAFETY: a and b hold m·k and k·n elements at their strides; c m rows of ld.
                unsafe {
                    // The left operand as a copy, the right one rounded as it is packed.
                    let pa = Bf16Operand::Copy(pack((a.as_ptr(), ars, acs), m, k, round));
                    let pb = Bf16Operand::F32((b.as_ptr(), brs, bcs));
                    gemm(
                        (m, n, k),
                        (c.as_mut_ptr(), ld, 1),
                        accumulate,
                        [&pa, &pb],
                        0.5,
                        true,
                    );
                    let (pa, pb) = (
                        Bf16Operand::F32((a.as_ptr(), ars, acs)),
                        Bf16Operand::Copy(pack((b.as_ptr(), brs, bcs), k, n, round)),
                    );
                    let mut again = before.clone();
                    let d = (again.as_mut_ptr(), ld, 1);
                    gemm((m, n, k), d, accumulate, [&pa, &pb], 0.5, false);
                    assert_eq!(
                        again, c,
                        "({m},{n},{k}): another operand kind or one thread"
                    );
                }
                for i in 0..m {
                    for j in 0..ld {
                        let (got, start) = (c[i * ld + j], before[i * ld + j]);
                        if j >= n {
                            assert_eq!(got, start, "({m},{n},{k}) wrote c[{i}][{j}]");
                            continue;
                        }
                        let dot: f64 = (0..k)
                            .map(|p| {
                                let x = widen(round(a[i * ars + p * acs])) as f64;
                                x * widen(round(b[p * brs + j * bcs])) as f64
                            })
                            .sum();
                        let want = 0.5 * dot + if accumulate { start as f64 } else { 0.0 };
                        assert!(
                            (got as f64 - want).abs() <= 1e-4 * (1.0 + k as f64),
                            "({m},{n},{k}) {lhs_t}/{rhs_t}/{accumulate}: c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }
}
