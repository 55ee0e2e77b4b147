//! Head views, tables and source masses (`candle_mha_viz::{heads, table, sources}`), on
//! hand-made tensors with hand-computed answers and on real forwards.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_mha_viz::{
    argmax_head, dominant_source, format_table, fuse_heads, head_ablation, head_stats, row_entropy,
    row_max, source_mass, HeadFusion, Segments, TableOptions,
};
use candle_nn::VarMap;
use common::{labels, max_abs_diff};

fn dev() -> Device {
    Device::Cpu
}

/// A module of `cfg` with seeded parameters in `dtype`.
fn seeded_mha(
    cfg: MultiheadAttentionConfig,
    seed: u64,
    dtype: DType,
) -> Result<MultiheadAttention> {
    Ok(MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), seed, dtype, &dev()),
    )?)
}

/// The per-head weights `(…, H, L, L)` of `mha`'s self-attention over `x`.
fn per_head_self_weights(mha: &MultiheadAttention, x: &Tensor) -> Result<Tensor> {
    let opts = AttentionOptions::new().with_average_attn_weights(false);
    Ok(mha.forward(x, x, x, &opts)?.weights.expect("weights"))
}

/// Two heads over L = 2 queries and S = 3 keys: `(H, L, S) = (2, 2, 3)`.
fn two_heads() -> Result<Tensor> {
    Ok(Tensor::new(
        &[
            [[0.2f64, 0.3, 0.5], [1.0, 0.0, 0.0]],
            [[0.6, 0.3, 0.1], [0.0, 0.5, 0.5]],
        ],
        &dev(),
    )?)
}

#[test]
fn fuse_heads_mean_max_min() -> Result<()> {
    let w = two_heads()?;
    let mean = fuse_heads(&w, HeadFusion::Mean)?.to_vec2::<f64>()?;
    let max = fuse_heads(&w, HeadFusion::Max)?.to_vec2::<f64>()?;
    let min = fuse_heads(&w, HeadFusion::Min)?.to_vec2::<f64>()?;
    let close = |a: &[Vec<f64>], b: &[[f64; 3]; 2]| {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .all(|(x, y)| (x - y).abs() < 1e-12)
    };
    assert!(
        close(&mean, &[[0.4, 0.3, 0.3], [0.5, 0.25, 0.25]]),
        "{mean:?}"
    );
    assert!(close(&max, &[[0.6, 0.3, 0.5], [1.0, 0.5, 0.5]]), "{max:?}");
    assert!(close(&min, &[[0.2, 0.3, 0.1], [0.0, 0.0, 0.0]]), "{min:?}");
    // Leading dims are kept: (2, H, L, S) → (2, L, S).
    let batched = Tensor::stack(&[&w, &w], 0)?;
    assert_eq!(fuse_heads(&batched, HeadFusion::Max)?.dims(), &[2, 2, 3]);

    let err = fuse_heads(&w.get(0)?, HeadFusion::Mean).unwrap_err();
    assert!(err.to_string().contains("(…, H, L, S)"), "{err}");
    let err = fuse_heads(&w.to_dtype(DType::U32)?, HeadFusion::Mean).unwrap_err();
    assert!(err.to_string().contains("float"), "{err}");
    Ok(())
}

/// Mean fusion is exactly what `average_attn_weights=True` returns.
#[test]
fn mean_fusion_is_average_attn_weights() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 4).with_batch_first(true);
    let mha = seeded_mha(cfg, 11, DType::F64)?;
    let x = candle_mha::rng::normal(0., 1., (2, 5, 8), DType::F64, &dev(), 12)?;
    let per_head = per_head_self_weights(&mha, &x)?;
    let averaged = mha
        .forward(&x, &x, &x, &AttentionOptions::new())?
        .weights
        .unwrap();
    let fused = fuse_heads(&per_head, HeadFusion::Mean)?;
    assert_eq!(fused.dims(), &[2, 5, 5]);
    assert!(max_abs_diff(&fused, &averaged)? < 1e-15);
    Ok(())
}

#[test]
fn argmax_head_picks_the_heaviest_head() -> Result<()> {
    let a = argmax_head(&two_heads()?)?;
    assert_eq!(a.dtype(), DType::U32);
    // The tie (0.3 vs 0.3) goes to the lower head.
    assert_eq!(a.to_vec2::<u32>()?, vec![vec![1, 0, 0], vec![0, 1, 1]]);
    Ok(())
}

#[test]
fn entropy_of_uniform_and_one_hot_rows() -> Result<()> {
    let s = 4;
    let uniform = Tensor::full(0.25f64, (1, 3, s), &dev())?;
    let one_hot = Tensor::new(
        &[[[0f64, 1., 0., 0.], [1., 0., 0., 0.], [0., 0., 0., 1.]]],
        &dev(),
    )?;
    let w = Tensor::cat(&[&uniform, &one_hot], 0)?; // (H = 2, L = 3, S = 4)
    let e = row_entropy(&w)?;
    assert_eq!(e.dims(), &[2, 3]);
    let e = e.to_vec2::<f64>()?;
    for v in &e[0] {
        assert!((v - (s as f64).ln()).abs() < 1e-12, "{e:?}");
    }
    assert_eq!(e[1], vec![0.0; 3], "0·ln 0 = 0, no NaN");
    // A fully masked (all-zero) row has entropy 0 and max 0; f32 works too.
    let zero = Tensor::zeros((1, 1, 3), DType::F32, &dev())?;
    assert_eq!(row_entropy(&zero)?.to_vec2::<f32>()?, vec![vec![0.0]]);
    assert_eq!(row_max(&zero)?.to_vec2::<f32>()?, vec![vec![0.0]]);
    assert_eq!(
        row_max(&two_heads()?)?.to_vec2::<f64>()?,
        vec![vec![0.5, 1.0], vec![0.6, 0.5]]
    );
    Ok(())
}

#[test]
fn head_stats_per_head_means() -> Result<()> {
    // Head 0: uniform rows over 4 keys; head 1: one-hot rows.
    let w = Tensor::new(
        &[
            [[0.25f64, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]],
            [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
        ],
        &dev(),
    )?;
    let stats = head_stats(&w)?;
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0].head, 0);
    assert!((stats[0].mean_entropy - 4f64.ln()).abs() < 1e-12);
    assert!((stats[0].mean_max_weight - 0.25).abs() < 1e-12);
    assert_eq!((stats[1].head, stats[1].mean_entropy), (1, 0.0));
    assert_eq!(stats[1].mean_max_weight, 1.0);

    // Leading dims are averaged over: the hand-made (H, L, S) pair gives per-head means.
    let st = head_stats(&two_heads()?)?;
    let h = |p: &[f64]| {
        -p.iter()
            .filter(|&&x| x > 0.)
            .map(|x| x * x.ln())
            .sum::<f64>()
    };
    let e0 = (h(&[0.2, 0.3, 0.5]) + 0.0) / 2.0;
    let e1 = (h(&[0.6, 0.3, 0.1]) + h(&[0.5, 0.5])) / 2.0;
    assert!((st[0].mean_entropy - e0).abs() < 1e-12);
    assert!((st[1].mean_entropy - e1).abs() < 1e-12);
    assert!((st[0].mean_max_weight - 0.75).abs() < 1e-12);
    assert!((st[1].mean_max_weight - 0.55).abs() < 1e-12);
    let batched = Tensor::stack(&[&two_heads()?, &two_heads()?], 0)?;
    assert_eq!(head_stats(&batched)?, st);
    Ok(())
}

#[test]
fn table_golden_text() -> Result<()> {
    let m = Tensor::new(&[[0.1f64, 0.26, 1.0], [0.5, -0.0001, 12.3456]], &dev())?;
    let opts = TableOptions {
        title: Some("weights".to_string()),
        ..TableOptions::default()
    };
    let text = format_table(
        &m,
        &labels(&["query", "k"]),
        &labels(&["a", "bb", "longlabel"]),
        &opts,
    )?;
    let expected = concat!(
        "weights\n",
        "               a         bb  longlabel\n",
        "query      0.100      0.260      1.000\n",
        "k          0.500      0.000     12.346\n",
    );
    assert_eq!(text, expected);

    let two = format_table(
        &m,
        &labels(&["q", "k"]),
        &labels(&["a", "b", "c"]),
        &TableOptions {
            decimals: 1,
            ..TableOptions::default()
        },
    )?;
    assert_eq!(
        two,
        "      a     b     c\nq   0.1   0.3   1.0\nk   0.5   0.0  12.3\n"
    );

    // Colour adds escape codes around each value cell but keeps the text.
    let coloured = format_table(
        &m,
        &labels(&["q", "k"]),
        &labels(&["a", "b", "c"]),
        &TableOptions {
            color: true,
            ..TableOptions::default()
        },
    )?;
    assert!(coloured.contains("\x1b[48;5;"));
    assert_eq!(coloured.matches("\x1b[0m").count(), 6);
    Ok(())
}

#[test]
fn table_label_mismatch_is_an_error() -> Result<()> {
    let m = Tensor::zeros((2, 3), DType::F32, &dev())?;
    let err = format_table(
        &m,
        &labels(&["a"]),
        &labels(&["x", "y", "z"]),
        &TableOptions::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("[2, 3]") && msg.contains("1 row labels"),
        "{msg}"
    );
    let err = format_table(
        &m.unsqueeze(0)?,
        &labels(&["a", "b"]),
        &labels(&["x", "y", "z"]),
        &TableOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("2-D"), "{err}");
    Ok(())
}

#[test]
fn source_mass_hand_computed() -> Result<()> {
    let seg = Segments::new(&[("a", 2), ("b", 1), ("c", 2)])?;
    assert_eq!(seg.labels(), &labels(&["a", "b", "c"])[..]);
    assert_eq!(seg.total_len(), 5);
    let w = Tensor::new(
        &[[0.1f64, 0.2, 0.3, 0.15, 0.25], [0.0, 0.0, 0.1, 0.6, 0.3]],
        &dev(),
    )?;
    let m = source_mass(&w, &seg)?;
    assert_eq!(m.dims(), &[2, 3]);
    let m = m.to_vec2::<f64>()?;
    let expected = [[0.3, 0.3, 0.4], [0.0, 0.1, 0.9]];
    for (r, e) in m.iter().zip(expected) {
        for (x, y) in r.iter().zip(e) {
            assert!((x - y).abs() < 1e-12, "{m:?}");
        }
    }
    // Ties go to the first segment.
    assert_eq!(dominant_source(&w, &seg)?.to_vec1::<u32>()?, vec![2, 2]);
    let first = Tensor::new(&[[0.5f64, 0.0, 0.5, 0.0, 0.0]], &dev())?;
    assert_eq!(dominant_source(&first, &seg)?.to_vec1::<u32>()?, vec![0]);

    let err = source_mass(&w.narrow(1, 0, 4)?, &seg).unwrap_err();
    assert!(err.to_string().contains("expected S >= 5"), "{err}");
    assert!(Segments::new(&[]).is_err());
    assert!(Segments::new(&[("a", 1), ("a", 2)]).is_err());
    assert!(Segments::new(&[("a", 0)]).is_err());
    assert!(Segments::new(&[("(other)", 1)]).is_err());
    Ok(())
}

#[test]
fn source_mass_rows_sum_to_one_on_a_real_forward() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 2).with_batch_first(true);
    let mha = seeded_mha(cfg, 21, DType::F32)?;
    let x = candle_mha::rng::normal(0., 1., (3, 5, 8), DType::F32, &dev(), 22)?;
    let w = per_head_self_weights(&mha, &x)?; // (N, H, L, S)
    let seg = Segments::new(&[("first", 2), ("rest", 3)])?;
    let m = source_mass(&w, &seg)?;
    assert_eq!(m.dims(), &[3, 2, 5, 2]);
    for s in m.sum(3)?.flatten_all()?.to_vec1::<f32>()? {
        assert!((s - 1.0).abs() < 1e-6, "{s}");
    }
    assert_eq!(seg.column_labels(5)?, labels(&["first", "rest"]));
    assert_eq!(dominant_source(&w, &seg)?.dims(), &[3, 2, 5]);
    Ok(())
}

/// add_zero_attn appends one key: it is reported as "(other)", and rows still sum to one.
#[test]
fn source_mass_other_column_with_add_zero_attn() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 2).with_add_zero_attn(true);
    let mha = seeded_mha(cfg, 23, DType::F64)?;
    let q = candle_mha::rng::normal(0., 1., (2, 8), DType::F64, &dev(), 24)?;
    let kv = candle_mha::rng::normal(0., 1., (4, 8), DType::F64, &dev(), 25)?;
    let w = mha
        .forward(&q, &kv, &kv, &AttentionOptions::new())?
        .weights
        .unwrap(); // (L, S + 1)
    assert_eq!(w.dims(), &[2, 5]);
    let seg = Segments::new(&[("x", 1), ("y", 3)])?;
    let m = source_mass(&w, &seg)?;
    assert_eq!(m.dims(), &[2, 3]);
    assert_eq!(seg.column_labels(5)?, labels(&["x", "y", "(other)"]));
    let (m, w) = (m.to_vec2::<f64>()?, w.to_vec2::<f64>()?);
    for (mr, wr) in m.iter().zip(&w) {
        assert!((mr[2] - wr[4]).abs() < 1e-15);
        assert!((mr.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    Ok(())
}

/// Two heads, no bias, in_proj = [I; I; I]: head h sees features 2h..2h+2.
fn identity_two_heads(out_proj: Tensor) -> Result<MultiheadAttention> {
    let eye = Tensor::eye(4, DType::F64, &dev())?;
    Ok(MultiheadAttention::from_tensors(
        MultiheadAttentionConfig::new(4, 2).with_bias(false),
        vec![
            ("in_proj_weight", Tensor::cat(&[&eye, &eye, &eye], 0)?),
            ("out_proj.weight", out_proj),
        ],
    )?)
}

fn x() -> Result<Tensor> {
    Ok(Tensor::new(
        &[[1f64, 0., 2., -1.], [0., 1.5, 1., 1.], [0.5, 1., -1., 1.]],
        &dev(),
    )?)
}

#[test]
fn head_ablation_on_identity_heads() -> Result<()> {
    let mha = identity_two_heads(Tensor::eye(4, DType::F64, &dev())?)?;
    let x = x()?;
    let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    let abl = head_ablation(&mha, &x, &x, &x, &AttentionOptions::new())?;
    assert_eq!(abl.len(), 2);
    // out_proj = I: ablating head h zeroes exactly its two output columns.
    let norm = |t: &Tensor| -> Result<f64> { Ok(t.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt()) };
    let total = norm(&out)?;
    for a in &abl {
        let expected = norm(&out.narrow(1, 2 * a.head, 2)?)? / total;
        assert!(a.output_change > 0.0);
        assert!((a.output_change - expected).abs() < 1e-12, "{abl:?}");
    }

    // out_proj with zero columns for head 1's features (2, 3): head 1 cannot matter.
    let mut w = vec![0f64; 16];
    for i in 0..4 {
        w[i * 4] = 1.0;
        w[i * 4 + 1] = 0.5;
    }
    let ignores_head_1 = identity_two_heads(Tensor::from_vec(w, (4, 4), &dev())?)?;
    let abl = head_ablation(&ignores_head_1, &x, &x, &x, &AttentionOptions::new())?;
    assert!(abl[0].output_change > 0.1, "{abl:?}");
    assert_eq!((abl[1].head, abl[1].output_change), (1, 0.0));
    Ok(())
}

#[test]
fn head_ablation_needs_a_fixed_dropout_mask() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 2).with_dropout(0.5);
    let mha = seeded_mha(cfg, 31, DType::F32)?;
    let x = candle_mha::rng::normal(0., 1., (4, 8), DType::F32, &dev(), 32)?;
    let train = AttentionOptions::new().with_train(true);
    let err = head_ablation(&mha, &x, &x, &x, &train).unwrap_err();
    assert!(err.to_string().contains("dropout_seed"), "{err}");
    let abl = head_ablation(&mha, &x, &x, &x, &train.with_dropout_seed(3))?;
    assert!(abl
        .iter()
        .all(|a| a.output_change.is_finite() && a.output_change > 0.0));
    Ok(())
}

/// Empty query or key sets give empty (or zero) results of the right shapes, not errors.
#[test]
fn empty_weights() -> Result<()> {
    let no_query = Tensor::zeros((2, 3, 0, 4), DType::F32, &dev())?; // (N, H, L = 0, S)
    assert_eq!(fuse_heads(&no_query, HeadFusion::Max)?.dims(), &[2, 0, 4]);
    assert_eq!(argmax_head(&no_query)?.dims(), &[2, 0, 4]);
    assert_eq!(row_entropy(&no_query)?.dims(), &[2, 3, 0]);
    assert_eq!(row_max(&no_query)?.dims(), &[2, 3, 0]);
    assert_eq!(head_stats(&no_query)?[2].mean_entropy, 0.0);
    let seg = Segments::new(&[("a", 4)])?;
    assert_eq!(source_mass(&no_query, &seg)?.dims(), &[2, 3, 0, 1]);
    assert_eq!(dominant_source(&no_query, &seg)?.dims(), &[2, 3, 0]);

    let no_key = Tensor::zeros((3, 2, 0), DType::F32, &dev())?; // (H, L, S = 0)
    assert_eq!(
        row_entropy(&no_key)?.to_vec2::<f32>()?,
        vec![vec![0.0; 2]; 3]
    );
    assert_eq!(row_max(&no_key)?.to_vec2::<f32>()?, vec![vec![0.0; 2]; 3]);
    let err = fuse_heads(
        &Tensor::zeros((0, 2, 2), DType::F32, &dev())?,
        HeadFusion::Mean,
    );
    assert!(err.unwrap_err().to_string().contains("no head"));
    Ok(())
}
