//! The vector types of the register-tile products: for each element type ([`Lanes`]: f32,
//! f64) its vector and register-tile operations ([`Vector`]) with AVX2 + FMA and with AVX-512,
//! the masked loads and stores of a partial vector included.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The element types with register-tile products: their vector types for each instruction set.
pub(crate) trait Lanes: Copy {
    #[cfg(target_arch = "x86_64")]
    type Avx2: Vector<Self>;
    #[cfg(target_arch = "x86_64")]
    type Avx512: Vector<Self>;
}

impl Lanes for f32 {
    #[cfg(target_arch = "x86_64")]
    type Avx2 = Avx2;
    #[cfg(target_arch = "x86_64")]
    type Avx512 = Avx512;
}

impl Lanes for f64 {
    #[cfg(target_arch = "x86_64")]
    type Avx2 = Avx2;
    #[cfg(target_arch = "x86_64")]
    type Avx512 = Avx512;
}

/// The AVX2 + FMA register tiles (16 registers of 256 bits).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2;
/// The AVX-512 register tiles (32 registers of 512 bits).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx512;

/// One instruction set's vector of `T` and the operations of a register tile.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Vector<T> {
    /// Elements per vector; a register tile is two vectors wide.
    const W: usize;
    /// Rows of a register tile (its `2·MR` accumulators, two rows of the right operand and a
    /// broadcast fit in the registers).
    const MR: usize;
    type V: Copy;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: T) -> Self::V;
    unsafe fn broadcast(p: *const T) -> Self::V;
    /// Loads lanes `0..count` (all when `count ≥ W`), zero elsewhere.
    unsafe fn load(p: *const T, count: usize) -> Self::V;
    /// Stores lanes `0..count`.
    unsafe fn store(p: *mut T, v: Self::V, count: usize);
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
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

/// The four impls of [`Vector`]: the same operations, other intrinsics and lane counts; the
/// masked load and store (of lanes `0..n`, `n < W`) written out per type.
macro_rules! vector {
    ($isa:ty, $t:ty, $w:literal, $mr:literal, $v:ty, $zero:ident, $splat:ident,
     $load:ident, |$lp:ident, $ln:ident| $mload:expr, $store:ident,
     |$sp:ident, $sv:ident, $sn:ident| $mstore:expr, $fmadd:ident, $mul:ident, $add:ident) => {
        #[cfg(target_arch = "x86_64")]
        impl Vector<$t> for $isa {
            const W: usize = $w;
            const MR: usize = $mr;
            type V = $v;
            #[inline(always)]
            unsafe fn zero() -> $v {
                $zero()
            }
            #[inline(always)]
            unsafe fn splat(x: $t) -> $v {
                $splat(x)
            }
            #[inline(always)]
            unsafe fn broadcast(p: *const $t) -> $v {
                $splat(*p)
            }
            #[inline(always)]
            unsafe fn load($lp: *const $t, $ln: usize) -> $v {
                match $ln >= $w {
                    true => $load($lp),
                    false => $mload,
                }
            }
            #[inline(always)]
            unsafe fn store($sp: *mut $t, $sv: $v, $sn: usize) {
                match $sn >= $w {
                    true => $store($sp, $sv),
                    false => $mstore,
                }
            }
            #[inline(always)]
            unsafe fn fmadd(a: $v, b: $v, c: $v) -> $v {
                $fmadd(a, b, c)
            }
            #[inline(always)]
            unsafe fn mul(a: $v, b: $v) -> $v {
                $mul(a, b)
            }
            #[inline(always)]
            unsafe fn add(a: $v, b: $v) -> $v {
                $add(a, b)
            }
        }
    };
}

vector!(
    Avx2,
    f32,
    8,
    6,
    __m256,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_loadu_ps,
    |p, n| _mm256_maskload_ps(p, mask32(n)),
    _mm256_storeu_ps,
    |p, v, n| _mm256_maskstore_ps(p, mask32(n), v),
    _mm256_fmadd_ps,
    _mm256_mul_ps,
    _mm256_add_ps
);
vector!(
    Avx2,
    f64,
    4,
    6,
    __m256d,
    _mm256_setzero_pd,
    _mm256_set1_pd,
    _mm256_loadu_pd,
    |p, n| _mm256_maskload_pd(p, mask64(n)),
    _mm256_storeu_pd,
    |p, v, n| _mm256_maskstore_pd(p, mask64(n), v),
    _mm256_fmadd_pd,
    _mm256_mul_pd,
    _mm256_add_pd
);
vector!(
    Avx512,
    f32,
    16,
    12,
    __m512,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    |p, n| _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, p),
    _mm512_storeu_ps,
    |p, v, n| _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as u16, v),
    _mm512_fmadd_ps,
    _mm512_mul_ps,
    _mm512_add_ps
);
vector!(
    Avx512,
    f64,
    8,
    12,
    __m512d,
    _mm512_setzero_pd,
    _mm512_set1_pd,
    _mm512_loadu_pd,
    |p, n| _mm512_maskz_loadu_pd(((1u32 << n) - 1) as u8, p),
    _mm512_storeu_pd,
    |p, v, n| _mm512_mask_storeu_pd(p, ((1u32 << n) - 1) as u8, v),
    _mm512_fmadd_pd,
    _mm512_mul_pd,
    _mm512_add_pd
);
