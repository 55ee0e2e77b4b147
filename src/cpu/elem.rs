//! The one element trait of the CPU kernels: f32 (speed: SIMD rows) and f64 (precision: the
//! standard library's math).

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Sub};

use candle::WithDType;

use super::gelu::GeluApproximate;
use super::lanes::Lanes;
use super::workspace::{AnyBuf, Pool};
use super::{gelu, gelu_tanh, silu, simd};

/// An element type the CPU kernels run in (f32, f64): arithmetic, the scalar functions they
/// need, the row primitives the attention, GELU, cross-entropy and optimizer loops share, and
/// the register-tile product's vector operations ([`Lanes`]).
pub(crate) trait Elem:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
    + MulAssign
    + Lanes
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    const INF: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    /// The largest element (`-inf` for an empty or fully `-inf` row).
    fn row_max(row: &[Self]) -> Self;
    /// `row[j] = exp(row[j] - shift)` (0 where `row[j] = -inf`), returning the sum.
    fn exp_shift_sum(row: &mut [Self], shift: Self) -> Self;
    /// `Σ a[j]·b[j]`.
    fn dot(a: &[Self], b: &[Self]) -> Self;
    /// `dst[j] = a·src[j]`, or `dst[j] += a·src[j]` when `add` (the shorter length).
    fn scale_row(dst: &mut [Self], src: &[Self], a: Self, add: bool) {
        simd::scale_row_scalar(dst, src, a, add)
    }
    /// One panel of a transposed pack: `panel[p·16 + t] = src[t][p]` for `t < src.len()`
    /// (≤ 16) and `p < cols` (see `super::panels`).
    fn transpose_panel(src: &[&[Self]], cols: usize, panel: &mut [Self]) {
        simd::transpose_panel_scalar(src, 0, cols, panel)
    }
    /// `y = gelu(x)` (exact: `x·Φ(x)`; or its tanh approximation).
    fn gelu_row(x: &[Self], y: &mut [Self], approximate: GeluApproximate);
    /// `dx = g·gelu'(x)` (exact: `g·(Φ(x) + x·φ(x))`).
    fn gelu_grad_row(x: &[Self], g: &[Self], dx: &mut [Self], approximate: GeluApproximate);
    /// `y = silu(g)·u`.
    fn silu_mul_row(g: &[Self], u: &[Self], y: &mut [Self]);
    /// The gradients of `g` and `u` given the output's `d`.
    fn silu_mul_grad_row(g: &[Self], u: &[Self], d: &[Self], dg: &mut [Self], du: &mut [Self]);
    /// The process's pool of scratch buffers of this dtype.
    fn pool() -> &'static Pool<Self>;
    /// A pooled buffer of either dtype as this dtype, if it is.
    fn of_any(b: &AnyBuf) -> Option<&[Self]>;
}

impl Elem for f64 {
    fn silu_mul_row(g: &[Self], u: &[Self], y: &mut [Self]) {
        silu::forward_row_f64(g, u, y)
    }
    fn silu_mul_grad_row(g: &[Self], u: &[Self], d: &[Self], dg: &mut [Self], du: &mut [Self]) {
        silu::backward_row_f64(g, u, d, dg, du)
    }
    fn pool() -> &'static Pool<Self> {
        static POOL: Pool<f64> = Pool::new();
        &POOL
    }
    fn of_any(b: &AnyBuf) -> Option<&[Self]> {
        match b {
            AnyBuf::F64(b) => Some(b),
            _ => None,
        }
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f64::NEG_INFINITY;
    const INF: Self = f64::INFINITY;
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn row_max(row: &[Self]) -> Self {
        row.iter()
            .fold(f64::NEG_INFINITY, |m, &x| if x > m { x } else { m })
    }
    fn exp_shift_sum(row: &mut [Self], shift: Self) -> Self {
        let mut sum = 0.0;
        for x in row.iter_mut() {
            *x = (*x - shift).exp();
            sum += *x;
        }
        sum
    }
    fn dot(a: &[Self], b: &[Self]) -> Self {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    fn gelu_row(x: &[Self], y: &mut [Self], approximate: GeluApproximate) {
        match approximate {
            GeluApproximate::None => gelu::forward_row_f64(x, y),
            GeluApproximate::Tanh => gelu_tanh::forward_row_f64(x, y),
        }
    }
    fn gelu_grad_row(x: &[Self], g: &[Self], dx: &mut [Self], approximate: GeluApproximate) {
        match approximate {
            GeluApproximate::None => gelu::backward_row_f64(x, g, dx),
            GeluApproximate::Tanh => gelu_tanh::backward_row_f64(x, g, dx),
        }
    }
}

impl Elem for f32 {
    fn silu_mul_row(g: &[Self], u: &[Self], y: &mut [Self]) {
        silu::forward_row_f32(g, u, y)
    }
    fn silu_mul_grad_row(g: &[Self], u: &[Self], d: &[Self], dg: &mut [Self], du: &mut [Self]) {
        silu::backward_row_f32(g, u, d, dg, du)
    }
    fn pool() -> &'static Pool<Self> {
        static POOL: Pool<f32> = Pool::new();
        &POOL
    }
    fn of_any(b: &AnyBuf) -> Option<&[Self]> {
        match b {
            AnyBuf::F32(b) => Some(b),
            _ => None,
        }
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f32::NEG_INFINITY;
    const INF: Self = f32::INFINITY;
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn row_max(row: &[Self]) -> Self {
        simd::row_max(row)
    }
    fn exp_shift_sum(row: &mut [Self], shift: Self) -> Self {
        simd::exp_shift_sum(row, shift)
    }
    fn dot(a: &[Self], b: &[Self]) -> Self {
        simd::dot(a, b)
    }
    fn scale_row(dst: &mut [Self], src: &[Self], a: Self, add: bool) {
        simd::scale_row(dst, src, a, add)
    }
    fn transpose_panel(src: &[&[Self]], cols: usize, panel: &mut [Self]) {
        simd::transpose_panel(src, cols, panel)
    }
    fn gelu_row(x: &[Self], y: &mut [Self], approximate: GeluApproximate) {
        match approximate {
            GeluApproximate::None => gelu::forward_row_f32(x, y),
            GeluApproximate::Tanh => gelu_tanh::forward_row_f32(x, y),
        }
    }
    fn gelu_grad_row(x: &[Self], g: &[Self], dx: &mut [Self], approximate: GeluApproximate) {
        match approximate {
            GeluApproximate::None => gelu::backward_row_f32(x, g, dx),
            GeluApproximate::Tanh => gelu_tanh::backward_row_f32(x, g, dx),
        }
    }
}
