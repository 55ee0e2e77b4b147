//! The forward pass: online softmax over key tiles per query tile, output rows and the row
//! log-sum-exp written (FlashAttention-2's order).

use super::panels::gemm_panels;
use super::tiles::{
    causal_blocks, drop_of, key_tiles, scores_tile, weight_index, AllHeadsKv, Drop, HeadKv, Keys,
    BC, BR,
};
use super::{Geom, Masks, RowMap, Rows, RowsMut};
use crate::cpu::par::for_each_init;
use crate::cpu::Elem;
use crate::nn::dropout::DropoutMask;

/// Scratch buffers of the forward tasks, made once per rayon job and reused by every task
/// (query tile, head) it runs.
pub(super) struct TileBuffers<T> {
    /// One tile of scores / probabilities, `BR × BC`.
    s: Vec<T>,
    /// The unnormalised context, `BR × d`.
    acc: Vec<T>,
    /// Running row max and sum.
    m: Vec<T>,
    l: Vec<T>,
}

impl<T: Elem> TileBuffers<T> {
    pub(super) fn new(d: usize) -> Self {
        Self {
            s: vec![T::ZERO; BR * BC],
            acc: vec![T::ZERO; BR * d],
            m: vec![T::NEG_INF; BR],
            l: vec![T::ZERO; BR],
        }
    }
}

/// Where [`attend_tile`] leaves what the weights need: the exponentials `exp(s - m_t)` of
/// every key tile `t` (before dropout; rows `ld` apart) and the shift `m_t` of each row and
/// tile (`-inf` where the row had no unmasked key yet). The weights are then
/// `exp(s - m_t) · exp(m_t - lse)`: one exponential per row and tile instead of per element.
pub(super) struct Kept<'a, T> {
    pub p: &'a mut [T],
    pub ld: usize,
    pub m: &'a mut [T],
    pub tiles: usize,
}

/// One query tile of one head: online softmax over the key tiles, output rows and lse
/// written; with `keep`, the tile's exponentials for the weights too. [`forward`] and
/// [`forward_with_weights`](super::forward_with_weights) both go through here, so the output does not depend on whether
/// the weights are asked for, to the bit.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_tile<T: Elem>(
    g: &Geom,
    (b, h): (usize, usize),
    (i0, rows): (usize, usize),
    q: &Rows<T>,
    kv: HeadKv<'_, T>,
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
        scores_tile(
            g,
            (b, h),
            (i0, rows),
            tile,
            q,
            Keys::Panels(kv.kt),
            masks,
            s,
            BC,
        );
        let mut factors = [T::ZERO; BC];
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
                // x·0 = 0 where dropped: the probabilities are finite.
                let f = &mut factors[..cols];
                dr.mask.factors_into(weight_index(g, b, h, i0 + r, j0), f);
                row.iter_mut().zip(&*f).for_each(|(x, f)| *x *= *f);
            }
        }
        // Past the diagonal the probabilities are 0: each block of rows multiplies only the
        // keys it sees.
        for (r0, r1, needed) in causal_blocks((i0, rows), tile) {
            // SAFETY: acc is rows × d, s rows × BC (cols used), v rows j0..j0+cols exist.
            unsafe {
                gemm_panels(
                    (r1 - r0, d, needed),
                    (acc.as_mut_ptr().add(r0 * d), d),
                    true,
                    (s.as_ptr().add(r0 * BC), BC, 1),
                    (kv.v, (j0, 0)),
                    T::ONE,
                );
            }
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
pub(super) fn lse_rows<T>(g: &Geom, lse: &mut [T]) -> RowsMut<T> {
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
    // Every head's keys and values packed once, before the tasks (a per-worker cache of the
    // last head repacked whenever rayon split or stole work).
    let kv = AllHeadsKv::new(g, &k, &v);
    for_each_init(
        g.n * g.h * q_tiles,
        g.parallel(),
        || TileBuffers::new(g.d),
        |buf, task| {
            let (bh, qt) = (task / q_tiles, task % q_tiles);
            let (b, h) = (bh / g.h, bh % g.h);
            let i0 = qt * BR;
            let rows = BR.min(g.l - i0);
            attend_tile(
                g,
                (b, h),
                (i0, rows),
                &q,
                kv.head(b, h),
                &masks,
                drop.as_ref(),
                buf,
                None,
                (&out, &lse_out),
            );
        },
    );
}
