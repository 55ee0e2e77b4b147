//! The key/value caches' bad arguments: errors that name them.

use anyhow::{bail, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::{
    seeded_var_builder, IncrementalOptions, KvCache, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::VarMap;

fn small_module(e: usize, h: usize, dtype: DType) -> Result<MultiheadAttention> {
    let varmap = VarMap::new();
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
    Ok(MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, 7, dtype, &Device::Cpu),
    )?)
}

/// Fails unless `result` is an error whose message contains every one of `words`.
fn expect_err<T>(result: candle_mha::candle::Result<T>, words: &[&str]) -> Result<()> {
    match result {
        Ok(_) => bail!("expected an error mentioning {words:?}, got Ok"),
        Err(e) => {
            let msg = e.to_string();
            for w in words {
                if !msg.contains(w) {
                    bail!("error {msg:?} does not mention {w:?}")
                }
            }
            Ok(())
        }
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() -> Result<()> {
    let dev = Device::Cpu;
    let mha = small_module(8, 2, DType::F32)?;
    let opts = IncrementalOptions::new();
    let x = Tensor::zeros((2, 3, 8), DType::F32, &dev)?;
    // A cache made for another module: heads, embed size, dtype, extra rows.
    let other_heads = small_module(8, 4, DType::F32)?;
    let mut c = KvCache::new(&other_heads, 2)?;
    expect_err(
        mha.forward_incremental(&x, &mut c, &opts),
        &["cache", "num_heads", "4", "2"],
    )?;
    let other_e = small_module(12, 2, DType::F32)?;
    let mut c = KvCache::new(&other_e, 2)?;
    expect_err(
        mha.forward_incremental(&x, &mut c, &opts),
        &["cache", "embed_dim", "12", "8"],
    )?;
    let other_dtype = small_module(8, 2, DType::F64)?;
    let mut c = KvCache::new(&other_dtype, 2)?;
    expect_err(
        mha.forward_incremental(&x, &mut c, &opts),
        &["cache", "dtype", "F64", "F32"],
    )?;
    let varmap = VarMap::new();
    let with_bias_kv = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2)
            .with_batch_first(true)
            .with_add_bias_kv(true),
        seeded_var_builder(&varmap, 1, DType::F32, &dev),
    )?;
    let mut c = KvCache::new(&with_bias_kv, 2)?;
    expect_err(
        mha.forward_incremental(&x, &mut c, &opts),
        &["cache", "extra"],
    )?;
    // A batch size that differs from the cache's, also mid-way.
    let mut c = KvCache::new(&mha, 2)?;
    mha.forward_incremental(&x, &mut c, &opts)?;
    let x3 = Tensor::zeros((3, 1, 8), DType::F32, &dev)?;
    expect_err(
        mha.forward_incremental(&x3, &mut c, &opts),
        &["batch size 3", "batch size 2"],
    )?;
    assert_eq!(c.len(), 3, "a failed call appends nothing");
    // A query of the wrong rank, embed size or dtype.
    let x4 = Tensor::zeros((2, 1, 1, 8), DType::F32, &dev)?;
    expect_err(
        mha.forward_incremental(&x4, &mut c, &opts),
        &["query", "4-D", "[2, 1, 1, 8]"],
    )?;
    let x_e = Tensor::zeros((2, 1, 6), DType::F32, &dev)?;
    expect_err(
        mha.forward_incremental(&x_e, &mut c, &opts),
        &["query", "8", "6"],
    )?;
    let x_d = Tensor::zeros((2, 1, 8), DType::F64, &dev)?;
    expect_err(
        mha.forward_incremental(&x_d, &mut c, &opts),
        &["query", "F64", "F32"],
    )?;
    // An unbatched query needs a cache of batch 1.
    let x_u = Tensor::zeros((1, 8), DType::F32, &dev)?;
    expect_err(
        mha.forward_incremental(&x_u, &mut c, &opts),
        &["batch size 1", "batch size 2"],
    )?;
    // A key padding mask of the wrong shape or dtype.
    let q = Tensor::zeros((2, 1, 8), DType::F32, &dev)?;
    let bad = opts
        .clone()
        .with_key_padding_mask(Tensor::zeros((2, 4), DType::U8, &dev)?);
    expect_err(
        mha.forward_incremental(&q, &mut c, &bad),
        &["key_padding_mask", "(2, 1)", "[2, 4]"],
    )?;
    let bad = opts
        .clone()
        .with_key_padding_mask(Tensor::zeros((2, 1), DType::I64, &dev)?);
    expect_err(
        mha.forward_incremental(&q, &mut c, &bad),
        &["key_padding_mask", "I64"],
    )?;
    assert_eq!(c.len(), 3, "failed calls append nothing");
    // Cross-attention: a memory of another batch, a mask in the options, bad memory inputs.
    let k = Tensor::zeros((2, 5, 8), DType::F32, &dev)?;
    let memory = mha.project_memory(&k, &k, None)?;
    let q3 = Tensor::zeros((3, 1, 8), DType::F32, &dev)?;
    expect_err(
        mha.forward_with_memory(&q3, &memory, &opts),
        &["memory", "batch size 3", "batch size 2"],
    )?;
    let with_mask = opts
        .clone()
        .with_key_padding_mask(Tensor::zeros((2, 5), DType::U8, &dev)?);
    expect_err(
        mha.forward_with_memory(&q, &memory, &with_mask),
        &["key_padding_mask", "project_memory"],
    )?;
    let kpm = Tensor::zeros((2, 4), DType::U8, &dev)?;
    expect_err(
        mha.project_memory(&k, &k, Some(&kpm)),
        &["key_padding_mask", "(2, 5)", "[2, 4]"],
    )?;
    let v_bad = Tensor::zeros((2, 5, 7), DType::F32, &dev)?;
    expect_err(
        mha.project_memory(&k, &v_bad, None),
        &["value", "vdim=8", "7"],
    )?;
    let memory_other = other_heads.project_memory(&k, &k, None)?;
    expect_err(
        mha.forward_with_memory(&q, &memory_other, &opts),
        &["memory", "num_heads"],
    )?;
    // Self-attention needs kdim = vdim = E.
    let cross = MultiheadAttention::new(
        MultiheadAttentionConfig::new(8, 2).with_kdim(5),
        seeded_var_builder(&varmap, 2, DType::F32, &dev),
    )?;
    let mut c = KvCache::new(&cross, 1)?;
    let xs = Tensor::zeros((1, 1, 8), DType::F32, &dev)?;
    expect_err(
        cross.forward_incremental(&xs, &mut c, &opts),
        &["kdim", "5"],
    )?;
    Ok(())
}
