//! Golden facts measured on PyTorch 2.15 (spec §9), reproduced exactly.

use anyhow::Result;
use candle_mha::candle::{DType, Device, ModuleT, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::VarMap;

fn dev() -> Device {
    Device::Cpu
}

/// One head, no bias, in_proj = [I; I; I], out_proj = I: output = softmax(XXᵀ/√d)·X.
fn identity_module(d: usize, heads: usize, dtype: DType) -> Result<MultiheadAttention> {
    let eye = Tensor::eye(d, dtype, &dev())?;
    Ok(MultiheadAttention::from_tensors(
        MultiheadAttentionConfig::new(d, heads).with_bias(false),
        vec![
            ("in_proj_weight", Tensor::cat(&[&eye, &eye, &eye], 0)?),
            ("out_proj.weight", eye),
        ],
    )?)
}

fn assert_rows(actual: &Tensor, expected: &[&[f64]], tol: f64) -> Result<()> {
    let a = actual.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    assert_eq!(a.len(), expected.len());
    for (row, exp) in a.iter().zip(expected) {
        for (x, y) in row.iter().zip(exp.iter()) {
            assert!((x - y).abs() <= tol, "got {a:?}, expected {expected:?}");
        }
    }
    Ok(())
}

#[test]
fn identity_one_head_issue_example() -> Result<()> {
    let mha = identity_module(4, 1, DType::F32)?;
    let x = Tensor::new(
        &[[1f32, 0., 0., 1.], [0., 1.5, 1., 1.], [0., 1., 1., 1.]],
        &dev(),
    )?;
    let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    // PyTorch's numbers, rounded to 4 decimals.
    let w: &[&[f64]] = &[
        &[0.4519, 0.2741, 0.2741],
        &[0.1045, 0.5307, 0.3648],
        &[0.1387, 0.4842, 0.3771],
    ];
    let o: &[&[f64]] = &[
        &[0.4519, 0.6852, 0.5481, 1.0],
        &[0.1045, 1.1609, 0.8955, 1.0],
        &[0.1387, 1.1034, 0.8613, 1.0],
    ];
    assert_rows(out.weights.as_ref().unwrap(), w, 5e-5)?;
    assert_rows(&out.output, o, 5e-5)
}

#[test]
fn identity_one_head_spec_example() -> Result<()> {
    let mha = identity_module(2, 1, DType::F32)?;
    let x = Tensor::new(&[[1f32, 0.], [0., 1.], [1., 1.]], &dev())?;
    let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    let w: &[&[f64]] = &[
        &[0.40111208, 0.19777581, 0.40111208],
        &[0.19777581, 0.40111208, 0.40111208],
        &[0.24825509, 0.24825509, 0.50348985],
    ];
    let o: &[&[f64]] = &[
        &[0.80222416, 0.59888792],
        &[0.59888792, 0.80222416],
        &[0.75174493, 0.75174493],
    ];
    assert_rows(out.weights.as_ref().unwrap(), w, 1e-7)?;
    assert_rows(&out.output, o, 1e-7)
}

/// With identity weights, head h's output columns are softmax(X_h X_hᵀ/√hd)·X_h (spec §9.2).
#[test]
fn identity_heads_split_the_features() -> Result<()> {
    let (d, heads) = (4, 2);
    let mha = identity_module(d, heads, DType::F64)?;
    let x = Tensor::new(
        &[[1f64, 0., 2., -1.], [0., 1.5, 1., 1.], [0.5, 1., -1., 1.]],
        &dev(),
    )?;
    let out = mha.forward(
        &x,
        &x,
        &x,
        &AttentionOptions::new().with_average_attn_weights(false),
    )?;
    for h in 0..heads {
        // Contiguous: candle's MKL matmul (the `mkl` feature) refuses a strided view.
        let xh = x.narrow(1, h * 2, 2)?.contiguous()?;
        let w = candle_nn::ops::softmax(&(xh.matmul(&xh.t()?)? / 2f64.sqrt())?, 1)?;
        let expected = w.matmul(&xh)?;
        let got = out.output.narrow(1, h * 2, 2)?;
        let diff = (got - expected)?
            .abs()?
            .max_keepdim(0)?
            .max(1)?
            .to_vec1::<f64>()?[0];
        assert!(diff < 1e-12, "head {h}: {diff}");
        let wdiff = (out.weights.as_ref().unwrap().get(h)? - w)?
            .abs()?
            .flatten_all()?
            .max(0)?;
        assert!(wdiff.to_scalar::<f64>()? < 1e-12);
    }
    Ok(())
}

#[test]
fn parameter_count_does_not_depend_on_heads() -> Result<()> {
    let count = |cfg: MultiheadAttentionConfig| -> Result<usize> {
        let mha = MultiheadAttention::new(
            cfg.clone(),
            seeded_var_builder(&VarMap::new(), 0, DType::F32, &dev()),
        )?;
        assert_eq!(mha.num_parameters(), cfg.num_parameters());
        Ok(mha.num_parameters())
    };
    for h in [1, 2, 4, 8, 16] {
        assert_eq!(count(MultiheadAttentionConfig::new(16, h))?, 1088);
        assert_eq!(
            count(MultiheadAttentionConfig::new(16, h).with_bias(false))?,
            1024
        );
        assert_eq!(
            count(MultiheadAttentionConfig::new(16, h).with_add_bias_kv(true))?,
            1120
        );
        assert_eq!(
            count(
                MultiheadAttentionConfig::new(16, h)
                    .with_kdim(8)
                    .with_vdim(4)
            )?,
            768
        );
    }
    Ok(())
}

/// Every weight (and bias) equal to one: each projected feature of a token is `sum(x) + 1`, so
/// when every token has the same feature sum, all scores of a row are equal, the weights are
/// uniform and the output cannot depend on how E is split into heads. (For tokens with
/// different sums the score scale is `√hd·q·k`, which does depend on H.)
#[test]
fn all_ones_output_does_not_depend_on_heads() -> Result<()> {
    let e = 8;
    // Three different tokens, each with feature sum 2.
    let x = Tensor::new(
        &[
            [0.5f32, -1., 2., 0., 1., 1., -0.5, -1.],
            [1., 0., 0., 1., 2., -2., 0.5, -0.5],
            [0., 0., 1., 1., 0., 1., 0., -1.],
        ],
        &dev(),
    )?;
    let mut outputs = Vec::new();
    for h in [1, 2, 4, 8] {
        let ones = |shape: &[usize]| Tensor::ones(shape, DType::F32, &dev());
        let mha = MultiheadAttention::from_tensors(
            MultiheadAttentionConfig::new(e, h),
            vec![
                ("in_proj_weight", ones(&[3 * e, e])?),
                ("in_proj_bias", ones(&[3 * e])?),
                ("out_proj.weight", ones(&[e, e])?),
                ("out_proj.bias", ones(&[e])?),
            ],
        )?;
        outputs.push(
            mha.forward(&x, &x, &x, &AttentionOptions::new())?
                .output
                .to_vec2::<f32>()?,
        );
    }
    // out = out_proj(ctx) = E * (sum(x) + 1) + 1 = 8 * 3 + 1 for every entry.
    assert!(
        outputs[0].iter().flatten().all(|v| (v - 25.0).abs() < 1e-4),
        "{outputs:?}"
    );
    for o in &outputs[1..] {
        for (a, b) in o.iter().flatten().zip(outputs[0].iter().flatten()) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{outputs:?}");
        }
    }
    Ok(())
}

/// W_q = W_k = 0: uniform weights; W_v = I, out_proj = I + b: out = mean(V) + b (spec §9.3–5).
fn uniform_module(add_zero_attn: bool) -> Result<MultiheadAttention> {
    let e = 2;
    let zeros = Tensor::zeros((e, e), DType::F32, &dev())?;
    let eye = Tensor::eye(e, DType::F32, &dev())?;
    Ok(MultiheadAttention::from_tensors(
        MultiheadAttentionConfig::new(e, 2).with_add_zero_attn(add_zero_attn),
        vec![
            ("in_proj_weight", Tensor::cat(&[&zeros, &zeros, &eye], 0)?),
            ("in_proj_bias", Tensor::zeros(3 * e, DType::F32, &dev())?),
            ("out_proj.weight", eye),
            ("out_proj.bias", Tensor::new(&[0.5f32, -0.5], &dev())?),
        ],
    )?)
}

#[test]
fn uniform_attention_and_padding() -> Result<()> {
    let v = Tensor::new(&[[1f32, 2.], [3., 4.], [5., 6.], [7., 8.]], &dev())?;
    let q = Tensor::new(&[[0.3f32, -1.], [2., 0.]], &dev())?;
    let mha = uniform_module(false)?;
    let out = mha.forward(&q, &v, &v, &AttentionOptions::new())?;
    assert_rows(&out.output, &[&[4.5, 4.5], &[4.5, 4.5]], 1e-6)?;
    assert_rows(
        out.weights.as_ref().unwrap(),
        &[&[0.25; 4], &[0.25; 4]],
        1e-7,
    )?;

    let kpm = Tensor::new(&[0u8, 0, 1, 1], &dev())?;
    let out = mha.forward(
        &q,
        &v,
        &v,
        &AttentionOptions::new().with_key_padding_mask(kpm),
    )?;
    assert_rows(&out.output, &[&[2.5, 2.5], &[2.5, 2.5]], 1e-6)?;
    // Exact zeros for the padded keys.
    assert_eq!(
        out.weights.unwrap().to_vec2::<f32>()?[0],
        vec![0.5, 0.5, 0.0, 0.0]
    );

    let out = uniform_module(true)?.forward(&q, &v, &v, &AttentionOptions::new())?;
    assert_rows(&out.output, &[&[3.7, 3.5], &[3.7, 3.5]], 1e-6)?;
    assert_rows(out.weights.as_ref().unwrap(), &[&[0.2; 5], &[0.2; 5]], 1e-7)
}

/// A bool (u8) mask equals its float 0/−inf equivalent exactly, for both masks (spec §9.6).
#[test]
fn bool_mask_equals_float_mask() -> Result<()> {
    let mha = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2).with_batch_first(true),
        seeded_var_builder(&VarMap::new(), 1, DType::F32, &dev()),
    )?;
    let x = candle_mha::rng::normal(0., 1., (2, 4, 8), DType::F32, &dev(), 5)?;
    let kpm = Tensor::new(&[[0u8, 0, 1, 0], [0, 1, 0, 0]], &dev())?;
    let mask = candle_mha::attention::mask::causal_mask(4, 4, &dev())?;
    let as_float = |m: &Tensor| candle_mha::attention::mask::additive_mask(m, DType::F32);
    let a = mha.forward(
        &x,
        &x,
        &x,
        &AttentionOptions::new()
            .with_key_padding_mask(kpm.clone())
            .with_attn_mask(mask.clone()),
    )?;
    let b = mha.forward(
        &x,
        &x,
        &x,
        &AttentionOptions::new()
            .with_key_padding_mask(as_float(&kpm)?)
            .with_attn_mask(as_float(&mask)?),
    )?;
    assert_eq!(
        a.output.flatten_all()?.to_vec1::<f32>()?,
        b.output.flatten_all()?.to_vec1::<f32>()?
    );
    assert_eq!(
        a.weights.unwrap().flatten_all()?.to_vec1::<f32>()?,
        b.weights.unwrap().flatten_all()?.to_vec1::<f32>()?
    );
    // is_causal without a mask builds the same mask.
    let c = mha.forward(
        &x,
        &x,
        &x,
        &AttentionOptions::new()
            .with_key_padding_mask(kpm)
            .with_is_causal(true),
    )?;
    assert_eq!(
        a.output.flatten_all()?.to_vec1::<f32>()?,
        c.output.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}

/// With an attn_mask, is_causal is only a hint: the given mask is used as is, as in PyTorch's
/// need_weights=True path (an all-zero mask with is_causal=True equals no mask).
#[test]
fn is_causal_with_a_mask_uses_the_mask() -> Result<()> {
    let mha = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2),
        seeded_var_builder(&VarMap::new(), 2, DType::F32, &dev()),
    )?;
    let x = candle_mha::rng::normal(0., 1., (5, 2, 8), DType::F32, &dev(), 6)?;
    let zero_mask = Tensor::zeros((5, 5), DType::F32, &dev())?;
    let hinted = mha.forward(
        &x,
        &x,
        &x,
        &AttentionOptions::new()
            .with_attn_mask(zero_mask)
            .with_is_causal(true),
    )?;
    let plain = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    assert_eq!(
        hinted.output.flatten_all()?.to_vec1::<f32>()?,
        plain.output.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}

/// Rows of weights sum to one without dropout, averaged weights are the head mean (spec §9.8),
/// and unbatched per-head weights are (H, L, S').
#[test]
fn weights_rows_sum_to_one_and_average_is_head_mean() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 4)
        .with_add_bias_kv(true)
        .with_add_zero_attn(true);
    let mha = MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), 3, DType::F64, &dev()),
    )?;
    let q = candle_mha::rng::normal(0., 1., (3, 8), DType::F64, &dev(), 7)?;
    let kv = candle_mha::rng::normal(0., 1., (5, 8), DType::F64, &dev(), 8)?;
    let per_head = mha.forward(
        &q,
        &kv,
        &kv,
        &AttentionOptions::new().with_average_attn_weights(false),
    )?;
    let w = per_head.weights.unwrap();
    assert_eq!(w.dims(), &[4, 3, 7]);
    for s in w.sum(2)?.flatten_all()?.to_vec1::<f64>()? {
        assert!((s - 1.0).abs() < 1e-12);
    }
    let avg = mha
        .forward(&q, &kv, &kv, &AttentionOptions::new())?
        .weights
        .unwrap();
    let diff = (avg - w.mean(0)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    assert!(diff < 1e-15);
    Ok(())
}

/// `impl ModuleT`: self-attention without weights; `train` applies the module's dropout.
#[test]
fn module_trait_is_self_attention() -> Result<()> {
    let mha = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2),
        seeded_var_builder(&VarMap::new(), 4, DType::F32, &dev()),
    )?;
    let x = candle_mha::rng::normal(0., 1., (4, 2, 8), DType::F32, &dev(), 9)?;
    let a = x.apply_t(&mha, false)?;
    let b = mha.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    assert_eq!(
        a.flatten_all()?.to_vec1::<f32>()?,
        b.flatten_all()?.to_vec1::<f32>()?
    );
    assert_eq!(ModuleT::forward_t(&mha, &x, false)?.dims(), &[4, 2, 8]);

    // With dropout, `train = true` is `forward` in training mode: the same mask sequence.
    let cfg = MultiheadAttentionConfig::new(8, 2).with_dropout(0.5);
    let build = || {
        MultiheadAttention::new(
            cfg.clone(),
            seeded_var_builder(&VarMap::new(), 4, DType::F32, &dev()),
        )
    };
    let (m1, m2) = (build()?, build()?);
    let train = AttentionOptions::new()
        .with_need_weights(false)
        .with_train(true);
    let t1 = x.apply_t(&m1, true)?.flatten_all()?.to_vec1::<f32>()?;
    let t2 = m2.forward(&x, &x, &x, &train)?.output;
    assert_eq!(t1, t2.flatten_all()?.to_vec1::<f32>()?);
    let eval = x.apply_t(&m1, false)?.flatten_all()?.to_vec1::<f32>()?;
    assert_ne!(t1, eval, "train = true must apply dropout");
    Ok(())
}

/// Empty batch, query or key set: results of the right (empty) shapes, as PyTorch's slow path.
/// With no key at all the context is zero, so the output is `out_proj.bias`.
#[test]
fn empty_inputs() -> Result<()> {
    let mha = uniform_module(false)?;
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev());
    let out = mha.forward(
        &zeros(&[0, 3, 2])?,
        &zeros(&[4, 3, 2])?,
        &zeros(&[4, 3, 2])?,
        &AttentionOptions::new(),
    )?;
    assert_eq!(
        (out.output.dims(), out.weights.unwrap().dims()),
        (&[0, 3, 2][..], &[3, 0, 4][..])
    );
    let batch0 = zeros(&[5, 0, 2])?;
    let out = mha.forward(
        &batch0,
        &batch0,
        &batch0,
        &AttentionOptions::new().with_average_attn_weights(false),
    )?;
    assert_eq!(
        (out.output.dims(), out.weights.unwrap().dims()),
        (&[5, 0, 2][..], &[0, 2, 5, 5][..])
    );
    let q = Tensor::new(&[[1f32, 2.], [3., 4.]], &dev())?;
    let out = mha.forward(
        &q,
        &zeros(&[0, 2])?,
        &zeros(&[0, 2])?,
        &AttentionOptions::new(),
    )?;
    assert_eq!(out.output.to_vec2::<f32>()?, vec![vec![0.5, -0.5]; 2]);
    assert_eq!(out.weights.unwrap().dims(), &[2, 0]);
    Ok(())
}

/// `head_mask` scales each head's context: with identity weights, zeroing head 1 zeroes
/// exactly its output columns, and the weights are unchanged.
#[test]
fn head_mask_ablates_one_head() -> Result<()> {
    let mha = identity_module(4, 2, DType::F64)?;
    let x = Tensor::new(
        &[[1f64, 0., 2., -1.], [0., 1.5, 1., 1.], [0.5, 1., -1., 1.]],
        &dev(),
    )?;
    let full = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    let mask = Tensor::new(&[1f64, 0.], &dev())?;
    let ablated = mha.forward(&x, &x, &x, &AttentionOptions::new().with_head_mask(mask))?;
    assert_eq!(
        ablated.output.narrow(1, 0, 2)?.to_vec2::<f64>()?,
        full.output.narrow(1, 0, 2)?.to_vec2::<f64>()?
    );
    assert_eq!(
        ablated.output.narrow(1, 2, 2)?.to_vec2::<f64>()?,
        vec![vec![0.0; 2]; 3]
    );
    assert_eq!(
        ablated.weights.unwrap().to_vec2::<f64>()?,
        full.weights.unwrap().to_vec2::<f64>()?
    );
    let bad = Tensor::new(&[1f64, 0., 1.], &dev())?;
    let err = mha
        .forward(&x, &x, &x, &AttentionOptions::new().with_head_mask(bad))
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("head_mask must be a float tensor of shape [2]"));
    Ok(())
}

/// `from_tensors` is strict: an extra tensor or a missing one is an error naming it.
#[test]
fn from_tensors_is_strict() -> Result<()> {
    let eye = Tensor::eye(2, DType::F32, &dev())?;
    let packed = Tensor::cat(&[&eye, &eye, &eye], 0)?;
    let cfg = MultiheadAttentionConfig::new(2, 1).with_bias(false);
    let extra = vec![
        ("in_proj_weight", packed.clone()),
        ("out_proj.weight", eye.clone()),
        ("bias_k", eye.clone()),
    ];
    let err = MultiheadAttention::from_tensors(cfg.clone(), extra)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unexpected parameter(s) [\"bias_k\"]"),
        "{err}"
    );
    let missing = MultiheadAttention::from_tensors(cfg, vec![("in_proj_weight", packed)]);
    assert!(missing.unwrap_err().to_string().contains("out_proj.weight"));
    Ok(())
}
