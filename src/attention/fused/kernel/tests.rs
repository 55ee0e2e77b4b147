//! The kernels against textbook attention gradients.

use std::mem::MaybeUninit;

use super::tiles::weight_index;
use super::*;
use crate::nn::dropout::DropoutMask;

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u64) -> Vec<f64> {
    (0..len as u64)
        .map(|i| {
            let x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Where row `(b, h, i)` of a contiguous `(N, H, len, d)` buffer starts.
fn contiguous(len: usize, h: usize, d: usize) -> RowMap {
    RowMap {
        off: 0,
        sb: h * len * d,
        sh: len * d,
        si: d,
    }
}

/// Contiguous `q (N, H, L, d)`, `k` and `v (N, H, S, d)` of [`values`] from `seed` on.
fn qkv((n, h, l, s, d): (usize, usize, usize, usize, usize), seed: u64) -> [Vec<f64>; 3] {
    [
        values(n * h * l * d, seed),
        values(n * h * s * d, seed + 1),
        values(n * h * s * d, seed + 2),
    ]
}

/// A pool of 2 threads (the tests' tasks run on rayon's threads, not one).
fn two_threads() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
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
    // (l, s, causal, dropout); tiles of 32 (causal, L ≤ 256), 64 (causal; or L ≤ 128) and
    // 256 (longer): every case spans several tiles in both directions.
    for (l, s, causal, p) in [
        (130, 300, true, None),
        (100, 150, false, Some(0.5)),
        (300, 600, false, Some(0.5)),
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
            group: 1,
        };
        let [q, k, v] = qkv((n, h, l, s, d), 1);
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

/// The forward pass with weights against the forward pass and the weights pass run apart:
/// the output to the bit, the weights (head mean or per head, causal, with dropout) within rounding,
/// on 2 threads with several query tiles per task (the heads run inside a task there).
#[test]
fn forward_with_weights_matches_the_separate_passes() {
    let pool = two_threads();
    let (n, h, l, s, d) = (2, 2, 520, 530, 3);
    let map = |len: usize| contiguous(len, h, d);
    let [q, k, v] = qkv((n, h, l, s, d), 5);
    let rows = |data, map| Rows { data, map };
    for (causal, average, p) in [
        (false, true, Some(0.3)),
        (true, false, None),
        (true, true, None),
    ] {
        let g = Geom {
            n,
            h,
            l,
            s,
            d,
            s_masked: s,
            causal,
            scale: 0.7,
            group: 1,
        };
        let mask = p.map(|p| DropoutMask::new(p, 11).unwrap());
        let w_len = if average { n * l * s } else { n * h * l * s };
        // The weights buffers start as NaN: an element the kernels leave unwritten fails.
        let (mut out, mut lse, mut w) = (
            vec![0.0; n * h * l * d],
            vec![0.0; n * h * l],
            vec![MaybeUninit::new(f64::NAN); w_len],
        );
        let (mut out2, mut lse2, mut w2) = (out.clone(), lse.clone(), w.clone());
        pool.install(|| {
            forward_with_weights(
                &g,
                (rows(&q, map(l)), rows(&k, map(s)), rows(&v, map(s))),
                Masks::default(),
                mask.as_ref(),
                RowsMut::new(&mut out, map(l)),
                &mut lse,
                &mut w,
                average,
            );
            forward(
                &g,
                rows(&q, map(l)),
                rows(&k, map(s)),
                rows(&v, map(s)),
                Masks::default(),
                mask.as_ref(),
                RowsMut::new(&mut out2, map(l)),
                &mut lse2,
            );
            weights(
                &g,
                rows(&q, map(l)),
                rows(&k, map(s)),
                &lse2,
                Masks::default(),
                mask.as_ref(),
                average,
                &mut w2,
            );
        });
        assert!(
            out == out2,
            "causal {causal}: the output depends on the weights"
        );
        assert!(
            lse == lse2,
            "causal {causal}: the lse depends on the weights"
        );
        // SAFETY: MaybeUninit::new above initialised every element.
        let (w, w2) = unsafe {
            (
                w.iter().map(|x| x.assume_init()).collect::<Vec<f64>>(),
                w2.iter().map(|x| x.assume_init()).collect::<Vec<f64>>(),
            )
        };
        assert!(
            w.iter().chain(&w2).all(|x| x.is_finite()),
            "causal {causal}, average {average}: a weight left unwritten"
        );
        let err = w
            .iter()
            .zip(&w2)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            err < 1e-14,
            "causal {causal}, average {average}: weights off by {err:e}"
        );
        assert!(w.iter().any(|&x| x > 0.0), "no weights written");
    }
}

/// The tasks run on the calling thread (small work) or on rayon's threads give the same
/// bits: forward, backward and both weights passes, causal and with dropout, on 2 threads.
#[test]
fn serial_and_parallel_runs_agree_to_the_bit() {
    let pool = two_threads();
    let (n, h, l, s, d) = (2, 3, 70, 90, 5);
    let map = |len: usize| contiguous(len, h, d);
    let [q, k, v] = qkv((n, h, l, s, d), 8);
    let d_out = values(n * h * l * d, 11);
    for (causal, p) in [(false, Some(0.25)), (true, None)] {
        let g = Geom {
            n,
            h,
            l,
            s,
            d,
            s_masked: s,
            causal,
            scale: 0.6,
            group: 1,
        };
        let mask = p.map(|p| DropoutMask::new(p, 3).unwrap());
        let run = |parallel: bool| {
            pool.install(|| {
                crate::cpu::par::force(Some(parallel));
                let rows = |data, map| Rows { data, map };
                let (mut out, mut lse) = (vec![0.0; n * h * l * d], vec![0.0; n * h * l]);
                forward(
                    &g,
                    rows(&q, map(l)),
                    rows(&k, map(s)),
                    rows(&v, map(s)),
                    Masks::default(),
                    mask.as_ref(),
                    RowsMut::new(&mut out, map(l)),
                    &mut lse,
                );
                let (mut dq, mut dk, mut dv) =
                    (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
                backward(
                    &g,
                    (rows(&q, map(l)), rows(&k, map(s)), rows(&v, map(s))),
                    rows(&out, map(l)),
                    rows(&d_out, map(l)),
                    &lse,
                    Masks::default(),
                    mask.as_ref(),
                    (
                        RowsMut::new(&mut dq, map(l)),
                        RowsMut::new(&mut dk, map(s)),
                        RowsMut::new(&mut dv, map(s)),
                    ),
                );
                let weights_of = |average: bool| {
                    let len = if average { n * l * s } else { n * h * l * s };
                    let mut w = vec![MaybeUninit::new(f64::NAN); len];
                    weights(
                        &g,
                        rows(&q, map(l)),
                        rows(&k, map(s)),
                        &lse,
                        Masks::default(),
                        mask.as_ref(),
                        average,
                        &mut w,
                    );
                    let (mut o2, mut lse2) = (vec![0.0; out.len()], vec![0.0; lse.len()]);
                    let mut w2 = vec![MaybeUninit::new(f64::NAN); len];
                    forward_with_weights(
                        &g,
                        (rows(&q, map(l)), rows(&k, map(s)), rows(&v, map(s))),
                        Masks::default(),
                        mask.as_ref(),
                        RowsMut::new(&mut o2, map(l)),
                        &mut lse2,
                        &mut w2,
                        average,
                    );
                    // SAFETY: MaybeUninit::new above initialised every element.
                    let bits = |w: Vec<MaybeUninit<f64>>| -> Vec<u64> {
                        w.into_iter()
                            .map(|x| unsafe { x.assume_init() }.to_bits())
                            .collect()
                    };
                    (bits(w), bits(w2), o2)
                };
                let (mean, per_head) = (weights_of(true), weights_of(false));
                crate::cpu::par::force(None);
                (out, lse, [dq, dk, dv], mean, per_head)
            })
        };
        let (serial, parallel) = (run(false), run(true));
        assert!(
            serial == parallel,
            "causal {causal}: the serial and parallel runs differ"
        );
        assert!(serial.0.iter().all(|x| x.is_finite()) && serial.0.iter().any(|&x| x != 0.0));
    }
}
