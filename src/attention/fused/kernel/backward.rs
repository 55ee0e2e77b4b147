//! The backward pass: per (batch, head), key tiles against the query tiles that see them, the
//! probabilities recomputed from the forward's row log-sum-exp.

use super::panels::{gemm_panels, Panels};
use super::tiles::{
    drop_of, pack_head_into, pack_head_panels, packed_map, packed_rows, probs_tile, scores_tile,
    weight_index, Keys, BC,
};
use super::{Geom, Masks, Rows, RowsMut};
use crate::cpu::par::for_each_init;
use crate::cpu::Elem;
use crate::nn::dropout::DropoutMask;

/// Query rows and key columns per backward tile without a causal mask: 256 at long sequences
/// (larger products amortise each tile's packing and row bookkeeping better than 128 do; see
/// `docs/benchmarks.md`), 64 up to L = 128.
fn tile(l: usize) -> usize {
    if l <= 128 {
        64
    } else {
        256
    }
}

/// The tile with a causal mask: smaller tiles skip more of the masked upper triangle (at
/// L = 128 one 128 tile computes the whole square, 32 tiles 10/16 of it), which pays for the
/// smaller products up to about L = 256; longer sequences take 64.
fn causal_tile(l: usize) -> usize {
    if l <= 256 {
        32
    } else {
        64
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
    (dq, dk_all, dv_all): (RowsMut<T>, RowsMut<T>, RowsMut<T>),
) {
    let drop = drop_of::<T>(dropout);
    let d = g.d;
    let scale = T::from_f64(g.scale);
    let (bq, bk) = match g.causal {
        true => (causal_tile(g.l), causal_tile(g.l)),
        false => (tile(g.l), tile(g.l)),
    };
    // Scratch of one rayon job, reused by the heads it runs: q and dO packed by rows (the
    // left operands), kᵀ, vᵀ, k, q and dO in panels (the right operands), the gradients, and
    // two tiles.
    let init = || {
        (
            [(); 10].map(|_| Vec::<T>::new()),
            vec![T::ZERO; bq * bk],
            vec![T::ZERO; bq * bk],
        )
    };
    // One task per (batch, key/value head): the query heads sharing those keys and values run
    // in it one after another, so their key and value gradients add up in one local buffer.
    let (hk, group) = (g.kv_heads(), g.group.max(1));
    for_each_init(g.n * hk, g.parallel(), init, |(bufs, s, dp), bkh| {
        let (b, kh) = (bkh / hk, bkh % hk);
        // This head's operands packed once (the projections' rows are 3E apart, and each
        // is read by every tile of the head), and its gradients accumulated locally, then
        // written out once.
        let [qb, gb, ktb, vtb, kpb, qpb, gpb, dqb, dkb, dvb] = bufs;
        pack_head_panels(&k, (b, kh), (g.s, d), true, ktb);
        pack_head_panels(&v, (b, kh), (g.s, d), true, vtb);
        pack_head_panels(&k, (b, kh), (g.s, d), false, kpb);
        let (kt, vt) = (Panels::new(ktb, d), Panels::new(vtb, d));
        let kp = Panels::new(kpb, g.s);
        let packed = packed_map(d);
        for (buf, len) in [(&mut *dkb, g.s), (&mut *dvb, g.s)] {
            buf.clear();
            buf.resize(len * d, T::ZERO);
        }
        let dk = RowsMut::new(dkb, packed);
        let dv = RowsMut::new(dvb, packed);
        for h in kh * group..(kh + 1) * group {
            let bh = b * g.h + h;
            let lse = &lse[bh * g.l..(bh + 1) * g.l];
            pack_head_into(&q, (b, h), g.l, d, qb);
            pack_head_into(&d_out, (b, h), g.l, d, gb);
            pack_head_panels(&q, (b, h), (g.l, d), false, qpb);
            pack_head_panels(&d_out, (b, h), (g.l, d), false, gpb);
            let (qp, gp) = (Panels::new(qpb, g.l), Panels::new(gpb, g.l));
            let (q, d_out) = (packed_rows(qb, d), packed_rows(gb, d));
            dqb.clear();
            dqb.resize(g.l * d, T::ZERO);
            let dq_all = &dq;
            let dq = RowsMut::new(dqb, packed);
            // D_i = Σ_t dO_it·O_it = Σ_j P̃_ij·dP̃_ij (P̃: the dropped probabilities).
            let dsum: Vec<T> = (0..g.l)
                .map(|i| {
                    let (oi, gi) = (o.map.at(b, h, i), i * d);
                    T::dot(&o.data[oi..oi + d], &d_out.data[gi..gi + d])
                })
                .collect();
            // Key tiles, each with the query tiles that see it.
            let mut key_tiles: Vec<(usize, usize, usize)> = Vec::new();
            for j0 in (0..g.s_masked).step_by(bk) {
                let first_q = if g.causal { j0 / bq * bq } else { 0 };
                key_tiles.push((j0, bk.min(g.s_masked - j0), first_q));
            }
            for j0 in (g.s_masked..g.s).step_by(bk) {
                key_tiles.push((j0, bk.min(g.s - j0), 0));
            }
            for (j0, cols, first_q) in key_tiles {
                let masked_tile = j0 < g.s_masked;
                for i0 in (first_q..g.l).step_by(bq) {
                    let rows = bq.min(g.l - i0);
                    let check = masked_tile && g.causal && j0 + cols - 1 > i0;
                    let tile = (j0, cols, check);
                    scores_tile(
                        g,
                        (b, h),
                        (i0, rows),
                        tile,
                        &q,
                        Keys::Panels(kt),
                        &masks,
                        s,
                        bk,
                    );
                    probs_tile(s, bk, rows, cols, &lse[i0..i0 + rows]);
                    // SAFETY: d_out rows i0.. and v rows (vᵀ columns) j0.. exist; dp is bk × bk.
                    unsafe {
                        gemm_panels(
                            (rows, cols, d),
                            (dp.as_mut_ptr(), bk),
                            false,
                            (
                                d_out.data.as_ptr().add(d_out.map.at(b, h, i0)),
                                d_out.map.si,
                                1,
                            ),
                            (vt, (0, j0)),
                            T::ONE,
                        );
                    }
                    // s: P → P̃ (what multiplied v); dp: dP̃ → dS = P∘(dP − D).
                    let mut factors = [T::ZERO; BC];
                    for r in 0..rows {
                        let i = i0 + r;
                        let (sr, dr) = (
                            &mut s[r * bk..r * bk + cols],
                            &mut dp[r * bk..r * bk + cols],
                        );
                        match &drop {
                            None => sr
                                .iter()
                                .zip(dr.iter_mut())
                                .for_each(|(p, x)| *x = *p * (*x - dsum[i])),
                            Some(dm) => {
                                let f = &mut factors[..cols];
                                dm.mask.factors_into(weight_index(g, b, h, i, j0), f);
                                for ((s, x), &z) in sr.iter_mut().zip(dr.iter_mut()).zip(&*f) {
                                    *x = *s * (*x * z - dsum[i]);
                                    *s *= z;
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
                        gemm_panels(
                            (cols, d, rows),
                            (dvp, dv.map.si),
                            true,
                            (s.as_ptr(), 1, bk),
                            (gp, (i0, 0)),
                            T::ONE,
                        );
                        // dQ_i += scale·dS·K_j
                        gemm_panels(
                            (rows, d, cols),
                            (dqp, dq.map.si),
                            true,
                            (dp.as_ptr(), bk, 1),
                            (kp, (j0, 0)),
                            scale,
                        );
                        // dK_j += scale·dSᵀ·Q_i
                        gemm_panels(
                            (cols, d, rows),
                            (dkp, dk.map.si),
                            true,
                            (dp.as_ptr(), 1, bk),
                            (qp, (i0, 0)),
                            scale,
                        );
                    }
                }
            }
            for i in 0..g.l {
                // SAFETY: this task is the only writer of the (b, h) rows of dq (the gradients
                // may share one buffer: the rows of other heads are other columns).
                let dst = unsafe { std::slice::from_raw_parts_mut(dq_all.at(b, h, i, 0), d) };
                dst.copy_from_slice(&dqb[i * d..(i + 1) * d]);
            }
        }
        for (all, local) in [(&dk_all, &dkb), (&dv_all, &dvb)] {
            for i in 0..g.s {
                // SAFETY: this task is the only writer of the (b, kh) rows of dk and dv.
                let dst = unsafe { std::slice::from_raw_parts_mut(all.at(b, kh, i, 0), d) };
                dst.copy_from_slice(&local[i * d..(i + 1) * d]);
            }
        }
    });
}
