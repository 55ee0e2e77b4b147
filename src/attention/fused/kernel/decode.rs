//! The few-query kernel of incremental decoding: `T` new queries (one per decoding step, a
//! few for a prompt block) of each (batch, head) against that head's cached keys, with the
//! scores of a block of queries materialised (`rows × S'`, never padded to a 64-row tile)
//! and normalised exactly, as the reference does. The flash forward's tiles are sized for
//! long query sequences; a single query row would leave 63 of its 64 tile rows idle and
//! repack the whole head's keys per call.

use rayon::prelude::*;

use super::Rows;
use crate::cpu::{gemm, Elem, Threads};

/// Queries per block: the scores scratch is `ROWS × S'`.
const ROWS: usize = 32;

/// Below this many multiply-adds (`N·H·T·S'·d`) the heads run one after another on the
/// calling thread: waking the pool costs more than a decoding step of a small model.
const SERIAL_BELOW: usize = 1 << 18;

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
    let serial = g.n * g.h * t * s * d < SERIAL_BELOW;
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
    let (s, d) = (g.s, g.d);
    // SAFETY: q rows r0..r0+rows and k rows 0..s of head (b, h) exist with d contiguous
    // elements each (checked by the caller's layouts); sb is rows × s.
    unsafe {
        gemm(
            (rows, s, d),
            (sb.as_mut_ptr(), s, 1),
            false,
            (q.data.as_ptr().add(q.map.at(b, h, r0)), q.map.si, 1),
            (k.data.as_ptr().add(k.map.at(b, h, 0)), 1, k.map.si),
            T::from_f64(g.scale),
            Threads::One,
        );
    }
    for r in 0..rows {
        let row = &mut sb[r * s..(r + 1) * s];
        let masked = &mut row[..g.s_masked];
        if let Some((m, stride)) = kpm {
            let m = &m[b * stride..][..g.s_masked];
            masked.iter_mut().zip(m).for_each(|(x, m)| *x += *m);
        }
        if let Some(off) = g.causal_offset {
            let first_hidden = (off + r0 + r + 1).min(g.s_masked);
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
    // SAFETY: v rows 0..s of head (b, h) exist with d contiguous elements; sb is rows × s,
    // out rows × d.
    unsafe {
        gemm(
            (rows, d, s),
            (out.as_mut_ptr(), d, 1),
            false,
            (sb.as_ptr(), s, 1),
            (v.data.as_ptr().add(v.map.at(b, h, 0)), v.map.si, 1),
            T::ONE,
            Threads::One,
        );
    }
}
