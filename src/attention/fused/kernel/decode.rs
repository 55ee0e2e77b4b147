//! The few-query kernel of incremental decoding: `T` new queries (one per decoding step, a
//! few for a prompt block) of each (batch, head) against that head's cached keys, with the
//! scores of a block of queries materialised (`rows × S'`, never padded to a 64-row tile)
//! and normalised exactly, as the reference does. The flash forward's tiles are sized for
//! long query sequences; a single query row would leave 63 of its 64 tile rows idle and
//! repack the whole head's keys per call.

use rayon::prelude::*;

use super::small_gemm::tile_gemm;
use super::Rows;
use crate::cpu::Elem;

/// Queries per block: the scores scratch is `ROWS × S'`.
const ROWS: usize = 32;

/// Sizes of one decoding call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeGeom {
    /// Batch `N`.
    pub n: usize,
    /// Heads `H`.
    pub h: usize,
    /// New queries `T`.
    pub t: usize,
    /// Keys `S'`: the positions, then the `bias_k` / zero-attention rows.
    pub s: usize,
    /// Positions (the keys masks apply to).
    pub s_masked: usize,
    /// Head dim.
    pub d: usize,
    /// Query `i` sees position `j` only when `j ≤ offset + i`; `None`: every position.
    pub causal_offset: Option<usize>,
    /// Factor of `q·k` (`1/√d`).
    pub scale: f64,
}

/// Attention of every query row over its head's keys: `out (N, H, T, d)` contiguous gets the
/// context, `probs (N, H, T, S')` (when given) the probabilities. A row with every key masked
/// gets zero probabilities and a zero context. `kpm` is the additive key padding, row `b` at
/// `b · stride`, over the first `s_masked` keys.
pub(crate) fn decode<T: Elem>(
    g: &DecodeGeom,
    (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
    kpm: Option<(&[T], usize)>,
    out: &mut [T],
    probs: Option<&mut [T]>,
) {
    let (t, s, d) = (g.t, g.s, g.d);
    if g.n * g.h * t == 0 || d == 0 {
        return;
    }
    // `whole`: `probs` is the head's `T × S'` output; else a `ROWS × S'` scratch block.
    let head = |bh: usize, out: &mut [T], probs: &mut [T], whole: bool| {
        let (b, h) = (bh / g.h, bh % g.h);
        for r0 in (0..t).step_by(ROWS) {
            let rows = ROWS.min(t - r0);
            // The scores block: in the probabilities output when asked for, else scratch.
            let sb = match whole {
                true => &mut probs[r0 * s..(r0 + rows) * s],
                false => &mut probs[..rows * s],
            };
            block(
                g,
                (b, h),
                (r0, rows),
                (&q, &k, &v),
                kpm,
                sb,
                &mut out[r0 * d..],
            );
        }
    };
    // Small work (a decoding step of a small model): the heads one after another on the
    // calling thread, where waking the pool would cost more (`crate::cpu::par`).
    let serial = !crate::cpu::par::parallel(g.n * g.h * t * s * d);
    let scratch = || vec![T::ZERO; ROWS.min(t) * s];
    match (probs, serial) {
        (Some(p), true) => out
            .chunks_mut(t * d)
            .zip(p.chunks_mut(t * s.max(1)))
            .enumerate()
            .for_each(|(bh, (o, p))| head(bh, o, p, true)),
        (Some(p), false) => out
            .par_chunks_mut(t * d)
            .zip(p.par_chunks_mut(t * s.max(1)))
            .enumerate()
            .for_each(|(bh, (o, p))| head(bh, o, p, true)),
        (None, true) => {
            let mut buf = scratch();
            out.chunks_mut(t * d)
                .enumerate()
                .for_each(|(bh, o)| head(bh, o, &mut buf, false))
        }
        (None, false) => out
            .par_chunks_mut(t * d)
            .enumerate()
            .for_each_init(scratch, |buf, (bh, o)| head(bh, o, buf, false)),
    }
}

/// One block of `rows` queries from `r0` of head `(b, h)`: scores into `sb` (`rows × S'`),
/// masked and normalised in place, then the context rows into `out` (row `r0` first).
fn block<T: Elem>(
    g: &DecodeGeom,
    (b, h): (usize, usize),
    (r0, rows): (usize, usize),
    (q, k, v): (&Rows<T>, &Rows<T>, &Rows<T>),
    kpm: Option<(&[T], usize)>,
    sb: &mut [T],
    out: &mut [T],
) {
    let (s, d, sm) = (g.s, g.d, g.s_masked);
    // Positions no query of the block sees (a prompt block's causal upper triangle beyond
    // its last row) are neither multiplied nor added: a prompt costs half the products.
    let vis = match g.causal_offset {
        Some(off) => (off + r0 + rows).min(sm),
        None => sm,
    };
    // Scores of the visible positions, then of the extra rows (after every position).
    for (j0, cols) in [(0, vis), (sm, s - sm)] {
        if cols == 0 {
            continue; // (and no pointer past the head's rows)
        }
        // SAFETY: q rows r0..r0+rows and k rows j0..j0+cols of head (b, h) exist with d
        // contiguous elements each (checked by the caller's layouts); sb is rows × s.
        unsafe {
            tile_gemm(
                (rows, cols, d),
                (sb.as_mut_ptr().add(j0), s, 1),
                false,
                (q.data.as_ptr().add(q.map.at(b, h, r0)), q.map.si, 1),
                (k.data.as_ptr().add(k.map.at(b, h, j0)), 1, k.map.si),
                T::from_f64(g.scale),
            );
        }
    }
    for r in 0..rows {
        let row = &mut sb[r * s..(r + 1) * s];
        let masked = &mut row[..sm];
        if let Some((m, stride)) = kpm {
            let m = &m[b * stride..][..vis];
            masked[..vis].iter_mut().zip(m).for_each(|(x, m)| *x += *m);
        }
        if let Some(off) = g.causal_offset {
            // Up to `vis` the row's own causal limit; after it, never computed.
            let first_hidden = (off + r0 + r + 1).min(sm);
            masked[first_hidden..]
                .iter_mut()
                .for_each(|x| *x = T::NEG_INF);
        }
        let max = T::row_max(row);
        if max == T::NEG_INF {
            // Every key masked: zero weights, zero context (the crate's rule).
            row.iter_mut().for_each(|x| *x = T::ZERO);
            continue;
        }
        let inv = T::ONE / T::exp_shift_sum(row, max);
        row.iter_mut().for_each(|x| *x *= inv);
    }
    // The context: the visible positions, then the extra rows (the hidden ones are 0). The
    // caller's `out` starts zeroed, so a part without keys may be skipped.
    for (j0, cols, acc) in [(0, vis, false), (sm, s - sm, vis > 0)] {
        if cols == 0 {
            continue;
        }
        // SAFETY: v rows j0..j0+cols of head (b, h) exist with d contiguous elements; sb is
        // rows × s, out rows × d.
        unsafe {
            tile_gemm(
                (rows, d, cols),
                (out.as_mut_ptr(), d, 1),
                acc,
                (sb.as_ptr().add(j0), s, 1),
                (v.data.as_ptr().add(v.map.at(b, h, j0)), v.map.si, 1),
                T::ONE,
            );
        }
    }
}
