//! Trains a module a few steps in Rust and writes what `scripts/verify_roundtrip.py` needs to
//! check that PyTorch loads it with `load_state_dict(strict=True)` and reproduces our outputs.
//!
//! ```text
//! cargo run --release --example export_for_pytorch -- DIR [self|cross]
//! .venv-torch/bin/python scripts/verify_roundtrip.py DIR
//! ```
//! `self`: f32 self-attention, seq-first. `cross`: f64 cross-attention with kdim/vdim,
//! bias_k/bias_v, a zero-attention column, batch_first and a key padding mask.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_mha::candle::{DType, Tensor};
use candle_mha::checkpoint::{save_modules, StateDict};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{Optimizer, VarMap};

fn main() -> Result<()> {
    // candle's element-wise threads as the `mha` CLI sets them (see `candle_mha::runtime`).
    for (name, value) in candle_mha::runtime::recommended_env() {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: export_for_pytorch DIR [self|cross]")?,
    );
    let case = args.next().unwrap_or_else(|| "self".into());
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (dev, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&dev)?;
    eprintln!("{notice}");
    let (cfg, dtype) = match case.as_str() {
        "self" => (MultiheadAttentionConfig::new(16, 4), DType::F32),
        "cross" => (
            MultiheadAttentionConfig::new(8, 2)
                .with_kdim(6)
                .with_vdim(4)
                .with_add_bias_kv(true)
                .with_add_zero_attn(true)
                .with_batch_first(true),
            DType::F64,
        ),
        other => bail!("unknown case {other}: expected self or cross"),
    };
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(cfg.clone(), seeded_var_builder(&varmap, 3, dtype, &dev))?;
    let shape = |len: usize, d: usize| {
        if cfg.batch_first {
            (2, len, d)
        } else {
            (len, 2, d)
        }
    };
    let q = candle_mha::rng::normal(0., 1., shape(5, cfg.embed_dim), dtype, &dev, 1)?;
    let (k, v) = match case.as_str() {
        "self" => (q.clone(), q.clone()),
        _ => (
            candle_mha::rng::normal(0., 1., shape(6, cfg.kdim()), dtype, &dev, 2)?,
            candle_mha::rng::normal(0., 1., shape(6, cfg.vdim()), dtype, &dev, 3)?,
        ),
    };
    let mut opts = AttentionOptions::new();
    if case == "cross" {
        opts = opts.with_key_padding_mask(Tensor::new(
            &[[0u8, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]],
            &dev,
        )?);
    }
    // A few AdamW steps so the saved values are ours, not an initialisation.
    let mut opt = candle_nn::AdamW::new_lr(varmap.all_vars(), 1e-2)?;
    for _ in 0..3 {
        let out = mha.forward(&q, &k, &v, &opts)?.output;
        opt.backward_step(&out.sqr()?.mean_all()?)?;
    }
    let out = mha.forward(&q, &k, &v, &opts)?;

    std::fs::create_dir_all(&dir)?;
    save_modules(dir.join("mha.safetensors"), &[("", &mha)])?;
    let mut io = vec![
        ("query".to_string(), q.clone()),
        ("output".to_string(), out.output),
        ("weights".to_string(), out.weights.context("need_weights")?),
    ];
    if case == "cross" {
        io.push(("key".into(), k));
        io.push(("value".into(), v));
    }
    if let Some(m) = &opts.key_padding_mask {
        io.push(("key_padding_mask".into(), m.clone()));
    }
    let b = |x: bool| x.to_string();
    let meta: HashMap<&str, String> = HashMap::from([
        ("embed_dim", cfg.embed_dim.to_string()),
        ("num_heads", cfg.num_heads.to_string()),
        ("kdim", cfg.kdim().to_string()),
        ("vdim", cfg.vdim().to_string()),
        ("bias", b(cfg.bias)),
        ("add_bias_kv", b(cfg.add_bias_kv)),
        ("add_zero_attn", b(cfg.add_zero_attn)),
        ("batch_first", b(cfg.batch_first)),
        (
            "dtype",
            if dtype == DType::F64 { "f64" } else { "f32" }.to_string(),
        ),
    ]);
    let io = meta.iter().fold(StateDict::from_tensors(io), |sd, (k, v)| {
        sd.with_metadata(k, v)
    });
    io.save_safetensors(dir.join("io.safetensors"))?;
    println!(
        "wrote {0}/mha.safetensors and {0}/io.safetensors ({case})",
        dir.display()
    );
    Ok(())
}
