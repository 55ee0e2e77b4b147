//! What the forward, backward and weights passes share: tile sizes, packed heads, the dropout
//! in the kernel's dtype, the key tiles of a query tile, a scores tile and its probabilities.

use super::panels::{gemm_panels, pack_rows, pack_transposed, panels_len, Panels};
use super::small_gemm::tile_gemm;
use super::{Geom, Masks, RowMap, Rows};
use crate::cpu::par::for_each_chunk_mut;
use crate::cpu::workspace::{self, Buf};
use crate::cpu::Elem;
use crate::nn::dropout::DropoutMask;

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

/// The keys of a scores tile: their rows, or this head's keys transposed and packed in panels
/// (`kᵀ`, `d × S'`; see [`pack_head_panels`]), as the tile products read them fastest.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a, T> {
    Rows(&'a Rows<'a, T>),
    Panels(Panels<'a, T>),
}

/// Elements of one head's `len × d` rows packed in panels, or of their transpose.
fn head_panels_len(len: usize, d: usize, transposed: bool) -> usize {
    match transposed {
        true => panels_len(d, len),
        false => panels_len(len, d),
    }
}

/// Rows `0..len` of head `(b, h)` of `x` packed in panels into `dst` (all
/// [`head_panels_len`] elements written): as they are (`len × d`: the right operand of the
/// products by `v` in the forward pass, by `k`, `q` and `dO` in the backward pass) or
/// `transposed` (`d × len`: the keys of `q·kᵀ`, the values of `dO·vᵀ`).
fn pack_head<T: Elem>(
    x: &Rows<T>,
    (b, h): (usize, usize),
    (len, d): (usize, usize),
    transposed: bool,
    dst: &mut [T],
) {
    let row = |i: usize| &x.data[x.map.at(b, h, i)..];
    match transposed {
        true => pack_transposed(len, d, row, dst),
        false => pack_rows(len, d, row, dst),
    }
}

/// [`pack_head`] into a reused buffer (large fresh buffers cost page faults).
pub(super) fn pack_head_panels<T: Elem>(
    x: &Rows<T>,
    bh: (usize, usize),
    (len, d): (usize, usize),
    transposed: bool,
    buf: &mut Vec<T>,
) {
    buf.resize(head_panels_len(len, d, transposed), T::ZERO);
    pack_head(x, bh, (len, d), transposed, buf);
}

/// Rows per block of a tile crossing the causal diagonal.
const CAUSAL_BLOCK: usize = 16;

/// The row blocks `(r0, r1, keys)` of a tile of queries `i0..i0 + rows` and keys
/// `j0..j0 + cols`: the whole tile when it does not cross the causal diagonal, else blocks of
/// [`CAUSAL_BLOCK`] rows with the keys their last query sees (`j ≤ i`; none: no block). A
/// 64-row tile on the diagonal computes 5/8 of its square instead of all of it.
pub(super) fn causal_blocks(
    (i0, rows): (usize, usize),
    (j0, cols, check_causal): (usize, usize, bool),
) -> impl Iterator<Item = (usize, usize, usize)> {
    let step = if check_causal {
        CAUSAL_BLOCK
    } else {
        rows.max(1)
    };
    (0..rows).step_by(step).filter_map(move |r0| {
        let r1 = (r0 + step).min(rows);
        let needed = match check_causal {
            true => (i0 + r1).saturating_sub(j0).min(cols),
            false => cols,
        };
        (needed > 0).then_some((r0, r1, needed))
    })
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
    // A tile crossing the diagonal: only the keys each block of rows can see (the rest is set
    // to -inf below).
    for (r0, r1, needed) in causal_blocks((i0, rows), (j0, cols, check_causal)) {
        // SAFETY: rows i0 + r0..i0 + r1 of q and keys j0..j0 + needed exist (tile bounds), each
        // with d elements; s holds rows × ld.
        unsafe {
            let qp = q.data.as_ptr().add(q.map.at(b, h, i0 + r0));
            let dst = s.as_mut_ptr().add(r0 * ld);
            let (lhs, alpha) = ((qp, q.map.si, 1), T::from_f64(g.scale));
            let dims = (r1 - r0, needed, g.d);
            match k {
                Keys::Rows(k) => tile_gemm(
                    dims,
                    (dst, ld, 1),
                    false,
                    lhs,
                    (
                        k.data.as_ptr().add(k.map.at(b, g.kv_head(h), j0)),
                        1,
                        k.map.si,
                    ),
                    alpha,
                ),
                Keys::Panels(kt) => gemm_panels(dims, (dst, ld), false, lhs, (kt, (0, j0)), alpha),
            }
        }
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

/// One head's keys and values as the tile products read them: `kᵀ` (`d × S'`) and `v`
/// (`S' × d`) in panels.
#[derive(Clone, Copy)]
pub(super) struct HeadKv<'a, T> {
    pub kt: Panels<'a, T>,
    pub v: Panels<'a, T>,
}

/// Every head's keys and values packed as [`HeadKv`]s, in parallel, in pooled buffers (back
/// in the pool when dropped): for the passes that run the heads inside a task.
pub(super) struct AllHeadsKv<T: Elem> {
    kt: Buf<T>,
    v: Buf<T>,
    s: usize,
    d: usize,
    hk: usize,
    group: usize,
}

impl<T: Elem> AllHeadsKv<T> {
    pub(super) fn new(g: &Geom, k: &Rows<T>, v: &Rows<T>) -> Self {
        let (s, d, hk) = (g.s, g.d, g.kv_heads());
        let pack = |x: &Rows<T>, transposed: bool| {
            let len = head_panels_len(s, d, transposed);
            let mut buf = workspace::take::<T>(g.n * hk * len);
            for_each_chunk_mut(&mut buf, len.max(1), g.parallel(), |bh, dst| {
                pack_head(x, (bh / hk, bh % hk), (s, d), transposed, dst)
            });
            buf
        };
        Self {
            kt: pack(k, true),
            v: pack(v, false),
            s,
            d,
            hk,
            group: g.group.max(1),
        }
    }

    /// The keys and values query head `h` of batch `b` reads (one packed copy per
    /// key/value head, however many query heads share it).
    pub(super) fn head(&self, b: usize, h: usize) -> HeadKv<'_, T> {
        let bh = b * self.hk + h / self.group;
        let (kl, vl) = (
            head_panels_len(self.s, self.d, true),
            head_panels_len(self.s, self.d, false),
        );
        HeadKv {
            kt: Panels::new(&self.kt[bh * kl..][..kl], self.d),
            v: Panels::new(&self.v[bh * vl..][..vl], self.s),
        }
    }
}

/// Probabilities of a scores tile from the row log-sum-exp: `p = exp(s - lse)` (0 for a
/// fully masked row, whose lse is +inf).
pub(super) fn probs_tile<T: Elem>(s: &mut [T], ld: usize, rows: usize, cols: usize, lse: &[T]) {
    for r in 0..rows {
        T::exp_shift_sum(&mut s[r * ld..r * ld + cols], lse[r]);
    }
}
