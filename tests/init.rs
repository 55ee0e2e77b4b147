//! Initialisation: PyTorch's distributions (values PyTorch 2.15 gave for E = 512, spec §3),
//! reproducible from a seed.

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{seeded_var_builder, MultiheadAttention, MultiheadAttentionConfig};
use candle_nn::VarMap;

struct Stats {
    max_abs: f64,
    mean: f64,
    std: f64,
}

fn stats(t: &Tensor) -> Result<Stats> {
    let v = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    Ok(Stats {
        max_abs: v.iter().fold(0., |m, x| m.max(x.abs())),
        mean,
        std,
    })
}

fn build(cfg: MultiheadAttentionConfig, seed: u64) -> Result<MultiheadAttention> {
    Ok(MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), seed, DType::F32, &Device::Cpu),
    )?)
}

/// A uniform U(±bound) sample: max close to the bound, mean ~0, std ~bound/√3.
fn assert_uniform(name: &str, t: &Tensor, bound: f64) -> Result<()> {
    let s = stats(t)?;
    let n = t.elem_count() as f64;
    assert!(
        s.max_abs <= bound && s.max_abs > 0.999 * bound,
        "{name}: max {} vs bound {bound}",
        s.max_abs
    );
    assert!(
        s.mean.abs() < 4.0 * bound / (3.0 * n).sqrt(),
        "{name}: mean {}",
        s.mean
    );
    assert!(
        (s.std / (bound / 3f64.sqrt()) - 1.0).abs() < 0.01,
        "{name}: std {}",
        s.std
    );
    Ok(())
}

#[test]
fn packed_init_matches_pytorch_e512() -> Result<()> {
    let mha = build(
        MultiheadAttentionConfig::new(512, 8).with_add_bias_kv(true),
        0,
    )?;
    // PyTorch: max|in_proj_weight| = 0.054126 ≈ √(6/2048) (xavier over the packed [3E, E]),
    // max|out_proj.weight| = 0.04419 = 1/√512, bias_k/bias_v std ≈ 1/√512, biases zero.
    assert_uniform(
        "in_proj_weight",
        mha.in_proj_weight().unwrap(),
        (6.0f64 / 2048.0).sqrt(),
    )?;
    let w = stats(mha.in_proj_weight().unwrap())?;
    assert!((w.max_abs - 0.054126).abs() < 1e-4, "{}", w.max_abs);
    assert_uniform(
        "out_proj.weight",
        mha.out_proj().weight(),
        1.0 / 512f64.sqrt(),
    )?;
    assert!((stats(mha.out_proj().weight())?.max_abs - 0.04419).abs() < 1e-4);
    for (name, t) in [
        ("bias_k", mha.bias_k().unwrap()),
        ("bias_v", mha.bias_v().unwrap()),
    ] {
        let s = stats(t)?;
        assert!((s.std - 0.0442).abs() < 0.006, "{name}: std {}", s.std);
        assert!(s.mean.abs() < 0.01, "{name}: mean {}", s.mean);
    }
    for t in [mha.in_proj_bias().unwrap(), mha.out_proj().bias().unwrap()] {
        assert_eq!(stats(t)?.max_abs, 0.0);
    }
    Ok(())
}

#[test]
fn separate_init_bounds_per_matrix() -> Result<()> {
    let mha = build(
        MultiheadAttentionConfig::new(512, 8)
            .with_kdim(256)
            .with_vdim(128),
        0,
    )?;
    assert_uniform(
        "q_proj_weight",
        mha.q_proj_weight().unwrap(),
        (6.0f64 / 1024.0).sqrt(),
    )?;
    assert_uniform(
        "k_proj_weight",
        mha.k_proj_weight().unwrap(),
        (6.0f64 / 768.0).sqrt(),
    )?;
    assert_uniform(
        "v_proj_weight",
        mha.v_proj_weight().unwrap(),
        (6.0f64 / 640.0).sqrt(),
    )?;
    assert!(mha.in_proj_weight().is_none());
    assert_eq!(mha.in_proj_bias().unwrap().dims(), &[1536]);
    Ok(())
}

#[test]
fn same_seed_same_weights_other_seed_other_weights() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(16, 4).with_add_bias_kv(true);
    let values = |m: &MultiheadAttention| -> Result<Vec<Vec<f32>>> {
        m.named_parameters()
            .iter()
            .map(|(_, t)| Ok(t.flatten_all()?.to_vec1::<f32>()?))
            .collect()
    };
    let (a, b, c) = (
        build(cfg.clone(), 9)?,
        build(cfg.clone(), 9)?,
        build(cfg, 10)?,
    );
    assert_eq!(values(&a)?, values(&b)?);
    assert_ne!(values(&a)?[0], values(&c)?[0]);
    Ok(())
}

#[test]
fn prefixes_give_pytorch_names() -> Result<()> {
    let varmap = VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
    MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2).with_add_bias_kv(true),
        vb.pp("encoder.layers.0.self_attn"),
    )?;
    MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2)
            .with_kdim(4)
            .with_bias(false),
        vb.pp("decoder.cross"),
    )?;
    let mut names: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "decoder.cross.k_proj_weight",
            "decoder.cross.out_proj.weight",
            "decoder.cross.q_proj_weight",
            "decoder.cross.v_proj_weight",
            "encoder.layers.0.self_attn.bias_k",
            "encoder.layers.0.self_attn.bias_v",
            "encoder.layers.0.self_attn.in_proj_bias",
            "encoder.layers.0.self_attn.in_proj_weight",
            "encoder.layers.0.self_attn.out_proj.bias",
            "encoder.layers.0.self_attn.out_proj.weight",
        ]
    );
    Ok(())
}
