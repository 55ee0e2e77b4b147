//! Right operands packed once in panels of [`PANEL`] columns, and the product that reads them.
//!
//! The `gemm` crate packs its right operand on every call. The attention kernels multiply the
//! same head's keys and values by every query tile (32 times per head at L = 2048 with 64-row
//! tiles), so packing per call repeats the same work for every tile. Packed here once per head,
//! in the layout the unpacked register tiles of `small_gemm` read best: panel `t` holds columns
//! `16t..16t + 16` of every row, 16 contiguous elements per row, so the 16 columns a register
//! tile reads lie in one contiguous block (read by rows with a long stride, a tile's rows fall
//! into a few L1 cache sets and the product runs far slower).

use super::small_gemm::small_gemm;
pub(crate) use super::small_gemm::PANEL;
use crate::cpu::{gemm, Elem, Operand, Threads};

/// A packed right operand: element `(p, j)` at `data[(j / 16)·ps + p·16 + j % 16]`; the
/// columns past the matrix's width up to the panel's end are zero.
#[derive(Clone, Copy)]
pub(crate) struct Panels<'a, T> {
    pub data: &'a [T],
    /// Panel stride: rows × 16.
    pub ps: usize,
}

impl<'a, T> Panels<'a, T> {
    /// Panels of a buffer filled by [`pack_rows`] or [`pack_transposed`] for an operand of
    /// `rows` rows.
    pub(crate) fn new(data: &'a [T], rows: usize) -> Self {
        Self {
            data,
            ps: rows * PANEL,
        }
    }
}

/// Elements of the packed `rows × cols` operand (whole panels).
pub(crate) fn panels_len(rows: usize, cols: usize) -> usize {
    cols.div_ceil(PANEL) * rows * PANEL
}

/// Packs the `rows × cols` matrix whose row `r` is `row(r)` (at least `cols` elements) into
/// `dst` ([`panels_len`] elements; every one written).
pub(crate) fn pack_rows<'a, T: Elem>(
    rows: usize,
    cols: usize,
    row: impl Fn(usize) -> &'a [T],
    dst: &mut [T],
) {
    for_each_panel(dst, rows, cols, |t, panel| {
        pack_rows_panel(rows, cols, &row, t, panel)
    });
}

/// Calls `pack(t, panel)` for every panel `t` of `dst`, the packed `depth × width` operand
/// ([`panels_len`] elements, checked).
fn for_each_panel<T>(dst: &mut [T], depth: usize, width: usize, pack: impl Fn(usize, &mut [T])) {
    assert_eq!(dst.len(), panels_len(depth, width), "packed operand length");
    for (t, panel) in dst.chunks_exact_mut((depth * PANEL).max(1)).enumerate() {
        pack(t, panel);
    }
}

/// Panel `t` of [`pack_rows`] into `panel` (`rows·16` elements, every one written: zero past
/// column `cols`). Panels are independent: the threaded product packs them in parallel.
pub(crate) fn pack_rows_panel<'a, T: Elem>(
    rows: usize,
    cols: usize,
    row: impl Fn(usize) -> &'a [T],
    t: usize,
    panel: &mut [T],
) {
    let j0 = t * PANEL;
    let width = PANEL.min(cols - j0);
    let rows_out = panel.chunks_exact_mut(PANEL).take(rows).enumerate();
    if width == PANEL {
        // Whole rows as fixed-size arrays: a `copy_from_slice` of a runtime length is a
        // `memcpy` call per 16 elements, whose call overhead rivals the copy itself.
        for (r, out) in rows_out {
            let src: &[T; PANEL] = row(r)[j0..j0 + PANEL].try_into().unwrap();
            let out: &mut [T; PANEL] = out.try_into().unwrap();
            *out = *src;
        }
        return;
    }
    for (r, out) in rows_out {
        out[..width].copy_from_slice(&row(r)[j0..j0 + width]);
        out[width..].fill(T::ZERO);
    }
}

/// Packs the transpose of the `rows × cols` matrix whose row `j` is `row(j)`: a `cols × rows`
/// operand (`(p, j)` = row `j`'s element `p`), as the keys of `q·kᵀ` are read, into `dst`
/// ([`panels_len`]`(cols, rows)` elements; every one written).
pub(crate) fn pack_transposed<'a, T: Elem>(
    rows: usize,
    cols: usize,
    row: impl Fn(usize) -> &'a [T],
    dst: &mut [T],
) {
    for_each_panel(dst, cols, rows, |t, panel| {
        pack_transposed_panel(rows, cols, &row, t, panel)
    });
}

/// Panel `t` of [`pack_transposed`] into `panel` (`cols·16` elements, every one written:
/// zero past source row `rows`): sixteen source rows, written contiguously.
pub(crate) fn pack_transposed_panel<'a, T: Elem>(
    rows: usize,
    cols: usize,
    row: impl Fn(usize) -> &'a [T],
    t: usize,
    panel: &mut [T],
) {
    let j0 = t * PANEL;
    let width = PANEL.min(rows - j0);
    let mut src: [&[T]; PANEL] = [&[]; PANEL];
    for (c, s) in src.iter_mut().enumerate().take(width) {
        *s = &row(j0 + c)[..cols];
    }
    if width < PANEL {
        panel.fill(T::ZERO);
    }
    T::transpose_panel(&src[..width], cols, panel);
}

/// `dst[m×n] = [dst +] alpha · lhs[m×k] · B`, where `B(p, j)` is element `(p0 + p, j0 + j)` of
/// the packed `rhs`, on the calling thread. `dst` is given by pointer and row stride.
///
/// # Safety
/// Every addressed element must be in bounds; `dst` must not overlap the operands.
pub(crate) unsafe fn gemm_panels<T: Elem>(
    (m, n, k): (usize, usize, usize),
    (dst, ld): (*mut T, usize),
    accumulate: bool,
    lhs: Operand<T>,
    (rhs, (p0, j0)): (Panels<T>, (usize, usize)),
    alpha: T,
) {
    if m == 0 || n == 0 {
        return;
    }
    debug_assert!((j0 + n).div_ceil(PANEL) * rhs.ps <= rhs.data.len() || k == 0);
    let b = rhs.data.as_ptr().add(p0 * PANEL);
    if k > 0
        && small_gemm::<T>(
            (m, n, k),
            lhs,
            (b, PANEL, rhs.ps, j0),
            (dst, ld),
            alpha,
            accumulate.into(),
        )
    {
        return;
    }
    // No register-tile product on this CPU (neither AVX-512 nor AVX2): one `gemm` per panel.
    let mut j = 0;
    while j < n {
        let at = j0 + j;
        let cols = (n - j).min(PANEL - at % PANEL);
        gemm(
            (m, cols, k),
            (dst.add(j), ld, 1),
            accumulate,
            lhs,
            (b.add(at / PANEL * rhs.ps + at % PANEL), PANEL, 1),
            alpha,
            Threads::One,
        );
        j += cols;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both packings and the product against a plain loop, in f32 and f64 (register tiles
    /// where the CPU has AVX-512 or AVX2, else the per-panel fallback): column offsets inside
    /// a panel, row offsets, widths that are not multiples of 16, accumulation and scaling.
    #[test]
    fn packed_products_match_a_plain_loop() {
        fn check<T: Elem + Into<f64>>(tol: f64) {
            let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f64 / 251.0 - 2.0;
            // x: 37 × 21 with row stride 23.
            let (xr, xc, xs) = (37, 21, 23);
            let x: Vec<T> = (0..xr * xs).map(|i| T::from_f64(val(i, 1))).collect();
            let row = |r: usize| &x[r * xs..r * xs + xc];
            // Both packings write every element, the padding included.
            let nan = T::from_f64(f64::NAN);
            let mut rows_buf = vec![nan; panels_len(xr, xc)];
            let mut t_buf = vec![nan; panels_len(xc, xr)];
            pack_rows(xr, xc, row, &mut rows_buf);
            pack_transposed(xr, xc, row, &mut t_buf);
            assert!(rows_buf.iter().chain(&t_buf).all(|&v| v.into().is_finite()));
            let plain = Panels::new(&rows_buf, xr);
            let transposed = Panels::new(&t_buf, xc);
            let at = |r: usize, c: usize| x[r * xs + c].into();
            // (operand, its element (p, j), p0, j0, k, n)
            type Case<'a, T> = (Panels<'a, T>, &'a dyn Fn(usize, usize) -> f64, usize, usize);
            let plain_el = |p: usize, j: usize| at(p, j);
            let t_el = |p: usize, j: usize| at(j, p);
            let cases: [(Case<T>, usize, usize); 4] = [
                ((plain, &plain_el, 0, 0), 37, 21),
                ((plain, &plain_el, 5, 3), 20, 18),
                ((transposed, &t_el, 0, 0), 21, 37),
                ((transposed, &t_el, 2, 13), 19, 24),
            ];
            for ((b, el, p0, j0), k, n) in cases {
                for &(m, accumulate, alpha) in &[(7, false, 1.0), (13, true, -0.5)] {
                    let lhs: Vec<T> = (0..m * k).map(|i| T::from_f64(val(i, 2))).collect();
                    let ld = n + 3;
                    let c0: Vec<T> = (0..m * ld).map(|i| T::from_f64(val(i, 3))).collect();
                    let mut c = c0.clone();
                    // SAFETY: lhs is m × k, c m × ld, and the operand covers rows p0 + k and
                    // columns j0 + n.
                    unsafe {
                        gemm_panels(
                            (m, n, k),
                            (c.as_mut_ptr(), ld),
                            accumulate,
                            (lhs.as_ptr(), k, 1),
                            (b, (p0, j0)),
                            T::from_f64(alpha),
                        )
                    };
                    for i in 0..m {
                        for j in 0..ld {
                            let got: f64 = c[i * ld + j].into();
                            let old: f64 = c0[i * ld + j].into();
                            if j >= n {
                                assert_eq!(got, old, "wrote past column {n}");
                                continue;
                            }
                            let dot: f64 = (0..k)
                                .map(|p| lhs[i * k + p].into() * el(p0 + p, j0 + j))
                                .sum();
                            let want = alpha * dot + if accumulate { old } else { 0.0 };
                            assert!(
                                (got - want).abs() <= tol * (1.0 + want.abs()),
                                "m={m} n={n} k={k} p0={p0} j0={j0}: c[{i}][{j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
        check::<f32>(1e-4);
        check::<f64>(1e-12);
    }
}
