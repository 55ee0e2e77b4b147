//! The bf16 products of [`gemm_from`](super::gemm_from) under [`crate::autocast`]: both
//! operands rounded to bf16 (round to nearest even), products summed in f32, the output f32.
//! With the `mkl` feature MKL's `cblas_gemm_bf16bf16f32` (AMX tiles or AVX-512 BF16 where the
//! CPU has them); without it the rounded operands are widened back and multiplied by the f32
//! product, which gives the same numbers up to the order of the sums at f32's speed.
//!
//! A scope keeps the bf16 copy of each weight it has rounded (PyTorch's autocast cache): the
//! weights are the variables the ops name with [`keep`], held for the scope so that their
//! memory cannot become another tensor's while their copy is in use.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use candle::{CpuStorage, DType, Storage, Tensor};

use super::dot_bf16::{dot_pairs, dot_rounded, pair_order};
use super::gemm_bf16::Bf16Operand;
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
    static WEIGHTS: RefCell<Option<Weights>> = const { RefCell::new(None) };
}

/// The weights of the outermost bf16 scope and the bf16 copies made of them.
#[derive(Default)]
struct Weights {
    /// Each kept weight by the address of its f32 storage: (end address, the tensor, held so
    /// that its storage is neither freed nor reused while the scope lasts).
    kept: BTreeMap<usize, (usize, Tensor)>,
    /// The bf16 copies by (address, stored rows, row length, row stride) of what they copy.
    copies: HashMap<[usize; 4], Rc<Vec<u16>>>,
}

/// Keeps `ws` as weights of this thread's bf16 scope, whose bf16 copies are made once and
/// reused for the scope's other products (forward and backward): only variables (PyTorch:
/// leaf tensors that require grad) in f32 on the CPU; outside a bf16 scope nothing.
pub(crate) fn keep(ws: &[&Tensor]) {
    if precision() != Precision::Bf16 {
        return;
    }
    WEIGHTS.with(|cell| {
        let mut cell = cell.borrow_mut();
        let Some(weights) = cell.as_mut() else {
            return;
        };
        for w in ws {
            if !w.is_variable() || w.dtype() != DType::F32 {
                continue;
            }
            let (storage, _) = w.storage_and_layout();
            if let Storage::Cpu(CpuStorage::F32(v)) = &*storage {
                let start = v.as_ptr() as usize;
                let end = start + std::mem::size_of_val(v.as_slice());
                drop(storage);
                weights
                    .kept
                    .entry(start)
                    .or_insert_with(|| (end, (*w).clone()));
            }
        }
    })
}

/// How many weights this thread's bf16 scope keeps (tests).
#[cfg(test)]
pub(crate) fn kept_weights() -> usize {
    WEIGHTS.with(|c| c.borrow().as_ref().map_or(0, |w| w.kept.len()))
}

/// The stored rows of a `rows × cols` operand: (transposed, count, length, stride between
/// them, stride within one), each stored row read contiguously where the inner stride is 1.
fn stored_rows<S>(
    (_, rs, cs): Operand<S>,
    rows: usize,
    cols: usize,
) -> (bool, usize, usize, usize, usize) {
    match cs != 1 && rs == 1 {
        true => (true, cols, rows, cs, 1),
        false => (false, rows, cols, rs, cs),
    }
}

/// The bf16 copy of `op` (`rows × cols`) when it lies in a weight of this thread's scope (made
/// on first use), as a [`Packed`] whose rows are the weight's stored rows.
///
/// # Safety
/// As [`pack`].
unsafe fn weight_copy(op: Operand<f32>, rows: usize, cols: usize) -> Option<Packed<u16>> {
    let (transposed, n_rows, len, outer, inner) = stored_rows(op, rows, cols);
    if inner != 1 || n_rows == 0 || len == 0 {
        return None;
    }
    let first = op.0 as usize;
    let last = first + ((n_rows - 1) * outer + len) * std::mem::size_of::<f32>();
    WEIGHTS.with(|cell| {
        let mut cell = cell.borrow_mut();
        let weights = cell.as_mut()?;
        let (_, (end, _)) = weights.kept.range(..=first).next_back()?;
        if last > *end {
            return None;
        }
        let data = weights
            .copies
            .entry([first, n_rows, len, outer])
            // SAFETY: the caller's.
            .or_insert_with(|| unsafe { pack(op, rows, cols, round) }.data)
            .clone();
        Some(Packed {
            data,
            transposed,
            ld: len,
        })
    })
}

/// This thread's product precision.
pub(crate) fn precision() -> Precision {
    PRECISION.with(Cell::get)
}

/// Runs `f` with this thread's product precision set to `p`, restoring the previous one after
/// (also when `f` panics).
pub(crate) fn with_precision<R>(p: Precision, f: impl FnOnce() -> R) -> R {
    // The previous precision, and whether this scope made the thread's weight copies (the
    // outermost bf16 scope: they are dropped with it).
    struct Restore(Precision, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRECISION.with(|c| c.set(self.0));
            if self.1 {
                WEIGHTS.with(|c| c.borrow_mut().take());
            }
        }
    }
    let owns = p == Precision::Bf16
        && WEIGHTS.with(|c| {
            let mut c = c.borrow_mut();
            let outermost = c.is_none();
            if outermost {
                *c = Some(Weights::default());
            }
            outermost
        });
    let _restore = Restore(PRECISION.with(|c| c.replace(p)), owns);
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
    pub data: Rc<Vec<E>>,
    pub transposed: bool,
    /// Elements per stored row: `cols`, or `rows` when transposed.
    pub ld: usize,
}

impl<E> Packed<E> {
    /// The packed matrix as an operand (`rows × cols` at its strides).
    pub(crate) fn operand(&self) -> Operand<E> {
        match self.transposed {
            true => (self.data.as_ptr(), 1, self.ld),
            false => (self.data.as_ptr(), self.ld, 1),
        }
    }
}

/// Rounds `op` (`rows × cols` at its strides) into a [`Packed`] of `E` (`u16`: bf16 bits;
/// `f32`: the rounded values widened back), on all threads when large.
///
/// # Safety
/// Every element the strides address is in bounds.
pub(crate) unsafe fn pack<S: Copy, E: Copy + Send + Default>(
    (ptr, rs, cs): Operand<S>,
    rows: usize,
    cols: usize,
    convert: impl Fn(S) -> E + Sync + Send,
) -> Packed<E> {
    let (transposed, n_rows, len, outer, inner) = stored_rows((ptr, rs, cs), rows, cols);
    let mut data = vec![E::default(); n_rows * len];
    struct Src<S>(*const S);
    // SAFETY: only read, by disjoint rows of the output.
    unsafe impl<S> Sync for Src<S> {}
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
        data: Rc::new(data),
        transposed,
        ld: len,
    }
}

/// Whether the CPU has AMX-BF16 tiles (CPUID leaf 7, EDX bit 22; std's detection of it is
/// not stable).
#[cfg(feature = "mkl")]
fn amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // Leaf 7 is read only where leaf 0 lists it.
        *AMX.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            __cpuid(0).eax >= 7 && (__cpuid_count(7, 0).edx >> 22) & 1 == 1
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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
    // A few rows against a weight read by rows (decoding): dot products of the rounded rows
    // with the weight's bf16 copy (half the bytes of its f32 rows), or with its f32 rows
    // rounded as they are read.
    if m <= super::gemm::DOT_ROWS && lhs.2 == 1 && rhs.1 == 1 && dst.2 == 1 {
        let mut x = vec![0f32; m * k];
        for (i, row) in x.chunks_mut(k).enumerate() {
            for (p, v) in row.iter_mut().enumerate() {
                // SAFETY: row i of lhs holds k elements (the caller).
                *v = widen(round(unsafe { *lhs.0.add(i * lhs.1 + p) }));
            }
        }
        let all = super::par::parallel_pass(n * k);
        match weight_copy(rhs, k, n) {
            Some(w) => {
                let mut paired = vec![0f32; m * k];
                for (row, out) in x.chunks(k).zip(paired.chunks_mut(k)) {
                    pair_order(row, out);
                }
                let (x, w) = ((paired.as_ptr(), k, 1), (w.data.as_ptr(), w.ld));
                super::gemm::dots((m, n, k), dst, accumulate, x, w, alpha, all, dot_pairs)
            }
            None => {
                let (x, w) = ((x.as_ptr(), k, 1), (rhs.0, rhs.2));
                super::gemm::dots((m, n, k), dst, accumulate, x, w, alpha, all, dot_rounded)
            }
        }
        return;
    }
    // MKL's where it runs on AMX tiles, or where our AVX-512 BF16 kernel cannot run (on AMD
    // CPUs MKL's bf16 product is slower than f32).
    #[cfg(feature = "mkl")]
    if amx_bf16() || !super::gemm_bf16::available() {
        let a = weight_copy(lhs, m, k).unwrap_or_else(|| pack(lhs, m, k, round));
        let b = weight_copy(rhs, k, n).unwrap_or_else(|| pack(rhs, k, n, round));
        let parts = if all { super::gemm::num_threads() } else { 1 };
        if super::mkl::gemm_bf16((m, n, k), dst, accumulate, [&a, &b], alpha, parts) {
            return;
        }
    }
    // AVX-512 BF16's products, from the weights' copies or rounding as they pack.
    if super::gemm_bf16::available() && dst.2 == 1 {
        let operand = |op: Operand<f32>, rows, cols| match weight_copy(op, rows, cols) {
            Some(copy) => Bf16Operand::Copy(copy),
            None => Bf16Operand::F32(op),
        };
        let (a, b) = (operand(lhs, m, k), operand(rhs, k, n));
        super::gemm_bf16::gemm((m, n, k), dst, accumulate, [&a, &b], alpha, all);
        return;
    }
    // A weight's bf16 copy widened (each weight is rounded once per scope on every path).
    let widened = |op: Operand<f32>, rows, cols| match weight_copy(op, rows, cols) {
        Some(copy) => pack(copy.operand(), rows, cols, widen),
        None => pack(op, rows, cols, |x| widen(round(x))),
    };
    let (a, b) = (widened(lhs, m, k), widened(rhs, k, n));
    super::gemm::product(
        (m, n, k),
        dst,
        accumulate,
        a.operand(),
        b.operand(),
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

    /// A bf16 scope keeps variables in f32 (once each), not other tensors, nor anything outside
    /// a bf16 scope; a nested scope shares the outermost one's weights, which go with it.
    #[test]
    fn a_scope_keeps_its_variables_until_it_ends() {
        use candle::{Device, Var};
        let var = Var::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
        let var64 = Var::zeros((4, 3), DType::F64, &Device::Cpu).unwrap();
        let plain = Tensor::zeros((4, 3), DType::F32, &Device::Cpu).unwrap();
        keep(&[var.as_tensor()]);
        assert_eq!(kept_weights(), 0);
        with_precision(Precision::Bf16, || {
            keep(&[var.as_tensor(), var64.as_tensor(), &plain, var.as_tensor()]);
            assert_eq!(kept_weights(), 1);
            with_precision(Precision::Bf16, || {
                keep(&[var.as_tensor()]);
                assert_eq!(kept_weights(), 1);
            });
            with_precision(Precision::F32, || assert_eq!(kept_weights(), 1));
            assert_eq!(kept_weights(), 1);
        });
        assert_eq!(kept_weights(), 0);
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
