//! The linear layers' products on all threads: the right operand packed once (in parallel) into
//! panels, then row × column blocks of the output handed to rayon's threads by work stealing,
//! each block a loop of the register-tile product of `small_gemm` over blocks of the inner
//! dimension (a left operand stored transposed packed there into register tiles).
//!
//! Why not the `gemm` crate's own threading: per block of its inner dimension it packs and
//! then computes, two fork-joins each, with the work split evenly between the threads in
//! advance, and it allocates an 8 MiB packing buffer per call (at (4,1024,1024,16) the
//! forward's heap grew for its first ~14 calls). On the 2-core AVX2 host of `BENCHMARKS.md`
//! its two-thread rate on the products of a model's training step was 89–115 GFLOP/s against
//! MKL's 121–140 (`benches/products`). Here a product is three fork-joins at most, the
//! buffers come from the pool, and a thread slowed by the host takes fewer blocks instead of
//! holding up the other. Measured there, the rates are the `gemm` crate's within the noise,
//! the weight gradients (a transposed left operand) a little higher; MKL stays ahead on two
//! threads (1.10–1.18× its time summed over a model's products).

use rayon::prelude::*;

use super::gemm::Operand;
use super::panels::{pack_rows_panel, pack_transposed_panel, panels_len, PANEL};
use super::simd::Isa;
use super::small_gemm::{small_gemm_packed_with, small_gemm_with, tile_rows, Start};
use super::{workspace, Elem};

/// Bytes of the right operand's part a register-tile strip reads (`kc` rows × 16 columns):
/// half of a 32 KiB L1 data cache, so that strip stays there while the tiles of a row block
/// go over it.
const STRIP_BYTES: usize = 16 * 1024;

/// Rows of an output block: its `kc` columns of the left operand (96 KiB in f32 at `kc` = 256)
/// stay in L2 while every strip goes over them. A multiple of both instruction sets' tile
/// rows (6 and 12).
const BLOCK_ROWS: usize = 96;

/// Blocks per thread at least, so that work stealing can even out a slow thread.
const BLOCKS_PER_THREAD: usize = 4;

/// The narrowest column block (four register-tile strips).
const MIN_BLOCK_COLS: usize = 4 * PANEL;

/// `dst[m×n] = start + alpha · lhs[m×k] · rhs[k×n]` on rayon's threads (`threads`: how many,
/// for the block count; `start`: nothing, `dst` itself or a bias row), `dst` given by pointer
/// and row stride, `rhs` with unit row or column stride. Returns `false` (and does nothing) where the CPU has no register-tile product
/// (neither AVX-512 nor AVX2 with FMA), `rhs` has neither unit stride or a dimension is 0:
/// the caller falls back to the `gemm` crate.
///
/// # Safety
/// Every addressed element must be in bounds (a [`Start::Row`] covers `n` elements); `dst`
/// must not overlap the operands.
pub(crate) unsafe fn par_gemm<T: Elem>(
    dims: (usize, usize, usize),
    dst: (*mut T, usize),
    start: Start<T>,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
    threads: usize,
) -> bool {
    match Isa::detect() {
        Some(isa) => par_gemm_with(isa, dims, dst, start, lhs, rhs, alpha, threads),
        None => false,
    }
}

/// [`par_gemm`] with a chosen instruction set (the tests run both).
///
/// # Safety
/// As [`par_gemm`]; and the CPU has `isa` (see [`Isa::detect`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn par_gemm_with<T: Elem>(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    (dst, ld): (*mut T, usize),
    start: Start<T>,
    lhs: Operand<T>,
    rhs: Operand<T>,
    alpha: T,
    threads: usize,
) -> bool {
    if (rhs.1 != 1 && rhs.2 != 1) || m == 0 || n == 0 || k == 0 {
        return false;
    }
    // Pack the right operand: panel t holds columns 16t..16t + 16 of every row, 16 contiguous
    // elements per row (zero past column n).
    let ps = k * PANEL;
    let mut packed = workspace::take::<T>(panels_len(k, n));
    let (src, (rs, cs)) = (SendPtr(rhs.0), (rhs.1, rhs.2));
    packed
        .par_chunks_mut(ps)
        .enumerate()
        .for_each(|(t, panel)| {
            // SAFETY (both closures): the caller's operand holds k rows of n elements (column
            // stride 1) or n columns of k elements (row stride 1).
            match cs == 1 {
                true => pack_rows_panel(
                    k,
                    n,
                    |p| unsafe { std::slice::from_raw_parts(src.get().add(p * rs), n) },
                    t,
                    panel,
                ),
                false => pack_transposed_panel(
                    n,
                    k,
                    |j| unsafe { std::slice::from_raw_parts(src.get().add(j * cs), k) },
                    t,
                    panel,
                ),
            }
        });

    // A left operand stored transposed (unit row stride: a weight gradient's `gᵀ`) is packed
    // per block and inner block into register tiles (`small_gemm_packed_with`): read in place,
    // a tile's rows lie side by side and each inner index is a new cache line.
    let lhs_by_columns = lhs.1 == 1 && lhs.2 != 1;
    let tr = tile_rows::<T>(isa);
    // Output blocks: BLOCK_ROWS rows, columns split until there are enough blocks.
    let row_blocks = m.div_ceil(BLOCK_ROWS);
    let want = BLOCKS_PER_THREAD * threads.max(1);
    let col_blocks = want
        .div_ceil(row_blocks)
        .clamp(1, n.div_ceil(MIN_BLOCK_COLS).max(1));
    let block_cols = n.div_ceil(col_blocks).next_multiple_of(PANEL);
    let col_blocks = n.div_ceil(block_cols);
    // Inner-dimension blocks of at most STRIP_BYTES / (16 elements) rows, of equal size.
    let kc_max = (STRIP_BYTES / (PANEL * std::mem::size_of::<T>())).max(1);
    let kc = k.div_ceil(k.div_ceil(kc_max));

    let (packed, dst, a) = (
        SendPtr(packed.as_ptr()),
        SendPtr(dst as *const T),
        SendPtr(lhs.0),
    );
    (0..row_blocks * col_blocks)
        .into_par_iter()
        .with_max_len(1)
        .for_each_init(
            || match lhs_by_columns {
                true => Some(workspace::take::<T>(BLOCK_ROWS.next_multiple_of(tr) * kc)),
                false => None,
            },
            |tiles, b| {
                let (i0, j0) = (b / col_blocks * BLOCK_ROWS, b % col_blocks * block_cols);
                let (rows, cols) = ((m - i0).min(BLOCK_ROWS), (n - j0).min(block_cols));
                let mut p0 = 0;
                while p0 < k {
                    let depth = kc.min(k - p0);
                    // Later inner blocks add to what the first one stored.
                    let start = match p0 > 0 {
                        true => Start::Dst,
                        false => start.shifted(j0),
                    };
                    // SAFETY: rows i0.., columns j0.. and inner indices p0.. lie in the
                    // operands (the caller's contract); blocks write disjoint parts of dst.
                    unsafe {
                        let a0 = a.get().add(i0 * lhs.1 + p0 * lhs.2);
                        let rhs = |j: usize| (packed.get().add(p0 * PANEL), PANEL, ps, j0 + j);
                        let c = |j: usize| (dst.get().cast_mut().add(i0 * ld + j0 + j), ld);
                        match tiles {
                            None => small_gemm_with(
                                isa,
                                (rows, cols, depth),
                                (a0, lhs.1, lhs.2),
                                rhs(0),
                                c(0),
                                alpha,
                                start,
                            ),
                            Some(tiles) => {
                                pack_tiles(a0, lhs.2, (rows, depth), tr, tiles);
                                // Packing reads the operand from memory without computing: the
                                // next inner block's part is prefetched, a share before each
                                // 16-column strip, while this one computes.
                                let next = (k - p0 - depth).min(kc);
                                let strips = cols.div_ceil(PANEL);
                                let per = next.div_ceil(strips);
                                for s in 0..strips {
                                    for p in (s * per).min(next)..((s + 1) * per).min(next) {
                                        prefetch(a0.add((depth + p) * lhs.2), rows);
                                    }
                                    let j = s * PANEL;
                                    small_gemm_packed_with(
                                        isa,
                                        (rows, PANEL.min(cols - j), depth),
                                        (tiles.as_ptr(), tr * depth),
                                        rhs(j),
                                        c(j),
                                        alpha,
                                        start.shifted(j),
                                    )
                                }
                            }
                        }
                    };
                    p0 += depth;
                }
            },
        );
    true
}

/// Packs `rows × depth` of a left operand stored by columns (`a(i, p)` at `a + i + p·cs`)
/// into tiles of `tr` rows: `tiles[(i / tr)·tr·depth + p·tr + i % tr]`.
///
/// # Safety
/// Every addressed element of `a` must be in bounds.
unsafe fn pack_tiles<T: Elem>(
    a: *const T,
    cs: usize,
    (rows, depth): (usize, usize),
    tr: usize,
    tiles: &mut [T],
) {
    match tr {
        6 => pack_tiles_of::<T, 6>(a, cs, (rows, depth), tiles),
        _ => pack_tiles_of::<T, 12>(a, cs, (rows, depth), tiles),
    }
}

/// [`pack_tiles`] with the tile rows known to the compiler (whole tiles copied as arrays,
/// not by `memcpy` calls).
#[inline(always)]
unsafe fn pack_tiles_of<T: Elem, const R: usize>(
    a: *const T,
    cs: usize,
    (rows, depth): (usize, usize),
    tiles: &mut [T],
) {
    let whole = rows / R;
    for p in 0..depth {
        // SAFETY: column p's rows 0..rows (the caller's contract).
        let col = unsafe { std::slice::from_raw_parts(a.add(p * cs), rows) };
        for t in 0..whole {
            let at = t * R * depth + p * R;
            let src: &[T; R] = col[t * R..t * R + R].try_into().unwrap();
            let dst: &mut [T; R] = (&mut tiles[at..at + R]).try_into().unwrap();
            *dst = *src;
        }
        let rest = &col[whole * R..];
        if !rest.is_empty() {
            let at = whole * R * depth + p * R;
            tiles[at..at + rest.len()].copy_from_slice(rest);
        }
    }
}

/// Asks for the cache lines of `len` elements from `p` into L2.
#[inline(always)]
fn prefetch<T>(p: *const T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let (start, end) = (p as usize, p as usize + len * std::mem::size_of::<T>());
        let mut line = start & !63;
        while line < end {
            // SAFETY: a prefetch never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    line as *const i8,
                )
            };
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// A raw pointer that rayon's tasks may share: every task reads, or writes a part no other
/// task touches.
#[derive(Clone, Copy)]
struct SendPtr<T>(*const T);

// SAFETY: see the type's comment; the callers uphold it.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(self) -> *const T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against an f64 triple loop, for every instruction set this CPU has, in f32 and f64, on
    /// 1–3 threads: row blocks with remainders (96-row blocks, 6- and 12-row tiles), column
    /// blocks and panels with remainders, several inner-dimension blocks (256 in f32, 128 in
    /// f64), a left operand read in place or transposed (packed into tiles), a right one
    /// by rows or transposed (the two packings), starting from nothing, from `dst` or from a
    /// bias row, with and without scaling; every output element written (NaN on entry where
    /// not accumulating), none past column `n`.
    #[test]
    fn matches_a_plain_loop() {
        let isas = Isa::available();
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for &isa in &isas {
                pool.install(|| {
                    check::<f32>(isa, threads, 1e-4);
                    check::<f64>(isa, threads, 1e-12);
                });
            }
        }
    }

    fn check<T: Elem + Into<f64>>(isa: Isa, threads: usize, tol: f64) {
        let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f64 / 251.0 - 2.0;
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 5, 3),
            (97, 33, 300),
            (193, 70, 520),
            (13, 100, 1),
            (250, 17, 129),
        ] {
            // start: 0 overwrite, 1 accumulate, 2 from a row (a bias).
            for &(lhs_t, rhs_t, start, alpha) in &[
                (false, false, 0, 1.0),
                (true, false, 1, 0.5),
                (false, true, 1, -2.0),
                (true, true, 0, 1.0),
                (false, true, 2, 1.0),
                (true, false, 2, -0.5),
            ] {
                // lhs stored m×k (row stride k+3) or k×m (row stride m+2, read transposed);
                // rhs k×n (row stride n+5) or n×k (row stride k+1, read transposed).
                let (ars, acs, a_len) = match lhs_t {
                    false => (k + 3, 1, m * (k + 3)),
                    true => (1, m + 2, k * (m + 2)),
                };
                let (brs, bcs, b_len) = match rhs_t {
                    false => (n + 5, 1, k * (n + 5)),
                    true => (1, k + 1, n * (k + 1)),
                };
                let a: Vec<T> = (0..a_len).map(|i| T::from_f64(val(i, 1))).collect();
                let b: Vec<T> = (0..b_len).map(|i| T::from_f64(val(i, 2))).collect();
                let ld = n + 1;
                let c0: Vec<T> = (0..m * ld)
                    .map(|i| match start == 1 || i % ld == n {
                        true => T::from_f64(val(i, 3)),
                        false => T::from_f64(f64::NAN),
                    })
                    .collect();
                let mut c = c0.clone();
                let row: Vec<T> = (0..n).map(|j| T::from_f64(val(j, 4))).collect();
                let from = match start {
                    0 => Start::Zero,
                    1 => Start::Dst,
                    _ => Start::Row(row.as_ptr()),
                };
                // SAFETY: the strides and lengths above cover every addressed element; the
                // CPU has `isa`.
                let done = unsafe {
                    par_gemm_with(
                        isa,
                        (m, n, k),
                        (c.as_mut_ptr(), ld),
                        from,
                        (a.as_ptr(), ars, acs),
                        (b.as_ptr(), brs, bcs),
                        T::from_f64(alpha),
                        threads,
                    )
                };
                assert!(done);
                let case =
                    format!("{isa:?} {threads} threads ({m},{n},{k}) lhs_t={lhs_t} rhs_t={rhs_t}");
                for i in 0..m {
                    for j in 0..ld {
                        let (got, old): (f64, f64) = (c[i * ld + j].into(), c0[i * ld + j].into());
                        if j == n {
                            assert_eq!(got, old, "{case} wrote past column {n}");
                            continue;
                        }
                        let dot: f64 = (0..k)
                            .map(|p| a[i * ars + p * acs].into() * b[p * brs + j * bcs].into())
                            .sum();
                        let want = alpha * dot
                            + match start {
                                0 => 0.0,
                                1 => old,
                                _ => row[j].into(),
                            };
                        assert!(
                            (got - want).abs() <= tol * (1.0 + want.abs()),
                            "{case} start={start}: c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }

    /// `pack_tiles` for both instruction sets' tile rows, with a last partial tile: every
    /// element at its place, nothing else written.
    #[test]
    fn packs_tiles_of_either_height() {
        let (rows, depth, cs): (usize, usize, usize) = (29, 7, 31);
        let a: Vec<f32> = (0..depth * cs).map(|i| i as f32).collect();
        for tr in [6, 12] {
            let len = rows.next_multiple_of(tr) * depth;
            let mut tiles = vec![-1f32; len + 1];
            // SAFETY: column p's rows 0..29 lie at p·31.. within `a`.
            unsafe { pack_tiles(a.as_ptr(), cs, (rows, depth), tr, &mut tiles) };
            for (at, &got) in tiles.iter().enumerate() {
                let (t, p, r) = (at / (tr * depth), at % (tr * depth) / tr, at % tr);
                let i = t * tr + r;
                let want = match at < len && i < rows {
                    true => (i + p * cs) as f32,
                    false => -1.0,
                };
                assert_eq!(got, want, "tr {tr}: tiles[{at}] (row {i}, inner {p})");
            }
        }
    }

    /// A right operand with neither unit stride is left to the caller: `false`, nothing
    /// written.
    #[test]
    fn declines_a_strided_right_operand() {
        let (a, b) = (vec![1f32; 4 * 4], vec![1f32; 4 * 8]);
        let mut c = vec![7f32; 4 * 4];
        let isa = Isa::detect().unwrap_or(Isa::Avx2);
        // SAFETY: every operand is 4×4 within its buffer (b with strides 8 and 2); nothing is
        // read, as the test asserts.
        let done = unsafe {
            par_gemm_with(
                isa,
                (4, 4, 4),
                (c.as_mut_ptr(), 4),
                Start::Zero,
                (a.as_ptr(), 4, 1),
                (b.as_ptr(), 8, 2),
                1.0,
                2,
            )
        };
        assert!(!done);
        assert!(c.iter().all(|&x| x == 7.0));
    }
}
