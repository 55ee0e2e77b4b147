//! The key/value cache against the full forward: `forward_incremental` fed a sequence in
//! blocks (of 1, 2 and several tokens) must give, position by position, the output and the
//! weights (averaged and per head) of `forward` on the whole sequence with `is_causal` (the
//! oracle; `forward` itself is checked against PyTorch in `pytorch_parity.rs`), with key
//! padding (left padding included), `bias_k`/`bias_v`, zero attention, both layouts and
//! unbatched input, on both kernels. `forward_with_memory` must equal `forward(query, key,
//! value)`. Bad arguments give errors naming them.

mod common;

use anyhow::{bail, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::rng::{normal, rng_from_seed};
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, IncrementalOptions, KvCache,
    MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::VarMap;
use common::assert_close;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

/// One random self-attention configuration.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    n: usize,
    l: usize,
    h: usize,
    d: usize,
    batch_first: bool,
    unbatched: bool,
    bias: bool,
    add_bias_kv: bool,
    add_zero_attn: bool,
    /// 0: none, 1: u8 (random, with a leading padded block on some rows), 2: float.
    key_padding: u8,
    average: bool,
    /// 0: blocks of 1, 1: blocks of 2, 2: random blocks of 1..=7 tokens.
    blocks: u8,
    capacity: usize,
    kernel: AttentionKernel,
}

fn random_case(seed: u64) -> Case {
    let mut rng = rng_from_seed(seed);
    Case {
        seed,
        n: pick(&mut rng, &[1, 2, 3]),
        l: pick(&mut rng, &[1, 2, 5, 9, 17, 70]),
        h: pick(&mut rng, &[1, 2, 4]),
        d: pick(&mut rng, &[1, 3, 8]),
        batch_first: rng.random_bool(0.5),
        unbatched: rng.random_bool(0.2),
        bias: rng.random_bool(0.8),
        add_bias_kv: rng.random_bool(0.3),
        add_zero_attn: rng.random_bool(0.3),
        key_padding: pick(&mut rng, &[0, 1, 1, 2]),
        average: rng.random_bool(0.5),
        blocks: pick(&mut rng, &[0, 1, 2]),
        capacity: pick(&mut rng, &[0, 0, 1, 4, 100]),
        kernel: pick(
            &mut rng,
            &[
                AttentionKernel::Auto,
                AttentionKernel::Fused,
                AttentionKernel::Reference,
            ],
        ),
    }
}

fn module(case: &Case, dtype: DType) -> Result<MultiheadAttention> {
    let cfg = MultiheadAttentionConfig::new(case.h * case.d, case.h)
        .with_batch_first(case.batch_first)
        .with_bias(case.bias)
        .with_add_bias_kv(case.add_bias_kv)
        .with_add_zero_attn(case.add_zero_attn);
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, case.seed, DType::F64, &Device::Cpu),
    )?;
    // Parameters drawn in f64 and cast, so every dtype runs the same module.
    let params: Vec<(String, Tensor)> = mha
        .named_parameters()
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_dtype(dtype)?)))
        .collect::<Result<_>>()?;
    let tensors = params
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    Ok(MultiheadAttention::from_tensors(
        mha.config().clone(),
        tensors,
    )?)
}

/// The key padding mask `(N, L)` of a case: u8 with some rows left-padded, or float.
fn key_padding(case: &Case, rng: &mut ChaCha8Rng, dtype: DType) -> Result<Option<Tensor>> {
    let (n, l) = (case.n, case.l);
    let mut pad = vec![0u8; n * l];
    for b in 0..n {
        // Left padding as batched prompts give it, on some rows.
        let lead = if rng.random_bool(0.5) {
            rng.random_range(0..=l.min(4))
        } else {
            0
        };
        for p in 0..l {
            pad[b * l + p] = u8::from(p < lead || rng.random_bool(0.15));
        }
    }
    let mask = Tensor::from_vec(pad, (n, l), &Device::Cpu)?;
    Ok(match case.key_padding {
        0 => None,
        1 => Some(mask),
        _ => {
            // Float: -inf where padded, else a small additive bias.
            let bias = normal(0., 0.5, (n, l), DType::F64, &Device::Cpu, case.seed + 3)?;
            let neg = Tensor::full(f64::NEG_INFINITY, (n, l), &Device::Cpu)?;
            Some(mask.ne(0u8)?.where_cond(&neg, &bias)?.to_dtype(dtype)?)
        }
    })
}

fn block_sizes(case: &Case, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut left = case.l;
    while left > 0 {
        let b = match case.blocks {
            0 => 1,
            1 => 2,
            _ => rng.random_range(1..=7),
        }
        .min(left);
        sizes.push(b);
        left -= b;
    }
    sizes
}

/// Feeds the case's sequence through the cache in blocks and compares every block with the
/// full causal forward; returns the worst relative error.
fn check_case(case: &Case, dtype: DType, tol: f64) -> Result<f64> {
    let mha = module(case, dtype)?;
    let mut rng = rng_from_seed(case.seed + 1);
    let (n, l, e) = (case.n, case.l, case.h * case.d);
    let n_eff = if case.unbatched { 1 } else { n };
    let case = &Case {
        n: n_eff,
        ..case.clone()
    };
    let shape: Vec<usize> = match (case.unbatched, case.batch_first) {
        (true, _) => vec![l, e],
        (false, true) => vec![n_eff, l, e],
        (false, false) => vec![l, n_eff, e],
    };
    let x = normal(0., 1., shape, DType::F64, &Device::Cpu, case.seed + 2)?.to_dtype(dtype)?;
    let kpm = key_padding(case, &mut rng, dtype)?;
    let seq_dim = if case.batch_first && !case.unbatched {
        1
    } else {
        0
    };
    let mut worst = 0f64;
    for need_weights in [true, false] {
        let mut full_opts = AttentionOptions::new()
            .with_is_causal(true)
            .with_need_weights(need_weights)
            .with_average_attn_weights(case.average)
            .with_kernel(AttentionKernel::Reference);
        if let Some(m) = &kpm {
            let m = if case.unbatched {
                m.squeeze(0)?
            } else {
                m.clone()
            };
            full_opts = full_opts.with_key_padding_mask(m);
        }
        let full = mha.forward(&x, &x, &x, &full_opts)?;
        let mut cache = KvCache::with_capacity(&mha, n_eff, case.capacity)?;
        let extra = usize::from(case.add_bias_kv) + usize::from(case.add_zero_attn);
        let mut start = 0;
        for t in block_sizes(case, &mut rng) {
            let q = x.narrow(seq_dim, start, t)?;
            let mut opts = IncrementalOptions::new()
                .with_need_weights(need_weights)
                .with_average_attn_weights(case.average)
                .with_kernel(case.kernel);
            if let Some(m) = &kpm {
                let m = m.narrow(1, start, t)?;
                opts = opts.with_key_padding_mask(if case.unbatched { m.squeeze(0)? } else { m });
            }
            let out = mha.forward_incremental(&q, &mut cache, &opts)?;
            let what = format!("{case:?} {dtype:?} positions {start}..{}", start + t);
            let want = full.output.narrow(seq_dim, start, t)?;
            worst = worst.max(assert_close(&what, &out.output, &want, tol)?);
            let len = start + t;
            assert_eq!(cache.len(), len);
            match (&out.weights, &full.weights) {
                (None, None) => {}
                (Some(w), Some(fw)) => {
                    // Rows start..start+t; the positions so far, then the extra columns.
                    let r = fw.rank();
                    let rows = fw.narrow(r - 2, start, t)?;
                    let want = Tensor::cat(
                        &[&rows.narrow(r - 1, 0, len)?, &rows.narrow(r - 1, l, extra)?],
                        r - 1,
                    )?;
                    let what = format!("{what} weights");
                    worst = worst.max(assert_close(&what, w, &want, tol)?);
                }
                (w, fw) => bail!(
                    "weights: incremental {:?}, full {:?}",
                    w.as_ref().map(|w| w.dims().to_vec()),
                    fw.as_ref().map(|w| w.dims().to_vec())
                ),
            }
            start += t;
        }
    }
    Ok(worst)
}

#[test]
fn incremental_equals_full_causal_forward_f32_f64() -> Result<()> {
    let mut worst = (0f64, 0f64);
    for seed in 0..60 {
        let case = random_case(seed);
        worst.0 = worst.0.max(check_case(&case, DType::F32, 1e-5)?);
        worst.1 = worst.1.max(check_case(&case, DType::F64, 1e-12)?);
    }
    println!(
        "worst relative error: f32 {:.2e}, f64 {:.2e}",
        worst.0, worst.1
    );
    Ok(())
}

#[test]
fn incremental_equals_full_causal_forward_half() -> Result<()> {
    for seed in 100..115 {
        let case = random_case(seed);
        check_case(&case, DType::F16, 1e-2)?;
        check_case(&case, DType::BF16, 5e-2)?;
    }
    Ok(())
}
