//! The attention weights: from the forward's row log-sum-exp in a pass of their own
//! ([`weights`]), or together with the forward pass ([`forward_with_weights`]).
//!
//! Both fill every element of the weights buffer (its contents before are never read, so it
//! needs no zero fill): the first head of a row writes, the next ones add, with the head
//! mean's `1/H` folded into each head's factor (no pass over the weights at the end), and
//! the keys that no tile covers (past a causal query tile) get their zeros written.

use std::mem::MaybeUninit;

use super::forward::{attend_tile, lse_rows, Kept, TileBuffers};
use super::tiles::{
    drop_of, key_tiles, probs_tile, scores_tile, weight_index, AllHeadsKv, Drop, Keys, BC, BR,
};
use super::{Geom, Masks, RowMap, Rows, RowsMut};
use crate::cpu::par::for_each_init;
use crate::cpu::Elem;
use crate::nn::dropout::DropoutMask;

/// The weights buffer `(N, H, L, S')`, or `(N, L, S')` for the head mean (h ignored), as rows.
fn weight_rows<T>(g: &Geom, out: &mut [MaybeUninit<T>], average: bool) -> RowsMut<T> {
    let (l, sk) = (g.l, g.s);
    RowsMut::new_uninit(
        out,
        RowMap {
            off: 0,
            sb: if average { l * sk } else { g.h * l * sk },
            sh: if average { 0 } else { l * sk },
            si: sk,
        },
    )
}

/// The factor of every head's probabilities: `1/H` for the head mean, else 1.
fn head_factor<T: Elem>(g: &Geom, average: bool) -> T {
    match average {
        true => T::from_f64(1.0 / g.h as f64),
        false => T::ONE,
    }
}

/// Stores the probabilities `f·p` of keys `j0..` of row `(b, h, i)` into the weights: dropped
/// and rescaled as the forward pass dropped them, then written (the row's first store) or
/// added (`add`: a later head of the head mean).
///
/// # Safety
/// The caller's task must be the only writer of weight row `(b, ·, i)`.
#[allow(clippy::too_many_arguments)]
unsafe fn store_weights<T: Elem>(
    g: &Geom,
    (b, h, i): (usize, usize, usize),
    j0: usize,
    (p, f): (&[T], T),
    out: &RowsMut<T>,
    drop: Option<&Drop<T>>,
    add: bool,
) {
    let dst = std::slice::from_raw_parts_mut(out.at(b, h, i, j0), p.len());
    let Some(dm) = drop else {
        return T::scale_row(dst, p, f, add);
    };
    for (c, (x, p)) in dst.iter_mut().zip(p).enumerate() {
        let p = match dm.mask.keep(weight_index(g, b, h, i, j0 + c)) {
            true => *p * (f * dm.scale),
            false => T::ZERO,
        };
        if add {
            *x += p;
        } else {
            *x = p;
        }
    }
}

/// Writes zeros into the keys of weight row `(b, h, i)` that none of `tiles` covers (keys after
/// a causal query tile's last query): the row's first store, which must leave no element
/// unwritten.
///
/// # Safety
/// As [`store_weights`].
unsafe fn zero_uncovered<T: Elem>(
    g: &Geom,
    (b, h, i): (usize, usize, usize),
    tiles: &[(usize, usize, bool)],
    out: &RowsMut<T>,
) {
    let zero = |from: usize, to: usize| {
        if to > from {
            std::slice::from_raw_parts_mut(out.at(b, h, i, from), to - from).fill(T::ZERO);
        }
    };
    let mut next = 0;
    for &(j0, cols, _) in tiles {
        zero(next, j0);
        next = j0 + cols;
    }
    zero(next, g.s);
}

/// The attention weights from the forward's `lse`, written once: `(N, H, L, S')`, or the mean
/// over heads `(N, L, S')` when `average`, after dropout when `dropout` is given (as PyTorch
/// returns them). Every element of `out` is written. Parallel over batch × query tiles, heads
/// inside, so the head mean is accumulated in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weights<T: Elem>(
    g: &Geom,
    q: Rows<T>,
    k: Rows<T>,
    lse: &[T],
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    average: bool,
    out: &mut [MaybeUninit<T>],
) {
    let drop = drop_of::<T>(dropout);
    let f = head_factor::<T>(g, average);
    let q_tiles = g.l.div_ceil(BR);
    let l = g.l;
    let out = weight_rows(g, out, average);
    for_each_init(
        g.n * q_tiles,
        g.parallel(),
        || (),
        |_, task| {
            let (b, qt) = (task / q_tiles, task % q_tiles);
            let i0 = qt * BR;
            let rows = BR.min(l - i0);
            let mut s = vec![T::ZERO; BR * BC];
            let tiles = key_tiles(g, i0, i0 + rows, BC);
            for h in 0..g.h {
                let add = average && h > 0;
                if !add {
                    for r in 0..rows {
                        // SAFETY: this task is the only writer of rows (b, ·, i0..i0+rows).
                        unsafe { zero_uncovered(g, (b, h, i0 + r), &tiles, &out) };
                    }
                }
                let lse = &lse[(b * g.h + h) * l + i0..][..rows];
                for &tile in &tiles {
                    let (j0, cols, _) = tile;
                    scores_tile(
                        g,
                        (b, h),
                        (i0, rows),
                        tile,
                        &q,
                        Keys::Rows(&k),
                        &masks,
                        &mut s,
                        BC,
                    );
                    probs_tile(&mut s, BC, rows, cols, lse);
                    for r in 0..rows {
                        let p = &s[r * BC..r * BC + cols];
                        // SAFETY: this task is the only writer of rows (b, ·, i0..i0+rows).
                        unsafe {
                            store_weights(g, (b, h, i0 + r), j0, (p, f), &out, drop.as_ref(), add)
                        };
                    }
                }
            }
        },
    );
}

/// Forward and weights together, for calls that return the weights: [`attend_tile`] keeps
/// the raw scores of its query tile (`BR × S'`, never `L × S'`), from which the weights are
/// written once with the tile's lse. Compared with [`forward`](super::forward) + [`weights`] it computes
/// `q·kᵀ` once. Outputs as in both (every element of `weights_out` written). Parallel over
/// batch × query tiles, heads inside (the head mean is accumulated in place).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_with_weights<T: Elem>(
    g: &Geom,
    (q, k, v): (Rows<T>, Rows<T>, Rows<T>),
    masks: Masks<T>,
    dropout: Option<&DropoutMask>,
    out: RowsMut<T>,
    lse: &mut [T],
    weights_out: &mut [MaybeUninit<T>],
    average: bool,
) {
    let drop = drop_of::<T>(dropout);
    let head_f = head_factor::<T>(g, average);
    let q_tiles = g.l.div_ceil(BR);
    let (l, sk) = (g.l, g.s);
    let lse_out = lse_rows(g, lse);
    let w_out = weight_rows(g, weights_out, average);
    let ld = sk.max(1);
    // Heads run inside a task here (for the in-place head mean): pack every head once.
    let kv = AllHeadsKv::new(g, &k, &v);
    // At most one tile per BC masked keys, plus the bias_k / zero-attention tile.
    let n_tiles = g.s_masked.div_ceil(BC) + (g.s - g.s_masked).div_ceil(BC);
    let init = || {
        (
            TileBuffers::new(g.d),
            vec![T::ZERO; BR * ld],
            vec![T::ZERO; BR * n_tiles.max(1)],
        )
    };
    // Query tiles per task: the heads run inside a task (for the in-place head mean), so a task
    // of one tile streamed every head's kᵀ and v through the caches per 64 rows; a few tiles
    // per head read them once for all (while leaving several tasks per thread).
    let threads = rayon::current_num_threads().max(1);
    let per_task = (1..=4)
        .rev()
        .find(|&t| g.n * q_tiles.div_ceil(t) >= 4 * threads)
        .unwrap_or(1);
    let blocks = q_tiles.div_ceil(per_task);
    for_each_init(
        g.n * blocks,
        g.parallel(),
        init,
        |(buf, kept, kept_m), task| {
            let (b, block) = (task / blocks, task % blocks);
            let (qt0, qt1) = (block * per_task, ((block + 1) * per_task).min(q_tiles));
            for h in 0..g.h {
                let add = average && h > 0;
                for qt in qt0..qt1 {
                    let i0 = qt * BR;
                    let rows = BR.min(l - i0);
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
                        &q,
                        kv.head(b, h),
                        &masks,
                        drop.as_ref(),
                        buf,
                        Some(keep),
                        (&out, &lse_out),
                    );
                    let tiles = key_tiles(g, i0, i0 + rows, BC);
                    for r in 0..rows {
                        let i = i0 + r;
                        if !add {
                            // SAFETY: this task is the only writer of weight rows (b, ·, i).
                            unsafe { zero_uncovered(g, (b, h, i), &tiles, &w_out) };
                        }
                        // SAFETY: lse (b, h, i) was written above by this task.
                        let lse_i = unsafe { *lse_out.at(b, h, i, 0) };
                        let row = &kept[r * ld..(r + 1) * ld];
                        for (t, &(j0, c, _)) in tiles.iter().enumerate() {
                            // exp(s - m_t) · exp(m_t - lse): 0 for a fully masked row (lse = +inf).
                            let f = (kept_m[r * n_tiles + t] - lse_i).exp() * head_f;
                            // SAFETY: this task is the only writer of weight rows (b, ·, i).
                            unsafe {
                                store_weights(
                                    g,
                                    (b, h, i),
                                    j0,
                                    (&row[j0..j0 + c], f),
                                    &w_out,
                                    drop.as_ref(),
                                    add,
                                )
                            };
                        }
                    }
                }
            }
        },
    );
}
