//! Dropout on the attention weights: only in training, seeded, unbiased, post-softmax (the
//! returned weights are after dropout, as in PyTorch).

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::VarMap;

fn setup(p: f64) -> Result<(MultiheadAttention, Tensor)> {
    let cfg = MultiheadAttentionConfig::new(8, 2)
        .with_dropout(p)
        .with_batch_first(true);
    let mha = MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), 1, DType::F64, &Device::Cpu),
    )?;
    let x = candle_mha::rng::normal(0., 1., (2, 5, 8), DType::F64, &Device::Cpu, 2)?;
    Ok((mha, x))
}

fn vec(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_vec1::<f64>()?)
}

#[test]
fn no_dropout_in_eval() -> Result<()> {
    let (mha, x) = setup(0.5)?;
    let (plain, _) = setup(0.0)?;
    let eval = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
    let reference = plain.forward(&x, &x, &x, &AttentionOptions::new().with_train(true))?;
    assert_eq!(vec(&eval.output)?, vec(&reference.output)?);
    Ok(())
}

#[test]
fn same_seed_same_mask_and_fresh_masks_otherwise() -> Result<()> {
    let (mha, x) = setup(0.5)?;
    let opts = AttentionOptions::new()
        .with_train(true)
        .with_dropout_seed(42);
    let a = mha.forward(&x, &x, &x, &opts)?;
    let b = mha.forward(&x, &x, &x, &opts)?;
    assert_eq!(vec(&a.output)?, vec(&b.output)?);
    let c = mha.forward(&x, &x, &x, &opts.clone().with_dropout_seed(43))?;
    assert_ne!(vec(&a.output)?, vec(&c.output)?);
    // Without a seed, successive calls draw new masks, and a rebuilt module repeats them.
    let train = AttentionOptions::new().with_train(true);
    let first = vec(&mha.forward(&x, &x, &x, &train)?.output)?;
    let second = vec(&mha.forward(&x, &x, &x, &train)?.output)?;
    assert_ne!(first, second);
    let (again, _) = setup(0.5)?;
    assert_eq!(first, vec(&again.forward(&x, &x, &x, &train)?.output)?);
    Ok(())
}

#[test]
fn weights_are_zero_or_scaled_and_unbiased() -> Result<()> {
    let p = 0.25;
    let (mha, x) = setup(p)?;
    let per_head = AttentionOptions::new().with_average_attn_weights(false);
    let clean = vec(&mha.forward(&x, &x, &x, &per_head)?.weights.unwrap())?;
    let clean_out = mha.forward(&x, &x, &x, &per_head)?.output;
    let mut mean_out = clean_out.zeros_like()?;
    let runs = 4000;
    let mut dropped = 0usize;
    for seed in 0..runs {
        let out = mha.forward(
            &x,
            &x,
            &x,
            &per_head.clone().with_train(true).with_dropout_seed(seed),
        )?;
        for (w, c) in vec(&out.weights.unwrap())?.iter().zip(&clean) {
            if *w == 0.0 {
                dropped += 1;
            } else {
                assert!(
                    (w - c / (1.0 - p)).abs() < 1e-12,
                    "kept weights are scaled by 1/(1-p)"
                );
            }
        }
        mean_out = (mean_out + out.output)?;
    }
    let rate = dropped as f64 / (runs as usize * clean.len()) as f64;
    assert!((rate - p).abs() < 0.01, "drop rate {rate}");
    let mean_out = (mean_out / runs as f64)?;
    let scale = vec(&clean_out.abs()?)?.into_iter().fold(0., f64::max);
    let err = vec(&(mean_out - &clean_out)?.abs()?)?
        .into_iter()
        .fold(0., f64::max);
    assert!(
        err < 0.03 * scale,
        "mean over seeds {err} away from the no-dropout output ({scale})"
    );
    Ok(())
}

#[test]
fn dropout_one_gives_zero_context() -> Result<()> {
    let (mha, x) = setup(1.0)?;
    let out = mha.forward(&x, &x, &x, &AttentionOptions::new().with_train(true))?;
    assert!(vec(&out.weights.unwrap())?.iter().all(|w| *w == 0.0));
    let bias = vec(mha.out_proj().bias().unwrap())?;
    for (i, v) in vec(&out.output)?.iter().enumerate() {
        assert_eq!(*v, bias[i % 8]);
    }
    Ok(())
}

/// `with_dropout_first_row(b0)`: rows `b0..` of a batch computed alone drop exactly what they
/// drop in the whole batch (data-parallel ranks), on both kernels; with the default row 0
/// they draw another mask.
#[test]
fn first_row_offset_draws_the_whole_batchs_mask_for_a_part() -> Result<()> {
    let (mha, x) = setup(0.5)?; // x: (2, 5, 8)
    for kernel in [
        candle_mha::AttentionKernel::Auto,
        candle_mha::AttentionKernel::Reference,
    ] {
        let opts = AttentionOptions::new()
            .with_train(true)
            .with_dropout_seed(11)
            .with_average_attn_weights(false)
            .with_kernel(kernel);
        let whole = mha.forward(&x, &x, &x, &opts)?;
        let part = x.narrow(0, 1, 1)?;
        let alone = mha.forward(&part, &part, &part, &opts.clone().with_dropout_first_row(1))?;
        let row0 = mha.forward(&part, &part, &part, &opts)?;
        let want = vec(&whole.output.narrow(0, 1, 1)?)?;
        let got = vec(&alone.output)?;
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-12, "{kernel:?}: {a} vs {b}");
        }
        let want_w = vec(&whole.weights.unwrap().narrow(0, 1, 1)?)?;
        let got_w = vec(&alone.weights.unwrap())?;
        // The same bits, but for MKL (the `mkl` feature), whose products of a one-row batch
        // and a two-row batch may round differently in the last bit.
        let tol = if cfg!(feature = "mkl") { 1e-15 } else { 0.0 };
        for (a, b) in got_w.iter().zip(&want_w) {
            assert!((a - b).abs() <= tol, "{kernel:?}: {a} vs {b}");
        }
        assert_ne!(
            vec(&row0.output)?,
            want,
            "{kernel:?}: row 0's mask is another one"
        );
    }
    Ok(())
}
