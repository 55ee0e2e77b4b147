//! The linear layers' products on all threads, by rayon's work stealing, each unit of work a
//! loop of the register-tile product of `small_gemm` over blocks of the inner dimension (a
//! left operand stored transposed packed there into register tiles). Two ways to split a
//! product (`Grid`):
//! - row × column blocks of the output, after the right operand is packed once into panels
//!   by all threads;
//! - for a weight gradient `gᵀ·x` (a left operand stored transposed) with up to ~3000 output
//!   rows and a deep inner dimension (the tokens): slices of the inner dimension, each
//!   packing its own part of the right operand and computing every output row block over it
//!   (as jobs any idle thread may take) into its own output, then summed. The left operand is
//!   packed once per row block and inner block for all columns, and there is no separate
//!   packing pass: paired against column blocks on the 2-core Zen 3 of `BENCHMARKS.md`,
//!   0.84–0.93× the time at 256–1024 rows, 0.90–0.98× at 1536–2048. Sliced the same way,
//!   forward and input-gradient products gained nothing: they keep blocks.
//!
//! With AVX-512 only products that start from a bias row come here (`gemm::on_all_threads`:
//! there the `gemm` crate was faster on the rest); without it, every large product.
//!
//! Why not the `gemm` crate's own threading: per block of its inner dimension it packs and
//! then computes, two fork-joins each, with the work split evenly between the threads in
//! advance, and it allocates an 8 MiB packing buffer per call (at (4,1024,1024,16) the
//! forward's heap grew for its first ~14 calls). On the 2-core AVX2 host of `BENCHMARKS.md`
//! its two-thread rate on the products of a model's training step was 89–115 GFLOP/s against
//! MKL's 121–140 (`benches/products`). Here a product is three fork-joins at most, the
//! buffers come from the pool, and a thread slowed by the host takes fewer units instead of
//! holding up the other.

use rayon::prelude::*;

use super::gemm::Operand;
use super::panels::{pack_transposed_panel, panels_len, PANEL};
use super::simd::Isa;
use super::small_gemm::{small_gemm_packed_with, small_gemm_with, tile_cols, tile_rows, Start};
use super::{workspace, Elem};

/// Bytes of the right operand's part a register-tile strip reads (`kc` rows × the tile's 16
/// or 32 columns) where the left operand is packed into tiles (a weight gradient `gᵀ·x`): half
/// of a 32 KiB L1 data cache, so that strip stays there while the tiles of a row block go over
/// it.
const STRIP_BYTES: usize = 16 * 1024;

/// Inner-dimension block where the left operand is read in place (the forward `x·Wᵀ` and the
/// input gradient `g·W`): a tile reads `kc` contiguous elements from each of its 6 or 12 rows
/// of `x` or `g`, 2 KiB in f32 (32 cache lines) instead of 512 bytes at the 16 KiB strips, and
/// the output is read and written `k / kc` times instead of 4× as often. The strip of the
/// right operand (64 KiB) then streams from L2. Paired call by call on the AVX-512 Xeon of
/// `BENCHMARKS.md` (2 threads): the large model's forward and input-gradient products took
/// 0.91–0.97× the time (2048×2048×512 0.90–0.91), at 1 thread 0.89–0.98×, with AVX2 there
/// 0.91–0.99×; a packed left operand (one contiguous stream) gained nothing (0.96–1.03×), so
/// it keeps [`STRIP_BYTES`]. These pairs had no same-run control; a later one (the same
/// variant twice) ranged 0.94–1.07 there, so the smaller gains may be noise (`BENCHMARKS.md`,
/// ninth session). The sums are the same either way up to their order.
const INPLACE_KC: usize = 512;

/// Output columns a register tile goes over at a time where it keeps its part of an in-place
/// left operand in L1 (see `Blocks::run`): their strips (512 KiB in f32 at [`INPLACE_KC`])
/// stay in L2. Paired call by call on the AVX-512 Xeon of `BENCHMARKS.md` against every tile
/// of a block going over each strip: the large model's in-place products took 0.92–0.99× the
/// time on 2 threads (2048×1536×512 and 2048×2048×512 0.92–0.96), 0.94–1.00× on one; 128
/// columns gained a little less. With AVX2 forced there (16-column tiles, a 32 KiB strip that
/// L1 holds) it made no difference (0.97–1.02×), so only two-panel tiles take this order.
/// Measured without a same-run control, as [`INPLACE_KC`]: the gain may be within noise.
const CHUNK_COLS: usize = 256;

/// Rows of an output block: its `kc` columns of the left operand (96 KiB in f32 at `kc` = 256,
/// 192 KiB at [`INPLACE_KC`]) stay in L2 while every strip goes over them. A multiple of both
/// instruction sets' tile rows (6 and 12).
const BLOCK_ROWS: usize = 96;

/// Blocks per thread at least, so that work stealing can even out a slow thread.
const BLOCKS_PER_THREAD: usize = 4;

/// Products with fewer row blocks than this are split along the inner dimension (see
/// `Grid::new`), into at most [`MAX_SLICES`] slices. Paired on the 2-core Zen 3 of
/// `BENCHMARKS.md`: four slices beat two (0.86× against 0.92× of column blocks' time at
/// 256×256×2048) and eight (0.91–1.03×); weight gradients of 8–22 row blocks gained 2–8%
/// sliced.
const SLICED_BELOW_ROW_BLOCKS: usize = 32;
const MAX_SLICES: usize = 4;

/// Elements from which packing a right operand or summing the slices goes to the pool:
/// below, a fork-join (which wakes the pool's sleeping thread, 30–300 µs on the VM of
/// `BENCHMARKS.md`) costs more than the pass. Paired there against always parallel: the
/// small model's 704×64×64 and 64×64×704 products took 0.73× the time, 2048×256×256 (a
/// 2¹⁶-element weight packed on one thread) 1.01×; at 2¹⁸ elements (2048×512×512) one thread
/// cost 1–2%.
const PARALLEL_PASS_FROM: usize = 1 << 17;

/// Whether a pass over `elements` (packing, summing) runs on all threads.
fn parallel_pass(elements: usize) -> bool {
    // `par::parallel` counts multiply-adds (its tests' forcing and `MHA_SERIAL_BELOW` apply).
    super::par::parallel(elements.saturating_mul(super::par::SERIAL_BELOW / PARALLEL_PASS_FROM))
}

/// The narrowest column block (four register-tile strips).
const MIN_BLOCK_COLS: usize = 4 * PANEL;

/// `dst[m×n] = start + alpha · lhs[m×k] · rhs[k×n]` on rayon's threads (`threads`: how many,
/// for the block count; the sums do not depend on it; `start`: nothing, `dst` itself or a
/// bias row), `dst` given by pointer and row stride, `rhs` with unit row or column stride.
/// Returns `false` (and does nothing) where the CPU has no register-tile product (neither
/// AVX-512 nor AVX2 with FMA), `rhs` has neither unit stride or a dimension is 0: the caller
/// falls back to the `gemm` crate.
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
    let (tr, tc) = (tile_rows::<T>(isa), tile_cols::<T>(isa));
    let packs_lhs = lhs_packed(lhs.1, lhs.2);
    let grid = Grid::new(
        (m, n, k),
        (tr, tc),
        threads,
        std::mem::size_of::<T>(),
        packs_lhs,
    );
    let blocks = Blocks {
        isa,
        lhs: (SendPtr(lhs.0), lhs.1, lhs.2),
        alpha,
        tr,
        tc,
        kc: grid.kc,
    };
    let rhs = Rhs {
        src: SendPtr(rhs.0),
        rs: rhs.1,
        cs: rhs.2,
        n,
    };
    // Scratch for a left operand stored transposed (see `Blocks::run`; a block's rows are
    // whole tiles).
    let tiles = || match packs_lhs {
        true => Some(workspace::take::<T>(grid.block_rows * grid.kc)),
        false => None,
    };
    let dst = SendPtr(dst as *const T);
    if grid.slices == 1 {
        // The right operand packed once (on all threads where it is large, see
        // `PARALLEL_PASS_FROM`); then blocks of the output.
        let mut packed = workspace::take::<T>(panels_len(k, n));
        rhs.pack(0..k, &mut packed, parallel_pass(k * n));
        let packed = (SendPtr(packed.as_ptr()), k * PANEL, 0);
        (0..grid.row_blocks * grid.col_blocks)
            .into_par_iter()
            .with_max_len(1)
            .for_each_init(tiles, |tiles, b| {
                let (i0, j0) = (
                    b / grid.col_blocks * grid.block_rows,
                    b % grid.col_blocks * grid.block_cols,
                );
                let rows = i0..(i0 + grid.block_rows).min(m);
                let cols = j0..(j0 + grid.block_cols).min(n);
                // SAFETY: the caller's contract; blocks write disjoint parts of dst.
                unsafe { blocks.run((rows, cols, 0..k), packed, (dst, ld), start, tiles) }
            });
        return true;
    }
    // Slices of the inner dimension: each packs its part of the right operand itself (in
    // its thread's caches, no pass of all threads first), then its row blocks run as jobs
    // of their own (taken by any idle thread). The first slice writes dst from the caller's
    // start, the others scratch outputs from nothing, which are then added to dst in slice
    // order.
    let mut partial = workspace::take::<T>((grid.slices - 1) * m * n);
    let part = SendPtr(partial.as_mut_ptr().cast_const());
    (0..grid.slices)
        .into_par_iter()
        .with_max_len(1)
        .for_each(|s| {
            let (k0, k1) = (s * grid.slice, ((s + 1) * grid.slice).min(k));
            let mut packed = workspace::take::<T>(panels_len(k1 - k0, n));
            rhs.pack(k0..k1, &mut packed, false);
            let packed = (SendPtr(packed.as_ptr()), (k1 - k0) * PANEL, k0);
            let (out, start) = match s {
                0 => ((dst, ld), start),
                _ => (
                    (SendPtr(part.get().wrapping_add((s - 1) * m * n)), n),
                    Start::Zero,
                ),
            };
            (0..grid.row_blocks)
                .into_par_iter()
                .with_max_len(1)
                .for_each_init(tiles, |tiles, b| {
                    let i0 = b * grid.block_rows;
                    let rows = i0..(i0 + grid.block_rows).min(m);
                    // SAFETY: the caller's contract; each slice writes its own output, each of its
                    // jobs its own rows.
                    unsafe { blocks.run((rows, 0..n, k0..k1), packed, out, start, tiles) }
                });
        });
    let rows_per = (m * n)
        .div_ceil(threads.max(1) * BLOCKS_PER_THREAD)
        .div_ceil(n)
        .max(1);
    let sum = parallel_pass((grid.slices - 1) * m * n);
    super::par::for_each_init(
        m.div_ceil(rows_per),
        sum,
        || (),
        |_, c| {
            for i in c * rows_per..((c + 1) * rows_per).min(m) {
                // SAFETY: row i of dst (this task's alone) and of each scratch output.
                let d =
                    unsafe { std::slice::from_raw_parts_mut(dst.get().cast_mut().add(i * ld), n) };
                for s in 0..grid.slices - 1 {
                    let p =
                        unsafe { std::slice::from_raw_parts(part.get().add(s * m * n + i * n), n) };
                    d.iter_mut().zip(p).for_each(|(d, &p)| *d += p);
                }
            }
        },
    );
    true
}

/// The right operand as the caller gave it: `(p, j)` at `src + p·rs + j·cs`, `n` columns,
/// with unit column stride (stored by rows) or unit row stride (stored transposed).
#[derive(Clone, Copy)]
struct Rhs<T> {
    src: SendPtr<T>,
    rs: usize,
    cs: usize,
    n: usize,
}

impl<T: Elem> Rhs<T> {
    /// Packs rows `rows` into `dst` (`panels_len(rows.len(), n)` elements): panel `t` holds
    /// columns `16t..16t + 16` of every row, 16 contiguous elements per row, zero past column
    /// `n`. `parallel`: on all threads.
    fn pack(self, rows: std::ops::Range<usize>, dst: &mut [T], parallel: bool) {
        let (k0, depth, n) = (rows.start, rows.len(), self.n);
        let ps = depth * PANEL;
        if self.cs != 1 {
            // Stored transposed: sixteen source rows (columns of the operand) per panel.
            // SAFETY: the caller's operand holds n columns of k elements (row stride 1).
            let col = |j: usize| unsafe {
                std::slice::from_raw_parts(self.src.get().add(j * self.cs + k0), depth)
            };
            super::par::for_each_chunk_mut(dst, ps, parallel, |t, panel| {
                pack_transposed_panel(n, depth, col, t, panel)
            });
            return;
        }
        // Stored by rows: groups of 8 rows, then panel by panel, so that the reads are whole
        // rows in order and every panel gets 8 consecutive lines (panel by panel over all
        // rows read one line per row at the row stride: 7 GB/s at n = 256).
        const GROUP: usize = 8;
        let out = SendPtr(dst.as_mut_ptr().cast_const());
        let per_task = match parallel {
            true => 8 * GROUP,
            false => depth,
        };
        super::par::for_each_init(
            depth.div_ceil(per_task),
            parallel,
            || (),
            |_, c| {
                let (c0, c1) = (c * per_task, ((c + 1) * per_task).min(depth));
                for g0 in (c0..c1).step_by(GROUP) {
                    let g1 = (g0 + GROUP).min(c1);
                    for t in 0..n.div_ceil(PANEL) {
                        let j0 = t * PANEL;
                        let width = PANEL.min(n - j0);
                        for p in g0..g1 {
                            // SAFETY: row k0 + p holds n elements; the panel's row p lies in dst,
                            // and tasks write disjoint rows of every panel.
                            let (src, panel_row) = unsafe {
                                (
                                    std::slice::from_raw_parts(
                                        self.src.get().add((k0 + p) * self.rs + j0),
                                        width,
                                    ),
                                    std::slice::from_raw_parts_mut(
                                        out.get().cast_mut().add(t * ps + p * PANEL),
                                        PANEL,
                                    ),
                                )
                            };
                            match <&[T; PANEL]>::try_from(src) {
                                // Whole rows as fixed-size arrays (not `memcpy` calls).
                                Ok(src) => *<&mut [T; PANEL]>::try_from(panel_row).unwrap() = *src,
                                Err(_) => {
                                    panel_row[..width].copy_from_slice(src);
                                    panel_row[width..].fill(T::ZERO);
                                }
                            }
                        }
                    }
                }
            },
        );
    }
}

/// Whether a left operand of these (row, column) strides is stored transposed (unit row
/// stride: a weight gradient's `gᵀ`), and so packed per block and inner block into register
/// tiles (`small_gemm_packed_with`): read in place, a tile's rows lie side by side and each
/// inner index is a new cache line.
fn lhs_packed(rs: usize, cs: usize) -> bool {
    rs == 1 && cs != 1
}

/// The part of a product one thread computes at a time: rows × columns of the output over a
/// range of the inner dimension, in inner blocks of `kc`.
#[derive(Clone, Copy)]
struct Blocks<T> {
    isa: Isa,
    lhs: (SendPtr<T>, usize, usize),
    alpha: T,
    tr: usize,
    /// Columns of a strip of a packed left operand's pass ([`tile_cols`]: a register tile).
    tc: usize,
    kc: usize,
}

impl<T: Elem> Blocks<T> {
    /// `out[rows, cols] = start + alpha · lhs[rows, inner] · rhs[inner, cols]`, the right
    /// operand packed (`(data, panel stride, first packed inner index)`), `out` by pointer and
    /// row stride (column 0 of the product's output), `tiles` the scratch of a packed left
    /// operand ([`lhs_packed`]).
    ///
    /// # Safety
    /// Every addressed element is in bounds; no other thread writes these rows and columns
    /// of `out`.
    #[allow(clippy::type_complexity)]
    unsafe fn run(
        &self,
        (rows, cols, inner): (
            std::ops::Range<usize>,
            std::ops::Range<usize>,
            std::ops::Range<usize>,
        ),
        (packed, ps, base): (SendPtr<T>, usize, usize),
        (out, ld): (SendPtr<T>, usize),
        start: Start<T>,
        tiles: &mut Option<workspace::Buf<T>>,
    ) {
        let (isa, tr, (a, ars, acs)) = (self.isa, self.tr, self.lhs);
        let (i0, j0, (m, n)) = (rows.start, cols.start, (rows.len(), cols.len()));
        let mut p0 = inner.start;
        while p0 < inner.end {
            let depth = self.kc.min(inner.end - p0);
            // Later inner blocks add to what the first one stored.
            let start = match p0 > inner.start {
                true => Start::Dst,
                false => start.shifted(j0),
            };
            let a0 = a.get().add(i0 * ars + p0 * acs);
            let rhs = |j: usize| (packed.get().add((p0 - base) * PANEL), PANEL, ps, j0 + j);
            let c = |j: usize| (out.get().cast_mut().add(i0 * ld + j0 + j), ld);
            match tiles {
                // Two panels a tile (f32 with AVX-512): its 12 rows' part of the left operand
                // (24 KiB at INPLACE_KC) stays in L1 while it goes over a chunk of strips from
                // L2, instead of every tile of the block going over each strip (64 KiB, more
                // than L1 holds). The same sums in the same order, another loop order.
                None if self.tc > PANEL => {
                    for j in (0..n).step_by(CHUNK_COLS) {
                        let cols = CHUNK_COLS.min(n - j);
                        let (cj, ldc) = c(j);
                        for i in (0..m).step_by(tr) {
                            small_gemm_with(
                                isa,
                                (tr.min(m - i), cols, depth),
                                (a0.add(i * ars), ars, acs),
                                rhs(j),
                                (cj.add(i * ldc), ldc),
                                self.alpha,
                                start.shifted(j),
                            )
                        }
                    }
                }
                None => small_gemm_with(
                    isa,
                    (m, n, depth),
                    (a0, ars, acs),
                    rhs(0),
                    c(0),
                    self.alpha,
                    start,
                ),
                Some(tiles) => {
                    pack_tiles(a0, acs, (m, depth), tr, tiles);
                    // Packing reads the operand from memory without computing: the next inner
                    // block's part is prefetched, a share before each strip, while this one
                    // computes. A strip is a register tile wide: 32 columns for f32 with
                    // AVX-512 (16, one vector, ran the weight gradients at 0.5–0.7× MKL's rate
                    // on an AVX-512 Xeon).
                    let next = (inner.end - p0 - depth).min(self.kc);
                    let strips = n.div_ceil(self.tc);
                    let per = next.div_ceil(strips);
                    for s in 0..strips {
                        for p in (s * per).min(next)..((s + 1) * per).min(next) {
                            prefetch(a0.add((depth + p) * acs), m);
                        }
                        let j = s * self.tc;
                        small_gemm_packed_with(
                            isa,
                            (m, self.tc.min(n - j), depth),
                            (tiles.as_ptr(), tr * depth),
                            rhs(j),
                            c(j),
                            self.alpha,
                            start.shifted(j),
                        )
                    }
                }
            }
            p0 += depth;
        }
    }
}

/// How `par_gemm` splits a product into units of work: blocks of the output, or, for an
/// output too small to give every thread several blocks of rows (a weight gradient `gᵀ·x`:
/// out × in over thousands of tokens), slices of the inner dimension, each computing the
/// whole output into its own buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grid {
    block_rows: usize,
    row_blocks: usize,
    block_cols: usize,
    col_blocks: usize,
    /// Inner-dimension slices (1: none), and the length of each but the last.
    slices: usize,
    slice: usize,
    /// Inner-dimension block: the depth of one register-tile pass.
    kc: usize,
}

impl Grid {
    /// `(tr, tc)`: rows and columns of a register tile; `lhs_packed`: the left operand is
    /// stored transposed (see [`lhs_packed`]).
    fn new(
        (m, n, k): (usize, usize, usize),
        (tr, tc): (usize, usize),
        threads: usize,
        elem: usize,
        lhs_packed: bool,
    ) -> Self {
        let threads = threads.max(1);
        let tuning = super::tuning::get();
        let want = BLOCKS_PER_THREAD * threads;
        // Inner-dimension blocks of at most STRIP_BYTES / (16 elements) rows: the depth that
        // decides slicing below.
        let kc_max = (STRIP_BYTES / (PANEL * elem)).max(1);
        // The inner block itself. With a packed left operand the strip a register tile reads
        // is `tc` columns wide (two panels for f32 with AVX-512: at kc_max that strip was a
        // whole 32 KiB L1 of an AVX-512 Zen 4, two thirds of a 48 KiB one); read in place, see
        // INPLACE_KC.
        let kc_tile = match lhs_packed {
            true if tuning.packed_kc > 0 => tuning.packed_kc,
            true => (STRIP_BYTES / (tc * elem)).max(1),
            false => INPLACE_KC,
        };
        // Row blocks of at most BLOCK_ROWS rows, of equal size (whole tiles).
        let row_blocks = m.div_ceil(BLOCK_ROWS);
        let block_rows = m.div_ceil(row_blocks).next_multiple_of(tr);
        let row_blocks = m.div_ceil(block_rows);
        // A packed left operand (a weight gradient `gᵀ·x`: out × in over thousands of
        // tokens) and few row blocks: slices of the inner dimension, each at least two inner
        // blocks deep, where splitting the columns would pack every block's left operand once
        // per column block and leave two threads few blocks to share. Each slice but the
        // first costs an m·n pass at the end. Decided by the shape alone, so that the sums
        // are the same on any number of threads.
        let deepest = k / (2 * kc_max);
        let most = match tuning.max_slices {
            0 => MAX_SLICES,
            s => s,
        };
        if lhs_packed && row_blocks < SLICED_BELOW_ROW_BLOCKS && deepest >= 2 && most > 1 {
            let slices = deepest.min(most);
            let slice = k.div_ceil(slices);
            return Self {
                block_rows,
                row_blocks,
                block_cols: n,
                col_blocks: 1,
                slices: k.div_ceil(slice),
                slice,
                kc: slice.div_ceil(slice.div_ceil(kc_tile)),
            };
        }
        // Else columns are split until there are enough blocks.
        let col_blocks = want
            .div_ceil(row_blocks)
            .clamp(1, n.div_ceil(MIN_BLOCK_COLS).max(1));
        let block_cols = n.div_ceil(col_blocks).next_multiple_of(PANEL);
        Self {
            block_rows,
            row_blocks,
            block_cols,
            col_blocks: n.div_ceil(block_cols),
            slices: 1,
            slice: k,
            kc: k.div_ceil(k.div_ceil(kc_tile)),
        }
    }
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
    // Eight inner indices at a time, tile by tile: a tile's part is then three whole cache
    // lines. One index at a time wrote 24 bytes into each of the block's tiles, which lie
    // `R·depth` elements apart (6 KiB in f32 at depth 256) and so fall into two of L1's sets;
    // its stores were where the profile stalled. Here the loads are, and the packing's share
    // stayed the same: paired, the weight gradients took 0.97–1.02× the time (median 0.99).
    // What made the packing cheap is packing each block once for all columns (the slices).
    const P: usize = 8;
    for p0 in (0..depth).step_by(P) {
        let pn = P.min(depth - p0);
        // SAFETY: columns p0..p0 + pn, rows 0..rows (the caller's contract).
        let cols: [&[T]; P] = std::array::from_fn(|q| match q < pn {
            true => unsafe { std::slice::from_raw_parts(a.add((p0 + q) * cs), rows) },
            false => &[],
        });
        for t in 0..whole {
            for (q, col) in cols.iter().enumerate().take(pn) {
                let at = t * R * depth + (p0 + q) * R;
                let src: &[T; R] = col[t * R..t * R + R].try_into().unwrap();
                let dst: &mut [T; R] = (&mut tiles[at..at + R]).try_into().unwrap();
                *dst = *src;
            }
        }
        for (q, col) in cols.iter().enumerate().take(pn) {
            let rest = &col[whole * R..];
            if !rest.is_empty() {
                let at = whole * R * depth + (p0 + q) * R;
                tiles[at..at + rest.len()].copy_from_slice(rest);
            }
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
    /// blocks and panels with remainders, blocks wider than [`CHUNK_COLS`] (800×300: one
    /// column block), several inner-dimension blocks (in place: 520 and 1100 in blocks of at
    /// most 512; packed: 16 KiB strips), a left operand read in place or transposed (packed
    /// into tiles), a right one by rows or transposed (the two packings), starting from
    /// nothing, from `dst` or from a bias row, with and without scaling; every output element
    /// written (NaN on entry where not accumulating), none past column `n`.
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
            (40, 50, 1100),
            (800, 300, 40),
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

    /// The same bits on 2, 3 and 4 threads (and with one thread forced through the pool's
    /// code), for products split into blocks and into inner-dimension slices, f32 and f64:
    /// how a product is split depends on its shape only, so training on another machine's
    /// thread count resumes bit-identically.
    #[test]
    fn sums_do_not_depend_on_the_thread_count() {
        let isa = match Isa::detect() {
            Some(isa) => isa,
            None => return,
        };
        fn run<T: Elem>(isa: Isa, threads: usize, (m, n, k): (usize, usize, usize)) -> Vec<T> {
            let val = |i: usize, s: u64| ((i as u64 * 2654435761 + s) % 1009) as f64 / 251.0 - 2.0;
            let a: Vec<T> = (0..m * k).map(|i| T::from_f64(val(i, 1))).collect();
            let b: Vec<T> = (0..k * n).map(|i| T::from_f64(val(i, 2))).collect();
            let mut c = vec![T::ZERO; m * n];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            // SAFETY: a is k×m read transposed, b k×n by rows, c m×n.
            let done = pool.install(|| unsafe {
                par_gemm_with(
                    isa,
                    (m, n, k),
                    (c.as_mut_ptr(), n),
                    Start::Zero,
                    (a.as_ptr(), 1, m),
                    (b.as_ptr(), n, 1),
                    T::ONE,
                    threads,
                )
            });
            assert!(done);
            c
        }
        // (50, 40, 2100): one row block, four slices in f32 and f64; (200, 90, 300): blocks.
        for dims in [(50, 40, 2100), (200, 90, 300)] {
            let (f, d) = (run::<f32>(isa, 2, dims), run::<f64>(isa, 2, dims));
            for threads in [1, 3, 4] {
                // Finite values: equal means the same bits (up to the sign of a zero).
                assert_eq!(
                    run::<f32>(isa, threads, dims),
                    f,
                    "f32 {dims:?}, {threads} threads"
                );
                assert_eq!(
                    run::<f64>(isa, threads, dims),
                    d,
                    "f64 {dims:?}, {threads} threads"
                );
            }
        }
        assert_eq!(Grid::new((50, 40, 2100), (6, 16), 2, 4, true).slices, 4);
        assert_eq!(Grid::new((200, 90, 300), (6, 16), 2, 4, true).slices, 1);
        // The inner block of a packed left operand: 16 KiB strips of the tile's width (150 of
        // 300 at 16 columns, 100 at 32: f32 with AVX-512); read in place, equal blocks of at
        // most INPLACE_KC (all 300; 1200 in three of 400), for either tile.
        assert_eq!(Grid::new((200, 90, 300), (6, 16), 2, 4, true).kc, 150);
        assert_eq!(Grid::new((200, 90, 300), (12, 32), 2, 4, true).kc, 100);
        for tile in [(6, 16), (12, 32)] {
            assert_eq!(Grid::new((200, 90, 300), tile, 2, 4, false).kc, 300);
            assert_eq!(Grid::new((200, 90, 1200), tile, 2, 8, false).kc, 400);
        }
    }

    /// The benchmarks' overrides (`tuning`): the inner block of a packed left operand and the
    /// slice count follow them, and the products still match a plain loop; another thread
    /// keeps the defaults.
    #[test]
    fn follows_the_benchmarks_tuning() {
        use crate::cpu::tuning::{self, ProductTuning};
        let grid = || Grid::new((50, 40, 2100), (6, 16), 2, 4, true);
        let default = grid();
        for (kc, slices) in [(64, 2), (512, 1)] {
            tuning::set(ProductTuning {
                packed_kc: kc,
                max_slices: slices,
                ..Default::default()
            });
            let tuned = grid();
            assert_eq!(tuned.slices, slices, "max_slices {slices}");
            assert!(
                tuned.kc <= kc && tuned.kc > kc / 2,
                "packed_kc {kc}: {tuned:?}"
            );
            assert_eq!(std::thread::spawn(grid).join().unwrap(), default);
            if let Some(isa) = Isa::detect() {
                check::<f32>(isa, 2, 1e-4);
            }
        }
        tuning::set(ProductTuning::default());
        assert_eq!(grid(), default);
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
