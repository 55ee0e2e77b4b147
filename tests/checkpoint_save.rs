//! Saving modules for PyTorch: keys, shapes, dtypes and metadata of PyTorch's layout, and
//! loading them back.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha::checkpoint::{
    find_attention_modules, load_attention_file, save_modules, AttentionLoadOptions,
    NamedParameters, StateDict,
};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{Optimizer, VarMap};
use common::assert_close;

fn names_shapes_dtypes(sd: &StateDict) -> Vec<(String, Vec<usize>, DType)> {
    sd.tensors()
        .iter()
        .map(|(n, t)| (n.clone(), t.dims().to_vec(), t.dtype()))
        .collect()
}

/// A module trained a few steps in Rust and saved: PyTorch's keys, shapes, dtypes and
/// metadata, exactly; it loads back to the same outputs. (`scripts/verify_roundtrip.py` checked
/// once that PyTorch loads such a file strictly and reproduces our outputs; see the README.)
#[test]
fn save_trained_module_with_pytorch_layout() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let varmap = VarMap::new();
    let cfg = MultiheadAttentionConfig::new(8, 2)
        .with_add_bias_kv(true)
        .with_batch_first(true);
    let mha = MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, 5, DType::F32, &Device::Cpu),
    )?;
    let x = candle_mha::rng::normal(0., 1., (2, 4, 8), DType::F32, &Device::Cpu, 1)?;
    let mut opt = candle_nn::AdamW::new_lr(varmap.all_vars(), 1e-2)?;
    for _ in 0..3 {
        let out = mha.forward(&x, &x, &x, &AttentionOptions::new())?.output;
        opt.backward_step(&out.sqr()?.mean_all()?)?;
    }
    let path = dir.path().join("mha.safetensors");
    save_modules(&path, &[("", &mha)])?;
    let back = StateDict::load(&path)?;
    let expected = [
        ("bias_k", vec![1, 1, 8]),
        ("bias_v", vec![1, 1, 8]),
        ("in_proj_bias", vec![24]),
        ("in_proj_weight", vec![24, 8]),
        ("out_proj.bias", vec![8]),
        ("out_proj.weight", vec![8, 8]),
    ];
    let want: Vec<_> = expected
        .iter()
        .map(|(n, s)| (n.to_string(), s.clone(), DType::F32))
        .collect();
    assert_eq!(names_shapes_dtypes(&back), want);
    let meta: Vec<_> = back
        .metadata()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(meta, [("format", "pt")]);
    // Exactly our values, and the same outputs after loading.
    for (name, t) in mha.named_parameters() {
        assert_close(&name, back.get(&name).unwrap(), &t, 0.0)?;
    }
    let opts = AttentionLoadOptions::new(2).with_batch_first(true);
    let loaded = load_attention_file(&path, "", &opts, DType::F32, &Device::Cpu)?;
    let a = mha.forward(&x, &x, &x, &AttentionOptions::new())?.output;
    let b = loaded
        .module
        .forward(&x, &x, &x, &AttentionOptions::new())?
        .output;
    assert_close("reloaded output", &b, &a, 0.0)?;
    // Atomic write: nothing but the file is left in the directory.
    let entries: Vec<_> = std::fs::read_dir(dir.path())?
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["mha.safetensors"]);
    Ok(())
}

#[test]
fn save_several_modules_at_prefixes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let vb = seeded_var_builder(&VarMap::new(), 0, DType::F32, &Device::Cpu);
    let a = MultiheadAttention::new(MultiheadAttentionConfig::new(8, 2), vb.pp("x"))?;
    let b = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2)
            .with_kdim(4)
            .with_bias(false),
        vb.pp("y"),
    )?;
    let path = dir.path().join("two.safetensors");
    let modules: [(&str, &dyn NamedParameters); 2] =
        [("encoder.layers.0.self_attn", &a), ("decoder.cross", &b)];
    save_modules(&path, &modules)?;
    let sd = StateDict::load(&path)?;
    let names: Vec<&str> = sd.tensors().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "decoder.cross.k_proj_weight",
            "decoder.cross.out_proj.weight",
            "decoder.cross.q_proj_weight",
            "decoder.cross.v_proj_weight",
            "encoder.layers.0.self_attn.in_proj_bias",
            "encoder.layers.0.self_attn.in_proj_weight",
            "encoder.layers.0.self_attn.out_proj.bias",
            "encoder.layers.0.self_attn.out_proj.weight",
        ]
    );
    assert_eq!(find_attention_modules(&sd).len(), 2);
    Ok(())
}
