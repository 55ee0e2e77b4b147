//! The CPU kernels of fused attention: forward (online softmax, FlashAttention-2 order),
//! backward (probabilities recomputed from the row log-sum-exp) and the weights pass.
//!
//! Tile products go through the `gemm` crate (run-time dispatched SIMD micro-kernels, one
//! thread per call); the parallelism is over batch × heads (× query tiles in the forward and
//! weights passes) with rayon. Nothing of size `L × S` is ever allocated except the weights
//! the caller asked for.

use rayon::prelude::*;

use crate::attention::dropout::DropoutMask;
use crate::cpu::{gemm, Elem, Threads};

/// Query rows per forward tile.
const BR: usize = 64;
/// Key columns per forward tile.
const BC: usize = 256;
/// Query rows per backward tile.
const BQ: usize = 128;
/// Key columns per backward tile.
const BK: usize = 128;

/// Sizes of one call, in head space.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    /// Batch `N`.
    pub n: usize,
    /// Heads `H`.
    pub h: usize,
    /// Queries `L`.
    pub l: usize,
    /// Keys `S'`, including the `bias_k` / zero-attention columns.
    pub s: usize,
    /// Head dim.
    pub d: usize,
    /// The first `s_masked` keys are the ones masks and the causal rule apply to; the
    /// `bias_k` / zero-attention columns after them are never masked (PyTorch pads the masks
    /// with zeros there).
    pub s_masked: usize,
    /// Key `j` (< `s_masked`) is masked for query `i` when `j > i`.
    pub causal: bool,
    /// Factor of `q·k` (PyTorch: `1/√d`).
    pub scale: f64,
}

/// Where the rows of q, k, v, the output or a gradient live: row `(b, h, i)` starts at
/// `off + b·sb + h·sh + i·si`, and its `d` elements are contiguous.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowMap {
    pub off: usize,
    pub sb: usize,
    pub sh: usize,
    pub si: usize,
}

impl RowMap {
    #[inline(always)]
    fn at(&self, b: usize, h: usize, i: usize) -> usize {
        self.off + b * self.sb + h * self.sh + i * self.si
    }
}

/// Rows `0..len` of head `(b, h)` of `x`, copied contiguously (`len × d`) into `buf`: the
/// projections' rows are `3E` apart, and the tile products run faster on packed rows. The
/// buffer is reused across tasks (large fresh allocations cost page faults).
fn pack_head_into<T: Elem>(
    x: &Rows<T>,
    (b, h): (usize, usize),
    len: usize,
    d: usize,
    buf: &mut Vec<T>,
) {
    buf.clear();
    for i in 0..len {
        let at = x.map.at(b, h, i);
        buf.extend_from_slice(&x.data[at..at + d]);
    }
}

/// The row map of a [`pack_head_into`] buffer.
fn packed_map(d: usize) -> RowMap {
    RowMap {
        off: 0,
        sb: 0,
        sh: 0,
        si: d,
    }
}

/// A [`pack_head_into`] buffer as rows.
fn packed_rows<T>(data: &[T], d: usize) -> Rows<'_, T> {
    Rows {
        data,
        map: packed_map(d),
    }
}

/// Additive masks over the first `s_masked` keys, in the kernel's dtype.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Masks<'a, T> {
    /// `(L, s_masked)`, or `(N·H, L, s_masked)` when the flag is set.
    pub attn: Option<(&'a [T], bool)>,
    /// `(N, s_masked)`.
    pub kpm: Option<&'a [T]>,
}

/// A tensor read by the kernels: its data and where its rows are.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a, T> {
    pub data: &'a [T],
    pub map: RowMap,
}

/// A tensor written by the kernels from several threads; every task writes its own rows.
#[derive(Clone, Copy)]
pub(crate) struct RowsMut<T> {
    ptr: *mut T,
    len: usize,
    pub map: RowMap,
}

// SAFETY: tasks write disjoint rows (see each kernel), and the buffer outlives the tasks.
unsafe impl<T: Send> Send for RowsMut<T> {}
unsafe impl<T: Send> Sync for RowsMut<T> {}

impl<T> RowsMut<T> {
    pub fn new(data: &mut [T], map: RowMap) -> Self {
        Self {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            map,
        }
    }

    /// Pointer to element `col` of row `(b, h, i)`.
    ///
    /// # Safety
    /// The element must be within the buffer.
    #[inline(always)]
    unsafe fn at(&self, b: usize, h: usize, i: usize, col: usize) -> *mut T {
        let idx = self.map.at(b, h, i) + col;
        debug_assert!(idx < self.len);
        self.ptr.add(idx)
    }
}

/// The dropout of one call in the kernel's dtype.
#[derive(Clone, Copy)]
struct Drop<T> {
    mask: DropoutMask,
    scale: T,
}

fn drop_of<T: Elem>(mask: Option<&DropoutMask>) -> Option<Drop<T>> {
    mask.map(|m| Drop {
        mask: *m,
        scale: T::from_f64(m.scale),
    })
}

/// The key tiles a query tile `[i0, i1)` needs: `(j0, cols, check_causal)`. Causal: keys
/// after the tile's last query are skipped, and only tiles crossing the diagonal are checked
/// element by element.
fn key_tiles(g: &Geom, i0: usize, i1: usize, bc: usize) -> Vec<(usize, usize, bool)> {
    let end = if g.causal {
        g.s_masked.min(i1)
    } else {
        g.s_masked
    };
    let mut tiles = Vec::new();
    for j0 in (0..end).step_by(bc) {
        let cols = bc.min(end - j0);
        tiles.push((j0, cols, g.causal && j0 + cols - 1 > i0));
    }
    for j0 in (g.s_masked..g.s).step_by(bc) {
        tiles.push((j0, bc.min(g.s - j0), false));
    }
    tiles
}

/// Scores of one tile: `s[r, c] = scale·q_{i0+r}·k_{j0+c}` plus the masks, `-inf` where
/// causal-masked. `s` has row stride `ld`.
#[allow(clippy::too_many_arguments)]
fn scores_tile<T: Elem>(
    g: &Geom,
    (b, h): (usize, usize),
    (i0, rows): (usize, usize),
    (j0, cols, check_causal): (usize, usize, bool),
    q: &Rows<T>,
    k: &Rows<T>,
    masks: &Masks<T>,
    s: &mut [T],
    ld: usize,
) {
    // SAFETY: rows i0..i0+rows of q and j0..j0+cols of k exist (tile bounds), each with d
    // contiguous elements; s holds rows × ld.
    unsafe {
        let qp = q.data.as_ptr().add(q.map.at(b, h, i0));
        let kp = k.data.as_ptr().add(k.map.at(b, h, j0));
        gemm(
            (rows, cols, g.d),
            (s.as_mut_ptr(), ld, 1),
            false,
            (qp, q.map.si, 1),
            (kp, 1, k.map.si),
            T::from_f64(g.scale),
            Threads::One,
        );
    }
    // Columns of this tile that masks apply to.
    let jm = g.s_masked.saturating_sub(j0).min(cols);
    if jm == 0 {
        return;
    }
    for r in 0..rows {
        let i = i0 + r;
        let row = &mut s[r * ld..r * ld + jm];
        if let Some((a, per_bh)) = masks.attn {
            let base = if per_bh {
                (b * g.h + h) * g.l * g.s_masked
            } else {
                0
            };
            let a = &a[base + i * g.s_masked + j0..][..jm];
            row.iter_mut().zip(a).for_each(|(x, m)| *x += *m);
        }
        if let Some(kp) = masks.kpm {
            let kp = &kp[b * g.s_masked + j0..][..jm];
            row.iter_mut().zip(kp).for_each(|(x, m)| *x += *m);
        }
        if check_causal {
            for (c, x) in row.iter_mut().enumerate() {
                if j0 + c > i {
                    *x = T::NEG_INF;
                }
            }
        }
    }
}

/// Element index of `(b, h, i, j)` in the `(N, H, L, S')` weights: the dropout counter.
#[inline(always)]
fn weight_index(g: &Geom, b: usize, h: usize, i: usize, j: usize) -> u64 {
    (((b * g.h + h) * g.l + i) * g.s + j) as u64
}

/// Scratch buffers of the forward tasks, made once per rayon job and reused by every task
/// (query tile, head) it runs.
struct TileBuffers<T> {
    /// One tile of scores / probabilities, `BR × BC`.
    s: Vec<T>,
    /// The unnormalised context, `BR × d`.
    acc: Vec<T>,
    /// Running row max and sum.
    m: Vec<T>,
    l: Vec<T>,
}

impl<T: Elem> TileBuffers<T> {
    fn new(d: usize) -> Self {
        Self {
            s: vec![T::ZERO; BR * BC],
            acc: vec![T::ZERO; BR * d],
            m: vec![T::NEG_INF; BR],
            l: vec![T::ZERO; BR],
        }
    }
}

/// One head's keys and values packed (the tile products run faster on contiguous rows),
/// kept across the query tiles of that head that a worker runs one after another: packing
/// per query tile would copy the whole head `L / BR` times.
struct HeadCache<T> {
    head: Option<(usize, usize)>,
    kb: Vec<T>,
    vb: Vec<T>,
}

impl<T: Elem> HeadCache<T> {
    fn new() -> Self {
        Self {
            head: None,
            kb: Vec::new(),
            vb: Vec::new(),
        }
    }

    /// Head `(b, h)` of k and v, packed (repacked only when the head changes).
    fn get(
        &mut self,
        g: &Geom,
        (b, h): (usize, usize),
        k: &Rows<T>,
        v: &Rows<T>,
    ) -> (Rows<'_, T>, Rows<'_, T>) {
        if self.head != Some((b, h)) {
            pack_head_into(k, (b, h), g.s, g.d, &mut self.kb);
            pack_head_into(v, (b, h), g.s, g.d, &mut self.vb);
            self.head = Some((b, h));
        }
        (packed_rows(&self.kb, g.d), packed_rows(&self.vb, g.d))
    }
}

/// Every head of `x` (rows `0..len`) packed into one `(N, H, len, d)` buffer, in parallel.
fn pack_all_heads<T: Elem>(g: &Geom, x: &Rows<T>, len: usize) -> Vec<T> {
    let d = g.d;
    let mut buf = vec![T::ZERO; g.n * g.h * len * d];
    buf.par_chunks_mut((len * d).max(1))
        .enumerate()
        .for_each(|(bh, dst)| {
            let (b, h) = (bh / g.h, bh % g.h);
            for (i, row) in dst.chunks_exact_mut(d.max(1)).enumerate() {
                let at = x.map.at(b, h, i);
                row.copy_from_slice(&x.data[at..at + d]);
            }
        });
    buf
}

/// A [`pack_all_heads`] buffer as rows.
fn all_heads_rows<'a, T>(g: &Geom, data: &'a [T], len: usize) -> Rows<'a, T> {
    Rows {
        data,
        map: RowMap {
            off: 0,
            sb: g.h * len * g.d,
            sh: len * g.d,
            si: g.d,
        },
    }
}

/// Where [`attend_tile`] leaves what the weights need: the exponentials `exp(s - m_t)` of
/// every key tile `t` (before dropout; rows `ld` apart) and the shift `m_t` of each row and
/// tile (`-inf` where the row had no unmasked key yet). The weights are then
/// `exp(s - m_t) · exp(m_t - lse)`: one exponential per row and tile instead of per element.
struct Kept<'a, T> {
    p: &'a mut [T],
    ld: usize,
    m: &'a mut [T],
    tiles: usize,
}

/// One query tile of one head: online softmax over the key tiles, output rows and lse
/// written; with `keep`, the tile's exponentials for the weights too. [`forward`] and
/// [`forward_with_weights`] both go through here, so the output does not depend on whether
/// the weights are asked for, to the bit.
#[allow(clippy::too_many_arguments)]
fn attend_tile<T: Elem>(
    g: &Geom,
    (b, h): (usize, usize),
    (i0, rows): (usize, usize),
    (q, k, v): (&Rows<T>, &Rows<T>, &Rows<T>),
    masks: &Masks<T>,
    drop: Option<&Drop<T>>,
    buf: &mut TileBuffers<T>,
    mut keep: Option<Kept<'_, T>>,
    (out, lse_out): (&RowsMut<T>, &RowsMut<T>),
) {
    let d = g.d;
    let TileBuffers { s, acc, m, l } = buf;
    let (acc, m, l) = (&mut acc[..rows * d], &mut m[..rows], &mut l[..rows]);
    acc.iter_mut().for_each(|x| *x = T::ZERO);
    m.iter_mut().for_each(|x| *x = T::NEG_INF);
    l.iter_mut().for_each(|x| *x = T::ZERO);
    for (t, tile) in key_tiles(g, i0, i0 + rows, BC).into_iter().enumerate() {
        let (j0, cols, _) = tile;
        scores_tile(g, (b, h), (i0, rows), tile, q, k, masks, s, BC);
        for r in 0..rows {
            let row = &mut s[r * BC..r * BC + cols];
            let m_new = T::row_max(row);
            let m_new = if m[r] > m_new { m[r] } else { m_new };
            if m_new == T::NEG_INF {
                // Every key so far masked: nothing to add.
                row.iter_mut().for_each(|x| *x = T::ZERO);
                if let Some(kp) = keep.as_mut() {
                    kp.p[r * kp.ld + j0..][..cols].copy_from_slice(row);
                    kp.m[r * kp.tiles + t] = T::NEG_INF;
                }
                continue;
            }
            let sum = T::exp_shift_sum(row, m_new);
            if let Some(kp) = keep.as_mut() {
                kp.p[r * kp.ld + j0..][..cols].copy_from_slice(row);
                kp.m[r * kp.tiles + t] = m_new;
            }
            if m[r] != m_new {
                let alpha = (m[r] - m_new).exp();
                l[r] *= alpha;
                acc[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= alpha);
                m[r] = m_new;
            }
            l[r] += sum;
            if let Some(dr) = drop {
                let i = i0 + r;
                for (c, x) in row.iter_mut().enumerate() {
                    let keep = dr.mask.keep(weight_index(g, b, h, i, j0 + c));
                    *x = if keep { *x * dr.scale } else { T::ZERO };
                }
            }
        }
        // SAFETY: acc is rows × d, s rows × BC (cols used), v rows j0..j0+cols exist.
        unsafe {
            let vp = v.data.as_ptr().add(v.map.at(b, h, j0));
            gemm(
                (rows, d, cols),
                (acc.as_mut_ptr(), d, 1),
                true,
                (s.as_ptr(), BC, 1),
                (vp, v.map.si, 1),
                T::ONE,
                Threads::One,
            );
        }
    }
    for r in 0..rows {
        // SAFETY: the caller's task is the only writer of output row (b, h, i0 + r) and of
        // lse (b, h, i0 + r); both are within their buffers.
        unsafe {
            let o = std::slice::from_raw_parts_mut(out.at(b, h, i0 + r, 0), d);
            let lse_i = lse_out.at(b, h, i0 + r, 0);
            if l[r] == T::ZERO {
                o.iter_mut().for_each(|x| *x = T::ZERO);
                *lse_i = T::INF;
            } else {
                let inv = T::ONE / l[r];
                o.iter_mut()
                    .zip(&acc[r * d..(r + 1) * d])
                    .for_each(|(x, a)| *x = *a * inv);
                *lse_i = m[r] + l[r].ln();
            }
        }
    }
}

/// The lse buffer `(N, H, L)` as rows of one element.
fn lse_rows<T>(g: &Geom, lse: &mut [T]) -> RowsMut<T> {
    RowsMut::new(
        lse,
        RowMap {
            off: 0,
            sb: g.h * g.l,
            sh: g.l,
            si: 1,
        },
    )
}

/// Fused forward: `out` rows get softmax(scale·q·kᵀ + masks)·v (dropped and rescaled as
/// [`DropoutMask`] says), `lse[(b·H + h)·L + i]` the row log-sum-exp; a row with every key
/// masked gets a zero output and `lse = +inf` (so that recomputed probabilities are 0).
/// Parallel over batch × heads × query tiles.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<T: Elem>(
    g: &Geom,
    q: Rows<T>,
    k: Rows<T>,
    v: Rows<T>,
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    out: RowsMut<T>,
    lse: &mut [T],
) {
    let drop = drop_of::<T>(dropout);
    let q_tiles = g.l.div_ceil(BR);
    let lse_out = lse_rows(g, lse);
    let init = || (TileBuffers::new(g.d), HeadCache::new());
    (0..g.n * g.h * q_tiles)
        .into_par_iter()
        .for_each_init(init, |(buf, cache), task| {
            let (bh, qt) = (task / q_tiles, task % q_tiles);
            let (b, h) = (bh / g.h, bh % g.h);
            let i0 = qt * BR;
            let rows = BR.min(g.l - i0);
            let (kh, vh) = cache.get(g, (b, h), &k, &v);
            attend_tile(
                g,
                (b, h),
                (i0, rows),
                (&q, &kh, &vh),
                &masks,
                drop.as_ref(),
                buf,
                None,
                (&out, &lse_out),
            );
        });
}

/// Probabilities of a scores tile from the row log-sum-exp: `p = exp(s - lse)` (0 for a
/// fully masked row, whose lse is +inf).
fn probs_tile<T: Elem>(s: &mut [T], ld: usize, rows: usize, cols: usize, lse: &[T]) {
    for r in 0..rows {
        T::exp_shift_sum(&mut s[r * ld..r * ld + cols], lse[r]);
    }
}

/// Fused backward: writes `dq`, `dk`, `dv` (any contents on entry; they may share one buffer,
/// as they do for the packed projection) from the output gradient `d_out`, the output `o` and
/// the forward's `lse`. Parallel over batch × heads: each task owns its heads' rows of the
/// three gradients.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Elem>(
    g: &Geom,
    (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
    o: Rows<T>,
    d_out: Rows<T>,
    lse: &[T],
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    (dq, dk, dv): (RowsMut<T>, RowsMut<T>, RowsMut<T>),
) {
    let drop = drop_of::<T>(dropout);
    let d = g.d;
    let scale = T::from_f64(g.scale);
    // Scratch of one rayon job, reused by the heads it runs: packed q, k, v, dO, the packed
    // gradients, and two tiles.
    let init = || {
        (
            [(); 7].map(|_| Vec::<T>::new()),
            vec![T::ZERO; BQ * BK],
            vec![T::ZERO; BQ * BK],
        )
    };
    (0..g.n * g.h)
        .into_par_iter()
        .for_each_init(init, |(bufs, s, dp), bh| {
            let (b, h) = (bh / g.h, bh % g.h);
            let lse = &lse[bh * g.l..(bh + 1) * g.l];
            // This head's rows of q, k, v and dO packed contiguously (the projections' rows are
            // 3E apart), and its gradients accumulated likewise, then written out once.
            let [qb, kb, vb, gb, dqb, dkb, dvb] = bufs;
            pack_head_into(&q, (b, h), g.l, d, qb);
            pack_head_into(&k, (b, h), g.s, d, kb);
            pack_head_into(&v, (b, h), g.s, d, vb);
            pack_head_into(&d_out, (b, h), g.l, d, gb);
            let packed = packed_map(d);
            let (q, k, v, d_out) = (
                packed_rows(qb, d),
                packed_rows(kb, d),
                packed_rows(vb, d),
                packed_rows(gb, d),
            );
            for (buf, len) in [(&mut *dqb, g.l), (&mut *dkb, g.s), (&mut *dvb, g.s)] {
                buf.clear();
                buf.resize(len * d, T::ZERO);
            }
            let (dq_all, dk_all, dv_all) = (&dq, &dk, &dv);
            let dq = RowsMut::new(dqb, packed);
            let dk = RowsMut::new(dkb, packed);
            let dv = RowsMut::new(dvb, packed);
            // D_i = Σ_t dO_it·O_it = Σ_j P̃_ij·dP̃_ij (P̃: the dropped probabilities).
            let dsum: Vec<T> = (0..g.l)
                .map(|i| {
                    let (oi, gi) = (o.map.at(b, h, i), i * d);
                    T::dot(&o.data[oi..oi + d], &d_out.data[gi..gi + d])
                })
                .collect();
            // Key tiles, each with the query tiles that see it.
            let mut key_tiles: Vec<(usize, usize, usize)> = Vec::new();
            for j0 in (0..g.s_masked).step_by(BK) {
                let first_q = if g.causal { j0 / BQ * BQ } else { 0 };
                key_tiles.push((j0, BK.min(g.s_masked - j0), first_q));
            }
            for j0 in (g.s_masked..g.s).step_by(BK) {
                key_tiles.push((j0, BK.min(g.s - j0), 0));
            }
            for (j0, cols, first_q) in key_tiles {
                let masked_tile = j0 < g.s_masked;
                for i0 in (first_q..g.l).step_by(BQ) {
                    let rows = BQ.min(g.l - i0);
                    let check = masked_tile && g.causal && j0 + cols - 1 > i0;
                    let tile = (j0, cols, check);
                    scores_tile(g, (b, h), (i0, rows), tile, &q, &k, &masks, s, BK);
                    probs_tile(s, BK, rows, cols, &lse[i0..i0 + rows]);
                    // SAFETY: d_out rows i0.. and v rows j0.. exist; dp is BK × BK.
                    unsafe {
                        gemm(
                            (rows, cols, d),
                            (dp.as_mut_ptr(), BK, 1),
                            false,
                            (
                                d_out.data.as_ptr().add(d_out.map.at(b, h, i0)),
                                d_out.map.si,
                                1,
                            ),
                            (v.data.as_ptr().add(v.map.at(b, h, j0)), 1, v.map.si),
                            T::ONE,
                            Threads::One,
                        );
                    }
                    // s: P → P̃ (what multiplied v); dp: dP̃ → dS = P∘(dP − D).
                    for r in 0..rows {
                        let i = i0 + r;
                        let (sr, dr) = (
                            &mut s[r * BK..r * BK + cols],
                            &mut dp[r * BK..r * BK + cols],
                        );
                        match &drop {
                            None => sr
                                .iter()
                                .zip(dr.iter_mut())
                                .for_each(|(p, x)| *x = *p * (*x - dsum[i])),
                            Some(dm) => {
                                for c in 0..cols {
                                    let keep = dm.mask.keep(weight_index(g, b, h, i, j0 + c));
                                    let z = if keep { dm.scale } else { T::ZERO };
                                    dr[c] = sr[c] * (dr[c] * z - dsum[i]);
                                    sr[c] *= z;
                                }
                            }
                        }
                    }
                    // SAFETY: the tiles are within this head's L and S' rows of the local buffers.
                    unsafe {
                        let dvp = dv.at(b, h, j0, 0);
                        let dkp = dk.at(b, h, j0, 0);
                        let dqp = dq.at(b, h, i0, 0);
                        debug_assert!(dv.map.at(b, h, j0 + cols - 1) + d <= dv.len);
                        debug_assert!(dk.map.at(b, h, j0 + cols - 1) + d <= dk.len);
                        debug_assert!(dq.map.at(b, h, i0 + rows - 1) + d <= dq.len);
                        // dV_j += P̃ᵀ·dO_i
                        gemm(
                            (cols, d, rows),
                            (dvp, dv.map.si, 1),
                            true,
                            (s.as_ptr(), 1, BK),
                            (
                                d_out.data.as_ptr().add(d_out.map.at(b, h, i0)),
                                d_out.map.si,
                                1,
                            ),
                            T::ONE,
                            Threads::One,
                        );
                        // dQ_i += scale·dS·K_j
                        gemm(
                            (rows, d, cols),
                            (dqp, dq.map.si, 1),
                            true,
                            (dp.as_ptr(), BK, 1),
                            (k.data.as_ptr().add(k.map.at(b, h, j0)), k.map.si, 1),
                            scale,
                            Threads::One,
                        );
                        // dK_j += scale·dSᵀ·Q_i
                        gemm(
                            (cols, d, rows),
                            (dkp, dk.map.si, 1),
                            true,
                            (dp.as_ptr(), 1, BK),
                            (q.data.as_ptr().add(q.map.at(b, h, i0)), q.map.si, 1),
                            scale,
                            Threads::One,
                        );
                    }
                }
            }
            for (all, local, len) in [
                (dq_all, &dqb, g.l),
                (dk_all, &dkb, g.s),
                (dv_all, &dvb, g.s),
            ] {
                for i in 0..len {
                    // SAFETY: this task is the only writer of the (b, h) rows of the gradients
                    // (they may share one buffer: the rows of other heads are other columns).
                    let dst = unsafe { std::slice::from_raw_parts_mut(all.at(b, h, i, 0), d) };
                    dst.copy_from_slice(&local[i * d..(i + 1) * d]);
                }
            }
        });
}

/// The weights buffer `(N, H, L, S')`, or `(N, L, S')` for the head mean (h ignored), as rows.
fn weight_rows<T>(g: &Geom, out: &mut [T], average: bool) -> RowsMut<T> {
    let (l, sk) = (g.l, g.s);
    RowsMut::new(
        out,
        RowMap {
            off: 0,
            sb: if average { l * sk } else { g.h * l * sk },
            sh: if average { 0 } else { l * sk },
            si: sk,
        },
    )
}

/// Stores the probabilities `p` of keys `j0..` of row `(b, h, i)` into the weights: dropped
/// and rescaled as the forward pass dropped them, then written, or added for the head mean.
///
/// # Safety
/// The caller's task must be the only writer of weight row `(b, ·, i)`.
#[allow(clippy::too_many_arguments)]
unsafe fn store_weights<T: Elem>(
    g: &Geom,
    (b, h, i): (usize, usize, usize),
    j0: usize,
    p: &[T],
    out: &RowsMut<T>,
    drop: Option<&Drop<T>>,
    average: bool,
) {
    let dst = std::slice::from_raw_parts_mut(out.at(b, h, i, j0), p.len());
    for (c, (x, p)) in dst.iter_mut().zip(p).enumerate() {
        let p = match drop {
            Some(dm) if !dm.mask.keep(weight_index(g, b, h, i, j0 + c)) => T::ZERO,
            Some(dm) => *p * dm.scale,
            None => *p,
        };
        if average {
            *x += p;
        } else {
            *x = p;
        }
    }
}

/// Divides the head sums of weight rows `(b, i0..i0 + rows)` by `H`.
///
/// # Safety
/// As [`store_weights`], for these rows.
unsafe fn finish_head_mean<T: Elem>(
    g: &Geom,
    out: &RowsMut<T>,
    b: usize,
    (i0, rows): (usize, usize),
) {
    let inv_h = T::from_f64(1.0 / g.h as f64);
    for r in 0..rows {
        let dst = std::slice::from_raw_parts_mut(out.at(b, 0, i0 + r, 0), g.s);
        dst.iter_mut().for_each(|x| *x *= inv_h);
    }
}

/// The attention weights from the forward's `lse`, written once: `(N, H, L, S')`, or the mean
/// over heads `(N, L, S')` when `average`, after dropout when `dropout` is given (as PyTorch
/// returns them). `out` must be zeroed. Parallel over batch × query tiles, heads inside, so
/// the head mean is accumulated in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weights<T: Elem>(
    g: &Geom,
    q: Rows<T>,
    k: Rows<T>,
    lse: &[T],
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    average: bool,
    out: &mut [T],
) {
    let drop = drop_of::<T>(dropout);
    let q_tiles = g.l.div_ceil(BR);
    let l = g.l;
    let out = weight_rows(g, out, average);
    (0..g.n * q_tiles).into_par_iter().for_each(|task| {
        let (b, qt) = (task / q_tiles, task % q_tiles);
        let i0 = qt * BR;
        let rows = BR.min(l - i0);
        let mut s = vec![T::ZERO; BR * BC];
        for h in 0..g.h {
            let lse = &lse[(b * g.h + h) * l + i0..][..rows];
            for tile in key_tiles(g, i0, i0 + rows, BC) {
                let (j0, cols, _) = tile;
                scores_tile(g, (b, h), (i0, rows), tile, &q, &k, &masks, &mut s, BC);
                probs_tile(&mut s, BC, rows, cols, lse);
                for r in 0..rows {
                    let p = &s[r * BC..r * BC + cols];
                    // SAFETY: this task is the only writer of rows (b, ·, i0..i0+rows).
                    unsafe {
                        store_weights(g, (b, h, i0 + r), j0, p, &out, drop.as_ref(), average)
                    };
                }
            }
        }
        if average {
            // SAFETY: as above.
            unsafe { finish_head_mean(g, &out, b, (i0, rows)) };
        }
    });
}

/// Forward and weights together, for calls that return the weights: [`attend_tile`] keeps
/// the raw scores of its query tile (`BR × S'`, never `L × S'`), from which the weights are
/// written once with the tile's lse. Compared with [`forward`] + [`weights`] it computes
/// `q·kᵀ` once. Outputs as in both; `weights_out` must be zeroed. Parallel over batch × query
/// tiles, heads inside (the head mean is accumulated in place).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_with_weights<T: Elem>(
    g: &Geom,
    (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    out: RowsMut<T>,
    lse: &mut [T],
    weights_out: &mut [T],
    average: bool,
) {
    let drop = drop_of::<T>(dropout);
    let q_tiles = g.l.div_ceil(BR);
    let (l, sk) = (g.l, g.s);
    let lse_out = lse_rows(g, lse);
    let w_out = weight_rows(g, weights_out, average);
    let ld = sk.max(1);
    // Heads run inside a task here (for the in-place head mean): pack every head once.
    let (kp, vp) = (pack_all_heads(g, &k, sk), pack_all_heads(g, &v, sk));
    let (k, v) = (all_heads_rows(g, &kp, sk), all_heads_rows(g, &vp, sk));
    // At most one tile per BC masked keys, plus the bias_k / zero-attention tile.
    let n_tiles = g.s_masked.div_ceil(BC) + (g.s - g.s_masked).div_ceil(BC);
    let init = || {
        (
            TileBuffers::new(g.d),
            vec![T::ZERO; BR * ld],
            vec![T::ZERO; BR * n_tiles.max(1)],
        )
    };
    (0..g.n * q_tiles)
        .into_par_iter()
        .for_each_init(init, |(buf, kept, kept_m), task| {
            let (b, qt) = (task / q_tiles, task % q_tiles);
            let i0 = qt * BR;
            let rows = BR.min(l - i0);
            let tiles = key_tiles(g, i0, i0 + rows, BC);
            for h in 0..g.h {
                let keep = Kept {
                    p: &mut kept[..],
                    ld,
                    m: &mut kept_m[..],
                    tiles: n_tiles,
                };
                attend_tile(
                    g,
                    (b, h),
                    (i0, rows),
                    (&q, &k, &v),
                    &masks,
                    drop.as_ref(),
                    buf,
                    Some(keep),
                    (&out, &lse_out),
                );
                for r in 0..rows {
                    let i = i0 + r;
                    // SAFETY: lse (b, h, i) was written above by this task.
                    let lse_i = unsafe { *lse_out.at(b, h, i, 0) };
                    let row = &mut kept[r * ld..(r + 1) * ld];
                    for (t, &(j0, c, _)) in tiles.iter().enumerate() {
                        let p = &mut row[j0..j0 + c];
                        // exp(s - m_t) · exp(m_t - lse): 0 for a fully masked row (lse = +inf).
                        let f = (kept_m[r * n_tiles + t] - lse_i).exp();
                        p.iter_mut().for_each(|x| *x *= f);
                        // SAFETY: this task is the only writer of weight rows (b, ·, i).
                        unsafe {
                            store_weights(g, (b, h, i), j0, p, &w_out, drop.as_ref(), average)
                        };
                    }
                }
            }
            if average {
                // SAFETY: as above.
                unsafe { finish_head_mean(g, &w_out, b, (i0, rows)) };
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(len: usize, seed: u64) -> Vec<f64> {
        (0..len as u64)
            .map(|i| {
                let x =
                    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D);
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// Attention gradients the textbook way (whole `L × S` matrices per head), row-major
    /// `(N, H, len, d)` inputs: `[dq, dk, dv]`.
    #[allow(clippy::too_many_arguments)]
    fn naive_grads(
        g: &Geom,
        (q, k, v): (&[f64], &[f64], &[f64]),
        d_out: &[f64],
        mask: Option<&DropoutMask>,
    ) -> [Vec<f64>; 3] {
        let (l, s, d) = (g.l, g.s, g.d);
        let mut out = [vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]];
        for bh in 0..g.n * g.h {
            let (b, h) = (bh / g.h, bh % g.h);
            let (qo, ko) = (bh * l * d, bh * s * d);
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            for i in 0..l {
                let qi = &q[qo + i * d..][..d];
                let seen: Vec<bool> = (0..s).map(|j| !(g.causal && j > i)).collect();
                let sc: Vec<f64> = (0..s)
                    .map(|j| g.scale * dot(qi, &k[ko + j * d..][..d]))
                    .collect();
                let m = (0..s)
                    .filter(|&j| seen[j])
                    .map(|j| sc[j])
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = (0..s)
                    .map(|j| if seen[j] { (sc[j] - m).exp() } else { 0.0 })
                    .collect();
                let z: f64 = e.iter().sum();
                let gi = &d_out[qo + i * d..][..d];
                let keep = |j: usize| match mask {
                    Some(mk) if !mk.keep(weight_index(g, b, h, i, j)) => 0.0,
                    Some(mk) => mk.scale,
                    None => 1.0,
                };
                // p, dP (through the dropout), D = Σ p·dP.
                let p: Vec<f64> = e
                    .iter()
                    .map(|x| if z > 0.0 { x / z } else { 0.0 })
                    .collect();
                let dp: Vec<f64> = (0..s)
                    .map(|j| keep(j) * dot(gi, &v[ko + j * d..][..d]))
                    .collect();
                let dsum: f64 = (0..s).map(|j| p[j] * dp[j]).sum();
                for j in 0..s {
                    let ds = p[j] * (dp[j] - dsum) * g.scale;
                    for c in 0..d {
                        out[0][qo + i * d + c] += ds * k[ko + j * d + c];
                        out[1][ko + j * d + c] += ds * qi[c];
                        out[2][ko + j * d + c] += p[j] * keep(j) * gi[c];
                    }
                }
            }
        }
        out
    }

    /// The backward pass gives the textbook gradients and writes every gradient row whatever
    /// the buffers held (NaN on entry gives the same gradients as zeros), across several
    /// tiles and where a row block gets no tile product at all (causal keys after the last
    /// query, no keys).
    #[test]
    fn backward_overwrites_every_gradient_row() {
        let contiguous = |len: usize, h: usize, d: usize| RowMap {
            off: 0,
            sb: h * len * d,
            sh: len * d,
            si: d,
        };
        // (l, s, causal, dropout); BQ = BK = 128, so 130 and 300 span several tiles.
        for (l, s, causal, p) in [
            (130, 300, true, None),
            (130, 300, false, Some(0.5)),
            (300, 130, true, None),
            (5, 0, false, None),
        ] {
            let (n, h, d) = (2, 2, 3);
            let g = Geom {
                n,
                h,
                l,
                s,
                d,
                s_masked: s,
                causal,
                scale: 0.5,
            };
            let (q, k, v) = (
                values(n * h * l * d, 1),
                values(n * h * s * d, 2),
                values(n * h * s * d, 3),
            );
            let (qm, km) = (contiguous(l, h, d), contiguous(s, h, d));
            let rows = |data, map| Rows { data, map };
            let mut out = vec![0.0; n * h * l * d];
            let mut lse = vec![0.0; n * h * l];
            let mask = p.map(|p| DropoutMask::new(p, 7).unwrap());
            forward(
                &g,
                rows(&q, qm),
                rows(&k, km),
                rows(&v, km),
                Masks::default(),
                mask.as_ref(),
                RowsMut::new(&mut out, qm),
                &mut lse,
            );
            let d_out = values(out.len(), 4);
            let grads = |fill: f64| {
                let mut dq = vec![fill; q.len()];
                let mut dk = vec![fill; k.len()];
                let mut dv = vec![fill; v.len()];
                backward(
                    &g,
                    (rows(&q, qm), rows(&k, km), rows(&v, km)),
                    rows(&out, qm),
                    rows(&d_out, qm),
                    &lse,
                    Masks::default(),
                    mask.as_ref(),
                    (
                        RowsMut::new(&mut dq, qm),
                        RowsMut::new(&mut dk, km),
                        RowsMut::new(&mut dv, km),
                    ),
                );
                [dq, dk, dv]
            };
            let (zeroed, garbage) = (grads(0.0), grads(f64::NAN));
            let want = naive_grads(&g, (&q, &k, &v), &d_out, mask.as_ref());
            for (name, (got, want)) in ["dq", "dk", "dv"].iter().zip(zeroed.iter().zip(&want)) {
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    err < 1e-12,
                    "(l, s, causal) = ({l}, {s}, {causal}): {name} off by {err:e}"
                );
            }
            for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(zeroed.iter().zip(&garbage)) {
                assert!(
                    a.iter().zip(b).all(|(a, b)| a == b),
                    "(l, s, causal) = ({l}, {s}, {causal}): {name} depends on the buffer's contents"
                );
            }
            // The causal keys no query sees get zero gradients, not left-overs.
            if causal && s > l {
                let j = contiguous(s, h, d).at(1, 1, s - 1);
                assert_eq!(&garbage[1][j..j + d], &[0.0; 3][..]);
            }
        }
    }
}
