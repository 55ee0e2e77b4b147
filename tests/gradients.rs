//! Gradient flow: one optimizer step changes every parameter, in every configuration (this
//! catches ops without a backward, such as candle's `softmax_last_dim`).

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{Optimizer, VarMap, SGD};

fn step_changes_every_parameter(
    cfg: MultiheadAttentionConfig,
    opts: AttentionOptions,
    cross: bool,
) -> Result<()> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 11, DType::F32, &dev),
    )?;
    let (l, s, n) = (4, 5, 2);
    let layout = |len: usize, d: usize| {
        if cfg.batch_first {
            (n, len, d)
        } else {
            (len, n, d)
        }
    };
    let q = candle_mha::rng::normal(0., 1., layout(l, cfg.embed_dim), DType::F32, &dev, 1)?;
    let (k, v) = match cross {
        true => (
            candle_mha::rng::normal(0., 1., layout(s, cfg.kdim()), DType::F32, &dev, 2)?,
            candle_mha::rng::normal(0., 1., layout(s, cfg.vdim()), DType::F32, &dev, 3)?,
        ),
        false => (q.clone(), q.clone()),
    };
    let before: Vec<(String, Tensor)> = mha
        .named_parameters()
        .into_iter()
        .map(|(k, t)| Ok((k, t.copy()?)))
        .collect::<Result<_>>()?;
    assert_eq!(
        varmap.all_vars().len(),
        before.len(),
        "every parameter is a Var"
    );

    let out = mha.forward(&q, &k, &v, &opts)?;
    let r = candle_mha::rng::normal(0., 1., out.output.shape(), DType::F32, &dev, 4)?;
    let loss = (out.output * r)?.sum_all()?;
    let mut sgd = SGD::new(varmap.all_vars(), 0.1)?;
    let grads = loss.backward()?;
    for (name, t) in mha.named_parameters() {
        let g = grads
            .get(&t)
            .with_context(|| format!("{name}: no gradient"))?;
        let norm = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
        assert!(
            norm.is_finite() && norm > 0.0,
            "{name}: gradient norm {norm}"
        );
    }
    sgd.step(&grads)?;
    for ((name, old), (_, new)) in before.iter().zip(mha.named_parameters()) {
        let change = (new - old)?.abs()?.sum_all()?.to_scalar::<f32>()?;
        assert!(change > 0.0, "{name} did not change");
    }
    Ok(())
}

#[test]
fn default_self_attention() -> Result<()> {
    step_changes_every_parameter(
        MultiheadAttentionConfig::new(8, 2),
        AttentionOptions::new(),
        false,
    )
}

#[test]
fn every_option_cross_attention_masked() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 2)
        .with_kdim(6)
        .with_vdim(4)
        .with_add_bias_kv(true)
        .with_add_zero_attn(true)
        .with_batch_first(true);
    let kpm = Tensor::new(&[[0u8, 0, 0, 1, 1], [0, 0, 0, 0, 0]], &Device::Cpu)?;
    let opts = AttentionOptions::new()
        .with_key_padding_mask(kpm)
        .with_need_weights(false);
    step_changes_every_parameter(cfg, opts, true)
}

#[test]
fn causal_with_dropout_in_training() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 4).with_dropout(0.3);
    let opts = AttentionOptions::new()
        .with_is_causal(true)
        .with_train(true);
    step_changes_every_parameter(cfg, opts, false)
}

#[test]
fn half_precision_trains() -> Result<()> {
    // f16/bf16 modules get gradients through the f32 softmax.
    for dtype in [DType::F16, DType::BF16] {
        let varmap = VarMap::new();
        let mha = MultiheadAttention::new(
            MultiheadAttentionConfig::new(8, 2),
            seeded_var_builder(&varmap, 3, dtype, &Device::Cpu),
        )?;
        let x = candle_mha::rng::normal(0., 1., (3, 2, 8), dtype, &Device::Cpu, 5)?;
        let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?;
        assert_eq!(out.output.dtype(), dtype);
        assert_eq!(out.weights.as_ref().unwrap().dtype(), dtype);
        let grads = out
            .output
            .to_dtype(DType::F32)?
            .sqr()?
            .sum_all()?
            .backward()?;
        for (name, t) in mha.named_parameters() {
            let g = grads
                .get(&t)
                .with_context(|| format!("{dtype:?} {name}: no gradient"))?;
            let norm = g
                .to_dtype(DType::F32)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f32>()?;
            assert!(norm.is_finite() && norm > 0.0, "{dtype:?} {name}: {norm}");
        }
    }
    Ok(())
}
