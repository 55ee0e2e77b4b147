//! The bf16 products of [`gemm_from`](super::gemm_from) under [`crate::autocast`]: both
//! operands rounded to bf16 (round to nearest even), products summed in f32, the output f32.
//! With the `mkl` feature MKL's `cblas_gemm_bf16bf16f32` (AMX tiles or AVX-512 BF16 where the
//! CPU has them); without it the rounded operands are widened back and multiplied by the f32
//! product, which gives the same numbers up to the order of the sums at f32's speed.

use std::cell::Cell;

use super::Operand;

/// The precision of the large f32 products on this thread (see [`crate::autocast`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 operands, f32 sums (PyTorch outside `autocast`).
    #[default]
    F32,
    /// bf16 operands, f32 sums, f32 output.
    Bf16,
}

thread_local! {
    static PRECISION: Cell<Precision> = const { Cell::new(Precision::F32) };
    static BF16_PRODUCTS: Cell<u64> = const { Cell::new(0) };
}

/// This thread's product precision.
pub(crate) fn precision() -> Precision {
    PRECISION.with(Cell::get)
}

/// Runs `f` with this thread's product precision set to `p`, restoring the previous one after
/// (also when `f` panics).
pub(crate) fn with_precision<R>(p: Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(Precision);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRECISION.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(PRECISION.with(|c| c.replace(p)));
    f()
}

/// How many products this thread has run in bf16 (tests: that a model's products took the
/// path).
pub(crate) fn bf16_products() -> u64 {
    BF16_PRODUCTS.with(Cell::get)
}

/// f32 → bf16 bits, round to nearest even; a NaN stays a (quiet) NaN.
#[inline]
pub(crate) fn round(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let rounding = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(rounding) >> 16) as u16
}

/// bf16 bits → f32 (exact).
#[inline]
pub(crate) fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// A `rows × cols` operand rounded to bf16 into a dense buffer: row-major as it is
/// (`transposed == false`) or, for an operand stored by columns (`rs == 1`), its transpose
/// row-major (`transposed == true`), so that each source row is read contiguously.
pub(crate) struct Packed<E> {
    pub data: Vec<E>,
    pub transposed: bool,
    /// Elements per stored row: `cols`, or `rows` when transposed.
    pub ld: usize,
}

/// Rounds `op` (`rows × cols` at its strides) into a [`Packed`] of `E` (`u16`: bf16 bits;
/// `f32`: the rounded values widened back), on all threads when large.
///
/// # Safety
/// Every element the strides address is in bounds.
pub(crate) unsafe fn pack<E: Copy + Send + Default>(
    (ptr, rs, cs): Operand<f32>,
    rows: usize,
    cols: usize,
    convert: fn(f32) -> E,
) -> Packed<E> {
    // Stored rows: (count, length, stride between them, stride within one).
    let transposed = cs != 1 && rs == 1;
    let (n_rows, len, outer, inner) = match transposed {
        true => (cols, rows, cs, 1),
        false => (rows, cols, rs, cs),
    };
    let mut data = vec![E::default(); n_rows * len];
    struct Src(*const f32);
    // SAFETY: only read, by disjoint rows of the output.
    unsafe impl Sync for Src {}
    let src = Src(ptr);
    let src = &src;
    let rows_per_task = (1 << 16) / len.max(1) + 1;
    super::par::for_each_chunk_mut(
        &mut data,
        rows_per_task * len.max(1),
        super::par::parallel_pass(n_rows * len),
        |t, chunk| {
            for (r, out) in chunk.chunks_mut(len.max(1)).enumerate() {
                let row = t * rows_per_task + r;
                for (j, o) in out.iter_mut().enumerate() {
                    // SAFETY: (row, j) addresses an element of the operand (the caller).
                    *o = convert(unsafe { *src.0.add(row * outer + j * inner) });
                }
            }
        },
    );
    Packed {
        data,
        transposed,
        ld: len,
    }
}

/// `dst = [dst +] alpha · bf16(lhs) · bf16(rhs)`, f32 sums, on all threads when `all`: one of
/// the products [`gemm_from`](super::gemm_from) runs with [`Threads::All`](super::Threads).
///
/// # Safety
/// As [`gemm`](super::gemm).
pub(crate) unsafe fn gemm(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, usize, usize),
    accumulate: bool,
    lhs: Operand<f32>,
    rhs: Operand<f32>,
    alpha: f32,
    all: bool,
) {
    BF16_PRODUCTS.with(|c| c.set(c.get() + 1));
    #[cfg(feature = "mkl")]
    {
        let a = pack(lhs, m, k, round);
        let b = pack(rhs, k, n, round);
        let parts = if all { super::gemm::num_threads() } else { 1 };
        if super::mkl::gemm_bf16((m, n, k), dst, accumulate, [&a, &b], alpha, parts) {
            return;
        }
    }
    let a = pack(lhs, m, k, |x| widen(round(x)));
    let b = pack(rhs, k, n, |x| widen(round(x)));
    let op = |p: &Packed<f32>| -> Operand<f32> {
        match p.transposed {
            true => (p.data.as_ptr(), 1, p.ld),
            false => (p.data.as_ptr(), p.ld, 1),
        }
    };
    super::gemm::product(
        (m, n, k),
        dst,
        accumulate,
        op(&a),
        op(&b),
        alpha,
        super::Threads::All,
        all,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rounding against candle's own f32 → bf16 cast (the `half` crate's), on values
    /// that sit exactly between two bf16 numbers, either side of them, NaN, infinities and
    /// subnormals.
    #[test]
    fn rounds_as_candle_casts() {
        use candle::{DType, Device, Tensor};
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            -3.0e-39,
            f32::from_bits(0x3f80_8000), // halfway, even below: down
            f32::from_bits(0x3f81_8000), // halfway, odd below: up
            f32::from_bits(0x3f80_8001),
            f32::from_bits(0x3f80_7fff),
        ];
        xs.extend((0..2000).map(|i| ((i as f32) * 0.7301).sin() * 10f32.powi(i % 9 - 4)));
        let t = Tensor::new(xs.as_slice(), &Device::Cpu).unwrap();
        let want: Vec<f32> = t
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1()
            .unwrap();
        for (x, w) in xs.iter().zip(&want) {
            let got = widen(round(*x));
            assert_eq!(
                got.to_bits(),
                w.to_bits(),
                "bf16({x:e}): {got:e}, want {w:e}"
            );
        }
        assert!(widen(round(f32::NAN)).is_nan());
    }

    /// The scope sets the precision and restores the previous one, nested and after a panic.
    #[test]
    fn the_scope_restores_the_previous_precision() {
        assert_eq!(precision(), Precision::F32);
        with_precision(Precision::Bf16, || {
            assert_eq!(precision(), Precision::Bf16);
            with_precision(Precision::F32, || assert_eq!(precision(), Precision::F32));
            assert_eq!(precision(), Precision::Bf16);
        });
        assert_eq!(precision(), Precision::F32);
        let caught = std::panic::catch_unwind(|| {
            with_precision(Precision::Bf16, || panic!("inside"));
        });
        assert!(caught.is_err());
        assert_eq!(precision(), Precision::F32);
    }
}
