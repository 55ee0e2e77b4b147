//! Attention rollout and attention flow (`candle_mha_viz::rollout`), checked against
//! products and maximum flows worked out by hand and by brute force.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha_viz::{attention_flow, attention_rollout, HeadFusion};
use common::{assert_matrix, close};

const TOL: f64 = 1e-12;

fn m3(rows: [[f64; 3]; 3]) -> Result<Tensor> {
    Ok(Tensor::new(&rows, &Device::Cpu)?)
}

/// Causal, row-stochastic layers.
fn layer1() -> Result<Tensor> {
    m3([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
}

fn layer2() -> Result<Tensor> {
    m3([[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.1, 0.6, 0.3]])
}

/// A2 · A1 by hand:
/// - row 1: 0.4·[1,0,0] + 0.6·[0.5,0.5,0] = [0.7, 0.3, 0]
/// - row 2: 0.1·[1,0,0] + 0.6·[0.5,0.5,0] + 0.3·[0.2,0.3,0.5] = [0.46, 0.39, 0.15]
#[test]
fn rollout_is_the_product_of_the_layers() -> Result<()> {
    let r = attention_rollout(&[layer1()?, layer2()?], HeadFusion::Mean, false, 0.0)?;
    assert_eq!(r.dtype(), DType::F64);
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        TOL,
    )?;
    // f32 layers give an f32 result.
    let r32 = attention_rollout(
        &[
            layer1()?.to_dtype(DType::F32)?,
            layer2()?.to_dtype(DType::F32)?,
        ],
        HeadFusion::Mean,
        false,
        0.0,
    )?;
    assert_eq!(r32.dtype(), DType::F32);
    assert_matrix(
        &r32,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        1e-6,
    )?;
    Ok(())
}

/// With the residual: A1' = 0.5 A1 + 0.5 I = [[1,0,0],[0.25,0.75,0],[0.1,0.15,0.75]],
/// A2' = [[1,0,0],[0.2,0.8,0],[0.05,0.3,0.65]], and A2' · A1':
/// - row 1: 0.2·[1,0,0] + 0.8·[0.25,0.75,0] = [0.4, 0.6, 0]
/// - row 2: 0.05·[1,0,0] + 0.3·[0.25,0.75,0] + 0.65·[0.1,0.15,0.75] = [0.19, 0.3225, 0.4875]
#[test]
fn rollout_with_residual() -> Result<()> {
    let r = attention_rollout(&[layer1()?, layer2()?], HeadFusion::Mean, true, 0.0)?;
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.4, 0.6, 0.0], &[0.19, 0.3225, 0.4875]],
        TOL,
    )?;
    Ok(())
}

#[test]
fn rollout_fuses_heads() -> Result<()> {
    // Two heads whose mean is layer 1.
    let d = m3([[0.0, 0.0, 0.0], [0.1, -0.1, 0.0], [0.1, 0.0, -0.1]])?;
    let heads = Tensor::stack(&[(layer1()? + &d)?, (layer1()? - &d)?], 0)?;
    let r = attention_rollout(&[heads, layer2()?], HeadFusion::Mean, false, 0.0)?;
    assert_matrix(
        &r,
        &[&[1.0, 0.0, 0.0], &[0.7, 0.3, 0.0], &[0.46, 0.39, 0.15]],
        TOL,
    )?;
    // Max of [[1,0],[0,1]] and [[0,1],[1,0]] is all ones: rows renormalise to 0.5.
    let dev = Device::Cpu;
    let swap = Tensor::new(&[[[1f64, 0.], [0., 1.]], [[0., 1.], [1., 0.]]], &dev)?;
    let r = attention_rollout(std::slice::from_ref(&swap), HeadFusion::Max, false, 0.0)?;
    assert_matrix(&r, &[&[0.5, 0.5], &[0.5, 0.5]], TOL)?;
    // Min is all zeros; zero rows stay zero (no division by zero).
    let r = attention_rollout(std::slice::from_ref(&swap), HeadFusion::Min, false, 0.0)?;
    assert_matrix(&r, &[&[0.0, 0.0], &[0.0, 0.0]], 0.0)?;
    // With the residual, Min leaves the identity.
    let r = attention_rollout(&[swap], HeadFusion::Min, true, 0.0)?;
    assert_matrix(&r, &[&[1.0, 0.0], &[0.0, 1.0]], TOL)?;
    Ok(())
}

/// floor(0.34 · 9) = 3 lowest entries dropped: 0.1 at [0][2], 0.1 at [1][2], 0.2 at [1][0];
/// rows renormalised: [0.6, 0.3, 0] / 0.9 and [0, 0.7, 0] / 0.7.
#[test]
fn discard_ratio_drops_the_lowest_weights_but_not_the_diagonal() -> Result<()> {
    let a = m3([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])?;
    let r = attention_rollout(std::slice::from_ref(&a), HeadFusion::Mean, false, 0.34)?;
    assert_matrix(
        &r,
        &[
            &[2.0 / 3.0, 1.0 / 3.0, 0.0],
            &[0.0, 1.0, 0.0],
            &[0.25, 0.25, 0.5],
        ],
        TOL,
    )?;
    // floor(0.12 · 9) = 1: the lowest entry is the diagonal [0][0], which is kept.
    let b = m3([[0.05, 0.5, 0.45], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])?;
    let r = attention_rollout(std::slice::from_ref(&b), HeadFusion::Mean, false, 0.12)?;
    assert_matrix(
        &r,
        &[&[0.05, 0.5, 0.45], &[0.2, 0.7, 0.1], &[0.25, 0.25, 0.5]],
        TOL,
    )?;
    Ok(())
}

#[test]
fn rollout_errors() -> Result<()> {
    let dev = Device::Cpu;
    let e = attention_rollout(&[], HeadFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers is empty"), "{e}");
    let two = Tensor::new(&[[1f64, 0.], [0.5, 0.5]], &dev)?;
    let e = attention_rollout(&[layer1()?, two.clone()], HeadFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layers[1] has L = 2") && e.contains("L = 3"),
        "{e}"
    );
    let rect = Tensor::new(&[[1f64, 0., 0.], [0.5, 0.5, 0.]], &dev)?;
    let e = attention_rollout(&[rect], HeadFusion::Mean, false, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers[0]") && e.contains("[2, 3]"), "{e}");
    let e = attention_rollout(std::slice::from_ref(&two), HeadFusion::Mean, false, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("discard_ratio = 1"), "{e}");
    let e = attention_flow(&[two.unsqueeze(0)?.unsqueeze(0)?], HeadFusion::Mean, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[1, 1, 2, 2]"), "{e}");
    let long = Tensor::ones((65, 65), DType::F32, &dev)?;
    let e = attention_flow(&[long], HeadFusion::Mean, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("length 65") && e.contains("64"), "{e}");
    Ok(())
}

/// Two layers over L = 2: A1 = [[1, 0], [0.5, 0.5]], A2 = [[0.5, 0.5], [0, 1]].
/// Paths from top node i to input j pass through one middle node k with capacity
/// min(A2[i][k], A1[k][j]); they share no edge, so the max-flow is their sum:
/// - (0,0): min(.5, 1) + min(.5, .5) = 1.0      - (0,1): min(.5, 0) + min(.5, .5) = 0.5
/// - (1,0): min(0, 1) + min(1, .5) = 0.5        - (1,1): min(0, 0) + min(1, .5) = 0.5
///
/// whereas rollout A2 · A1 = [[0.75, 0.25], [0.5, 0.5]].
#[test]
fn attention_flow_on_a_hand_made_example() -> Result<()> {
    let dev = Device::Cpu;
    let a1 = Tensor::new(&[[1.0f64, 0.0], [0.5, 0.5]], &dev)?;
    let a2 = Tensor::new(&[[0.5f64, 0.5], [0.0, 1.0]], &dev)?;
    let layers = [a1, a2];
    let flow = attention_flow(&layers, HeadFusion::Mean, false)?;
    assert_matrix(&flow, &[&[1.0, 0.5], &[0.5, 0.5]], TOL)?;
    let roll = attention_rollout(&layers, HeadFusion::Mean, false, 0.0)?;
    assert_matrix(&roll, &[&[0.75, 0.25], &[0.5, 0.5]], TOL)?;
    // One layer: the flow is the matrix itself.
    let one = attention_flow(&layers[..1], HeadFusion::Mean, false)?;
    assert_matrix(&one, &[&[1.0, 0.0], &[0.5, 0.5]], TOL)?;
    // With the residual, A1' = [[1, 0], [0.25, 0.75]], A2' = [[0.75, 0.25], [0, 1]]:
    // (0,0): min(.75, 1) + min(.25, .25) = 1.0; (0,1): 0 + min(.25, .75) = 0.25;
    // (1,0): 0 + min(1, .25) = 0.25; (1,1): 0 + min(1, .75) = 0.75.
    let res = attention_flow(&layers, HeadFusion::Mean, true)?;
    assert_matrix(&res, &[&[1.0, 0.25], &[0.25, 0.75]], TOL)?;
    Ok(())
}

/// Three layers, where flow can split and merge: compare with the minimum cut found by
/// enumerating every cut of the layered graph.
#[test]
// Node positions index both the matrices and the flow: plain index loops read best here.
#[allow(clippy::needless_range_loop)]
fn attention_flow_equals_brute_force_min_cut() -> Result<()> {
    let mats = [
        [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.1, 0.4]],
        [[0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.7, 0.2, 0.1]],
        [[0.25, 0.25, 0.5], [0.9, 0.05, 0.05], [0.2, 0.6, 0.2]],
    ];
    let layers: Vec<Tensor> = mats.iter().map(|m| m3(*m)).collect::<Result<_>>()?;
    let flow = attention_flow(&layers, HeadFusion::Mean, false)?.to_vec2::<f64>()?;
    let l = 3;
    // Node (layer, pos) has id layer·3 + pos; edge (ℓ, i) → (ℓ-1, j) has capacity
    // mats[ℓ-1][i][j]. Layer-0 nodes other than the sink have no out-edges, so they sit on
    // the source side of a minimum cut; the other top nodes have no in-edges, so they sit on
    // the sink side. Only the 6 middle nodes need enumerating.
    for i in 0..l {
        for j in 0..l {
            let mut best = f64::INFINITY;
            for subset in 0u32..64 {
                let source_side = |layer: usize, pos: usize| match layer {
                    3 => pos == i,
                    0 => pos != j,
                    _ => subset & (1 << ((layer - 1) * 3 + pos)) != 0,
                };
                let mut cut = 0.0;
                for layer in 1..=3 {
                    for a in 0..l {
                        for b in 0..l {
                            if source_side(layer, a) && !source_side(layer - 1, b) {
                                cut += mats[layer - 1][a][b];
                            }
                        }
                    }
                }
                best = best.min(cut);
            }
            assert!(
                close(flow[i][j], best, 1e-9),
                "({i},{j}): flow {} vs cut {best}",
                flow[i][j]
            );
        }
    }
    // Heads are fused before the flow: (H, L, L) with equal heads gives the same result.
    let heads: Vec<Tensor> = layers
        .iter()
        .map(|t| Tensor::stack(&[t, t], 0))
        .collect::<candle_mha::candle::Result<_>>()?;
    let fused = attention_flow(&heads, HeadFusion::Max, false)?.to_vec2::<f64>()?;
    for (a, b) in fused.iter().flatten().zip(flow.iter().flatten()) {
        assert!(close(*a, *b, 1e-12));
    }
    Ok(())
}

/// A 64-token, 2-layer flow runs (the documented limit) and each entry is within [0, 1].
#[test]
fn attention_flow_at_the_limit() -> Result<()> {
    let dev = Device::Cpu;
    let layers: Vec<Tensor> = (0..2)
        .map(|s| {
            let x = candle_mha::rng::normal(0., 1., (2, 64, 64), DType::F32, &dev, s)?;
            candle_nn::ops::softmax_last_dim(&x)
        })
        .collect::<candle_mha::candle::Result<_>>()?;
    let t = std::time::Instant::now();
    let flow = attention_flow(&layers, HeadFusion::Mean, true)?;
    println!("64 x 64, 2 layers: {:?}", t.elapsed());
    let v = flow.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    assert!(v.iter().all(|x| (-1e-9..=1.0 + 1e-6).contains(x)));
    // Rollout of the same layers stays row-stochastic.
    let roll = attention_rollout(&layers, HeadFusion::Mean, true, 0.0)?;
    let rows = roll.to_dtype(DType::F64)?.sum(1)?.to_vec1::<f64>()?;
    assert!(rows.iter().all(|s| close(*s, 1.0, 1e-5)), "{rows:?}");
    Ok(())
}
