//! What the forward, backward and weights passes share: tile sizes, packed heads, the dropout
//! in the kernel's dtype, the key tiles of a query tile, a scores tile and its probabilities.

use rayon::prelude::*;

use super::{Geom, Masks, RowMap, Rows};
use crate::attention::dropout::DropoutMask;
use crate::cpu::workspace::{self, Buf};
use crate::cpu::{gemm, Elem, Threads};

/// Query rows per forward (and weights) tile.
pub(super) const BR: usize = 64;
/// Key columns per forward (and weights) tile.
pub(super) const BC: usize = 256;

/// Rows `0..len` of head `(b, h)` of `x`, copied contiguously (`len × d`) into `buf`: the
/// projections' rows are `3E` apart, and the tile products run faster on packed rows. The
/// buffer is reused across tasks (large fresh allocations cost page faults).
pub(super) fn pack_head_into<T: Elem>(
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
pub(super) fn packed_map(d: usize) -> RowMap {
    RowMap {
        off: 0,
        sb: 0,
        sh: 0,
        si: d,
    }
}

/// A [`pack_head_into`] buffer as rows.
pub(super) fn packed_rows<T>(data: &[T], d: usize) -> Rows<'_, T> {
    Rows {
        data,
        map: packed_map(d),
    }
}

/// The dropout of one call in the kernel's dtype.
#[derive(Clone, Copy)]
pub(super) struct Drop<T> {
    pub mask: DropoutMask,
    pub scale: T,
}

pub(super) fn drop_of<T: Elem>(mask: Option<&DropoutMask>) -> Option<Drop<T>> {
    mask.map(|m| Drop {
        mask: *m,
        scale: T::from_f64(m.scale),
    })
}

/// The key tiles a query tile `[i0, i1)` needs: `(j0, cols, check_causal)`. Causal: keys
/// after the tile's last query are skipped, and only tiles crossing the diagonal are checked
/// element by element.
pub(super) fn key_tiles(g: &Geom, i0: usize, i1: usize, bc: usize) -> Vec<(usize, usize, bool)> {
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

/// The keys of a scores tile: their rows, or (for the unpacked product of `cpu::gemm`, whose
/// right operand must be read by rows) this head's keys transposed: `kᵀ[p·ld + j]`, row
/// stride `ld` (see [`transpose_into`]).
#[derive(Clone, Copy)]
pub(super) enum Keys<'a, T> {
    Rows(&'a Rows<'a, T>),
    Transposed(&'a [T], usize),
}

/// Rows `0..len` of `x` (one head's, packed: `len × d`) transposed into `buf` (`d` rows of
/// `len`), returning the row stride: `len` rounded up to 16 elements and then to an odd
/// multiple of 16, so that consecutive rows start in different L1 cache sets (with a stride of
/// 2048 floats every row of a tile fell into one set, and the product ran at half speed).
pub(super) fn transpose_into<T: Elem>(x: &[T], len: usize, d: usize, buf: &mut Vec<T>) -> usize {
    let mut ld = len.div_ceil(16) * 16;
    if (ld / 16).is_multiple_of(2) {
        ld += 16;
    }
    buf.clear();
    buf.resize(ld * d, T::ZERO);
    for (j, row) in x[..len * d].chunks_exact(d.max(1)).enumerate() {
        for (p, &v) in row.iter().enumerate() {
            buf[p * ld + j] = v;
        }
    }
    ld
}

/// Scores of one tile: `s[r, c] = scale·q_{i0+r}·k_{j0+c}` plus the masks, `-inf` where
/// causal-masked. `s` has row stride `ld`.
#[allow(clippy::too_many_arguments)]
pub(super) fn scores_tile<T: Elem>(
    g: &Geom,
    (b, h): (usize, usize),
    (i0, rows): (usize, usize),
    (j0, cols, check_causal): (usize, usize, bool),
    q: &Rows<T>,
    k: Keys<T>,
    masks: &Masks<T>,
    s: &mut [T],
    ld: usize,
) {
    // SAFETY: rows i0..i0+rows of q and keys j0..j0+cols exist (tile bounds), each with d
    // elements; s holds rows × ld.
    unsafe {
        let qp = q.data.as_ptr().add(q.map.at(b, h, i0));
        let rhs = match k {
            Keys::Rows(k) => (k.data.as_ptr().add(k.map.at(b, h, j0)), 1, k.map.si),
            Keys::Transposed(kt, len) => (kt.as_ptr().add(j0), len, 1),
        };
        gemm(
            (rows, cols, g.d),
            (s.as_mut_ptr(), ld, 1),
            false,
            (qp, q.map.si, 1),
            rhs,
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
pub(super) fn weight_index(g: &Geom, b: usize, h: usize, i: usize, j: usize) -> u64 {
    (((b * g.h + h) * g.l + i) * g.s + j) as u64
}

/// Every head of `x` (rows `0..len`) packed into one `(N, H, len, d)` buffer, in parallel:
/// a pooled one (every element written), back in the pool when dropped.
pub(super) fn pack_all_heads<T: Elem>(g: &Geom, x: &Rows<T>, len: usize) -> Buf<T> {
    let d = g.d;
    let mut buf = workspace::take::<T>(g.n * g.h * len * d);
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
pub(super) fn all_heads_rows<'a, T>(g: &Geom, data: &'a [T], len: usize) -> Rows<'a, T> {
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

/// Probabilities of a scores tile from the row log-sum-exp: `p = exp(s - lse)` (0 for a
/// fully masked row, whose lse is +inf).
pub(super) fn probs_tile<T: Elem>(s: &mut [T], ld: usize, rows: usize, cols: usize, lse: &[T]) {
    for r in 0..rows {
        T::exp_shift_sum(&mut s[r * ld..r * ld + cols], lse[r]);
    }
}
