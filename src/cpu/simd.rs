//! The f32 row primitives of the CPU kernels: row maximum, `exp(x - shift)` with its sum, dot
//! product, and the polynomial `exp` they share with the GELU.
//!
//! The rows are written so that LLVM vectorises them, compiled again with AVX2 + FMA and with
//! AVX-512 and chosen at run time ([`Isa::detect`]; the crate is built for baseline x86-64);
//! where LLVM does not vectorise (the `exp` polynomial's saturating casts), intrinsics for
//! each. f64 rows use the standard library (see [`Elem`](super::Elem)): that path is for
//! precision, not speed.

/// Whether the CPU has AVX2 and FMA (the `*_avx2` paths).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    // Cached by std after the first call: one atomic load.
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Whether our kernels use AVX-512 (foundation): the CPU has it (and AVX2 + FMA) and the
/// crate is built without the `force-avx2` feature (which tests the AVX2 paths on such a CPU,
/// or keeps a CPU that lowers its clock under AVX-512 on AVX2; PyTorch's equivalent is
/// `ATEN_CPU_CAPABILITY=avx2`). The `gemm` crate's projections choose for themselves.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    !cfg!(feature = "force-avx2") && is_x86_feature_detected!("avx512f") && avx2()
}

/// The vector instruction sets of the CPU kernels (the rows here, the register tiles of
/// `crate::attention::fused::kernel::small_gemm`), best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
}

impl Isa {
    /// Tests only: every instruction set this CPU has (the best one and AVX2 below it), so
    /// that a test runs each.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|&isa| Isa::detect().is_some_and(|best| best == isa || isa == Isa::Avx2))
            .collect()
    }

    /// The best one this CPU has (`None`: neither).
    pub(crate) fn detect() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if avx512() {
                return Some(Isa::Avx512);
            }
            if avx2() {
                return Some(Isa::Avx2);
            }
        }
        None
    }
}

/// The largest element of an f32 row (`-inf` for an empty or fully `-inf` row).
pub(crate) fn row_max(row: &[f32]) -> f32 {
    // SAFETY (each arm): the CPU has the instruction set `Isa::detect` returned.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { row_max_avx512(row) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { row_max_avx2(row) },
        _ => row_max_f32(row),
    }
}

/// `row[j] = exp(row[j] - shift)` (0 where `row[j] = -inf`) on an f32 row, returning the sum.
pub(crate) fn exp_shift_sum(row: &mut [f32], shift: f32) -> f32 {
    // SAFETY (each arm): as above.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { exp_shift_sum_avx512(row, shift) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { exp_shift_sum_avx2(row, shift) },
        _ => exp_shift_sum_f32(row, shift),
    }
}

/// `Σ a[j]·b[j]` over f32 rows (the shorter length).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY (each arm): as above.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { dot_avx2(a, b) },
        _ => dot_f32(a, b),
    }
}

/// `dst[j] = a·src[j]`, or `dst[j] += a·src[j]` when `add` (the shorter length): the
/// attention weights written from a tile's exponentials.
pub(crate) fn scale_row(dst: &mut [f32], src: &[f32], a: f32, add: bool) {
    // SAFETY (each arm): as above.
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512) => unsafe { scale_row_avx512(dst, src, a, add) },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { scale_row_avx2(dst, src, a, add) },
        _ => scale_row_scalar(dst, src, a, add),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_row_avx2(dst: &mut [f32], src: &[f32], a: f32, add: bool) {
    scale_row_scalar(dst, src, a, add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scale_row_avx512(dst: &mut [f32], src: &[f32], a: f32, add: bool) {
    scale_row_scalar(dst, src, a, add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_max_avx2(row: &[f32]) -> f32 {
    row_max_f32(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn row_max_avx512(row: &[f32]) -> f32 {
    row_max_f32(row)
}

/// [`exp_shift_sum_avx2`] on sixteen lanes, the tail through a lane mask (only the tail:
/// masked stores are slow on AMD).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_shift_sum_avx512(row: &mut [f32], shift: f32) -> f32 {
    use std::arch::x86_64::*;
    let n = row.len();
    let p = row.as_mut_ptr();
    let vshift = _mm512_set1_ps(shift);
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i + 32 <= n {
        let e0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), vshift));
        let e1 = exp512(_mm512_sub_ps(_mm512_loadu_ps(p.add(i + 16)), vshift));
        _mm512_storeu_ps(p.add(i), e0);
        _mm512_storeu_ps(p.add(i + 16), e1);
        acc0 = _mm512_add_ps(acc0, e0);
        acc1 = _mm512_add_ps(acc1, e1);
        i += 32;
    }
    while i < n {
        let mask = ((1u32 << (n - i).min(16)) - 1) as u16;
        let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, p.add(i)), vshift));
        _mm512_mask_storeu_ps(p.add(i), mask, e);
        acc0 = _mm512_mask_add_ps(acc0, mask, acc0, e);
        i += 16;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

/// [`exp256`] on sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn exp512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let xc = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
        _mm512_set1_ps(EXP_HI),
    );
    let fx =
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_fmadd_ps(
            xc,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(0.5),
        ));
    let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C1), xc);
    let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C2), r);
    let mut y = _mm512_set1_ps(EXP_P[0]);
    for c in &EXP_P[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(*c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, r),
        _mm512_set1_ps(1.0),
    );
    // As in `exp256`: at the lower clamp the exponent bits are 0, the result exactly 0.
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(fx),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(y, _mm512_castsi512_ps(e))
}

/// The AVX2 version of [`exp_shift_sum_f32`], written with intrinsics: LLVM does not
/// vectorise the scalar polynomial (its saturating float-to-int cast and selects).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shift_sum_avx2(row: &mut [f32], shift: f32) -> f32 {
    use std::arch::x86_64::*;
    let n = row.len();
    let p = row.as_mut_ptr();
    let vshift = _mm256_set1_ps(shift);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vshift));
        _mm256_storeu_ps(p.add(i), e);
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    let mut sum: f32 = lanes.iter().sum();
    while i < n {
        let e = exp_f32(*p.add(i) - shift);
        *p.add(i) = e;
        sum += e;
        i += 1;
    }
    sum
}

/// [`exp_f32`] on eight lanes (the same constants, with fused multiply-adds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp256(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let xc = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
        _mm256_set1_ps(EXP_HI),
    );
    let fx = _mm256_floor_ps(_mm256_fmadd_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C1), xc);
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C2), r);
    let mut y = _mm256_set1_ps(EXP_P[0]);
    for c in &EXP_P[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, r),
        _mm256_set1_ps(1.0),
    );
    // At the lower clamp fx = -127: exponent bits 0, so 2^fx and the result are exactly 0
    // (no compare and mask for -inf).
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(e))
}

const EXP_HI: f32 = 88.376_26;
/// `-127.5·ln 2` rounded toward 0: the clamp where `fx = -127` (an exact 0 result).
const EXP_LO: f32 = -88.376_2;
/// ln 2 split in two (Cody–Waite): `C1 + (-C2)`; `C1` has few mantissa bits, so `fx·C1` is exact.
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial, highest degree first.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_f32(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_f32(a, b)
}

/// One panel of a transposed pack (see `super::panels`): `panel[p·16 + t] = src[t][p]` for
/// `t < src.len()` (≤ 16) and `p < cols`; other elements untouched.
pub(crate) fn transpose_panel(src: &[&[f32]], cols: usize, panel: &mut [f32]) {
    assert!(src.len() <= 16 && panel.len() >= cols * 16 && src.iter().all(|r| r.len() >= cols));
    #[cfg(target_arch = "x86_64")]
    if avx2() && src.len() == 16 {
        // SAFETY: as above; the lengths were checked.
        unsafe { transpose_panel_avx2(src, cols, panel) };
        return;
    }
    transpose_panel_scalar(src, 0, cols, panel);
}

/// Columns `from..cols` of [`transpose_panel`], one element at a time.
pub(crate) fn transpose_panel_scalar<T: Copy>(
    src: &[&[T]],
    from: usize,
    cols: usize,
    panel: &mut [T],
) {
    for p in from..cols {
        for (o, row) in panel[p * 16..p * 16 + src.len()].iter_mut().zip(src) {
            *o = row[p];
        }
    }
}

/// [`transpose_panel`] for 16 rows: 8 × 8 blocks transposed in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_panel_avx2(src: &[&[f32]], cols: usize, panel: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = cols / 8 * 8;
    let out = panel.as_mut_ptr();
    for half in 0..2 {
        let rows = &src[half * 8..half * 8 + 8];
        for p0 in (0..full).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(rows[i].as_ptr().add(p0)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let c = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (q, c) in c.into_iter().enumerate() {
                _mm256_storeu_ps(out.add((p0 + q) * 16 + half * 8), c);
            }
        }
    }
    transpose_panel_scalar(src, full, cols, panel);
}

/// Lanes of the manual reductions: float sums are not reassociated by the compiler, so eight
/// independent accumulators make the loops vectorise.
const LANES: usize = 8;

#[inline(always)]
fn row_max_f32(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] = if c[k] > acc[k] { c[k] } else { acc[k] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(tail) {
        m = if x > m { x } else { m };
    }
    m
}

#[inline(always)]
fn exp_shift_sum_f32(row: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            let e = exp_f32(c[k] - shift);
            c[k] = e;
            acc[k] += e;
        }
    }
    let mut sum = 0f32;
    for x in chunks.into_remainder() {
        *x = exp_f32(*x - shift);
        sum += *x;
    }
    acc.iter().sum::<f32>() + sum
}

/// `dst[j] = a·src[j]`, or `dst[j] += a·src[j]` when `add`, for any element type (f64 uses it
/// as it is, f32 compiled per instruction set). No fused multiply-add in the sum (`x + a·p`
/// rounds twice), so every instruction set gives the same bits.
#[inline(always)]
pub(crate) fn scale_row_scalar<T>(dst: &mut [T], src: &[T], a: T, add: bool)
where
    T: Copy + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    let pairs = dst.iter_mut().zip(src);
    if add {
        pairs.for_each(|(x, p)| *x += a * *p);
    } else {
        pairs.for_each(|(x, p)| *x = a * *p);
    }
}

#[inline(always)]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, |y| y)
}

/// `Σ a[j]·f(b[j])` over the shorter length, in [`LANES`] partial sums so that LLVM
/// vectorises it (the f32 dot product; the bf16 one of a weight rounded as it is read).
#[inline(always)]
pub(crate) fn dot_lanes<B: Copy>(a: &[f32], b: &[B], f: impl Fn(B) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..LANES {
            acc[k] += x[k] * f(y[k]);
        }
    }
    acc.iter().sum::<f32>() + ta.iter().zip(tb).map(|(x, y)| x * f(*y)).sum::<f32>()
}

/// `exp(x)` for f32 to about 1 ulp (Cephes' `expf`: range reduction by ln 2, degree-5
/// polynomial, exponent bits), branch-free so that it vectorises; exactly 0 below about
/// -87.7 (`2^-126.5`; so `exp(-inf) = 0`), subnormal just above it, and exactly 1 at 0.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let xc = if x > EXP_HI { EXP_HI } else { x };
    let xc = if xc < EXP_LO { EXP_LO } else { xc };
    let fx = (xc * std::f32::consts::LOG2_E + 0.5).floor();
    let r = xc - fx * EXP_C1 - fx * EXP_C2;
    // Plain products and sums, not `mul_add`: without FMA that is a slow library call.
    let mut y = EXP_P[0];
    for c in &EXP_P[1..] {
        y = y * r + c;
    }
    let y = y * r * r + r + 1.0;
    // At the lower clamp fx = -127: 2^fx has exponent bits 0, exactly 0.
    let pow2 = f32::from_bits(((fx as i32 + 127) as u32) << 23);
    y * pow2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_matches_std_to_two_ulp() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_f32(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        // Exactly 0 far below (masked scores are -inf), positive near the normal range's end.
        for x in [f32::NEG_INFINITY, -1e30, -100.0, -88.0] {
            assert_eq!(exp_f32(x), 0.0, "exp({x})");
        }
        assert!(exp_f32(-87.3) > 0.0 && exp_f32(0.0) == 1.0);
        let mut row = [
            f32::NEG_INFINITY,
            -100.0,
            -88.0,
            -87.3,
            0.0,
            -1.0,
            -2.0,
            -3.0,
            -4.0,
        ];
        exp_shift_sum(&mut row, 0.0);
        assert_eq!(&row[..3], &[0.0; 3]);
        assert!(row[3] > 0.0 && row[4] == 1.0);
        // The row version (AVX2 where available) against std, tails included.
        let xs: Vec<f32> = (0..1003).map(|i| -80.0 + i as f32 * 0.161).collect();
        let mut ys = xs.clone();
        let sum = exp_shift_sum(&mut ys, 1.5);
        for (x, y) in xs.iter().zip(&ys) {
            let want = (x - 1.5).exp();
            assert!(
                ((y - want) / want).abs() < 2.5e-7,
                "exp({x} - 1.5): {y} vs {want}"
            );
        }
        let want: f64 = xs.iter().map(|x| (f64::from(*x) - 1.5).exp()).sum();
        assert!((f64::from(sum) - want).abs() < 1e-5 * want);
        let mut masked = vec![f32::NEG_INFINITY; 11];
        assert_eq!(exp_shift_sum(&mut masked, 0.0), 0.0);
        assert!(masked.iter().all(|x| *x == 0.0));
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
    }

    /// Each instruction set's `exp` row the CPU has (the public entry takes only the best)
    /// against std: tails of every length, exact zeros for `-inf`, the sum.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_exp_row_matches_std() {
        type Row = unsafe fn(&mut [f32], f32) -> f32;
        let mut rows: Vec<(&str, Row)> = vec![("scalar", |r, s| exp_shift_sum_f32(r, s))];
        if avx2() {
            rows.push(("avx2", exp_shift_sum_avx2));
        }
        if avx512() {
            rows.push(("avx512", exp_shift_sum_avx512));
        }
        for (name, f) in rows {
            for n in [0, 1, 7, 15, 16, 17, 40] {
                let xs: Vec<f32> = (0..n)
                    .map(|i| match i % 5 {
                        4 => f32::NEG_INFINITY,
                        _ => -20.0 + i as f32 * 0.731,
                    })
                    .collect();
                let mut ys = xs.clone();
                // SAFETY: the CPU has the instruction set (checked above).
                let sum = unsafe { f(&mut ys, 0.5) };
                for (x, y) in xs.iter().zip(&ys) {
                    let want = (x - 0.5).exp();
                    assert!(
                        *y == want || ((y - want) / want).abs() < 2.5e-7,
                        "{name} n={n}: exp({x} - 0.5) = {y}, want {want}"
                    );
                }
                let want: f64 = xs.iter().map(|x| (f64::from(*x) - 0.5).exp()).sum();
                assert!(
                    (f64::from(sum) - want).abs() <= 1e-6 * want,
                    "{name} n={n}: sum"
                );
            }
        }
    }

    #[test]
    fn row_helpers_match_scalar_code() {
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 101) as f32 / 13.0 - 3.0)
            .collect();
        assert_eq!(row_max(&row), row.iter().cloned().fold(f32::MIN, f32::max));
        let mut e = row.clone();
        let sum = exp_shift_sum(&mut e, 2.0);
        let want: f32 = row.iter().map(|x| (x - 2.0).exp()).sum();
        assert!((sum - want).abs() < 1e-5 * want);
        let d = dot(&row, &e);
        let dw: f32 = row.iter().zip(&e).map(|(a, b)| a * b).sum();
        assert!((d - dw).abs() < 1e-4 * dw.abs().max(1.0));
        assert_eq!(row_max(&[f32::NEG_INFINITY; 9]), f32::NEG_INFINITY);
        for add in [false, true] {
            let mut got = e.clone();
            scale_row(&mut got[..35], &row, 0.37, add);
            for (j, (g, (x, p))) in got.iter().zip(e.iter().zip(&row)).enumerate() {
                let want = match (j < 35, add) {
                    (false, _) => *x,
                    (true, true) => *x + 0.37 * *p,
                    (true, false) => 0.37 * *p,
                };
                assert_eq!(g.to_bits(), want.to_bits(), "add {add}, element {j}");
            }
        }
    }
}
