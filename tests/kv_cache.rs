//! The key/value cache against the full forward: `forward_incremental` fed a sequence in
//! blocks (of 1, 2 and several tokens) must give, position by position, the output and the
//! weights (averaged and per head) of `forward` on the whole sequence with `is_causal` (the
//! oracle; `forward` itself is checked against PyTorch in `pytorch_parity.rs`), with key
//! padding (left padding included), `bias_k`/`bias_v`, zero attention, both layouts and
//! unbatched input, on both kernels. `forward_with_memory` must equal `forward(query, key,
//! value)`. Bad arguments: `tests/errors/kv_cache.rs`.

use candle_mha_test_support as common;

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
    /// 0: blocks of 1, 1: blocks of 2, 2: random blocks of 1..=7 tokens, 3: a prompt of
    /// most of the sequence at once, then one token at a time.
    blocks: u8,
    capacity: usize,
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
        blocks: pick(&mut rng, &[0, 1, 2, 3]),
        capacity: pick(&mut rng, &[0, 0, 1, 4, 100]),
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
    if case.blocks == 3 {
        let prompt = case.l - case.l / 4;
        sizes.push(prompt);
        left -= prompt;
    }
    while left > 0 {
        let b = match case.blocks {
            0 | 3 => 1,
            1 => 2,
            _ => rng.random_range(1..=7),
        }
        .min(left);
        sizes.push(b);
        left -= b;
    }
    sizes
}

/// [`check_case_on`] on every kernel.
fn check_case(case: &Case, dtype: DType, tol: f64) -> Result<f64> {
    let mut worst = 0f64;
    for kernel in [
        AttentionKernel::Fused,
        AttentionKernel::Reference,
        AttentionKernel::Auto,
    ] {
        worst = worst.max(check_case_on(case, kernel, dtype, tol)?);
    }
    Ok(worst)
}

/// Feeds the case's sequence through the cache in blocks and compares every block with the
/// full causal forward; returns the worst relative error.
fn check_case_on(case: &Case, kernel: AttentionKernel, dtype: DType, tol: f64) -> Result<f64> {
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
                .with_kernel(kernel);
            if let Some(m) = &kpm {
                let m = m.narrow(1, start, t)?;
                opts = opts.with_key_padding_mask(if case.unbatched { m.squeeze(0)? } else { m });
            }
            let out = mha.forward_incremental(&q, &mut cache, &opts)?;
            let what = format!(
                "{case:?} {kernel:?} {dtype:?} positions {start}..{}",
                start + t
            );
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

#[test]
fn forward_with_memory_equals_cross_attention_forward() -> Result<()> {
    for seed in 200..240 {
        let mut rng = rng_from_seed(seed);
        let (h, d) = (pick(&mut rng, &[1, 2, 4]), pick(&mut rng, &[2, 5]));
        let e = h * d;
        let (kdim, vdim) = match rng.random_bool(0.6) {
            true => (e + 3, e + 1),
            false => (e, e),
        };
        let (batch_first, unbatched) = (rng.random_bool(0.5), rng.random_bool(0.2));
        let n = if unbatched {
            1
        } else {
            pick(&mut rng, &[1, 3])
        };
        let (l, s) = (pick(&mut rng, &[1, 4, 9]), pick(&mut rng, &[1, 6, 70]));
        let cfg = MultiheadAttentionConfig::new(e, h)
            .with_kdim(kdim)
            .with_vdim(vdim)
            .with_batch_first(batch_first)
            .with_bias(rng.random_bool(0.8))
            .with_add_bias_kv(rng.random_bool(0.3))
            .with_add_zero_attn(rng.random_bool(0.3));
        let varmap = VarMap::new();
        let dtype = pick(&mut rng, &[DType::F32, DType::F64]);
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
        let mha =
            MultiheadAttention::new(cfg, seeded_var_builder(&varmap, seed, dtype, &Device::Cpu))?;
        let shape = |len: usize, f: usize| -> Vec<usize> {
            match (unbatched, batch_first) {
                (true, _) => vec![len, f],
                (false, true) => vec![n, len, f],
                (false, false) => vec![len, n, f],
            }
        };
        let q = normal(0., 1., shape(l, e), dtype, &Device::Cpu, seed + 1)?;
        let k = normal(0., 1., shape(s, kdim), dtype, &Device::Cpu, seed + 2)?;
        let v = normal(0., 1., shape(s, vdim), dtype, &Device::Cpu, seed + 3)?;
        let pad: Vec<u8> = (0..n * s).map(|_| u8::from(rng.random_bool(0.3))).collect();
        let kpm = Tensor::from_vec(pad, (n, s), &Device::Cpu)?;
        let kpm = if unbatched { kpm.squeeze(0)? } else { kpm };
        let average = rng.random_bool(0.5);
        let full = mha.forward(
            &q,
            &k,
            &v,
            &AttentionOptions::new()
                .with_key_padding_mask(kpm.clone())
                .with_average_attn_weights(average)
                .with_kernel(AttentionKernel::Reference),
        )?;
        let memory = mha.project_memory(&k, &v, Some(&kpm))?;
        assert_eq!((memory.batch_size(), memory.len()), (n, s));
        let seq_dim = if batch_first && !unbatched { 1 } else { 0 };
        let kernel = pick(
            &mut rng,
            &[AttentionKernel::Fused, AttentionKernel::Reference],
        );
        let opts = IncrementalOptions::new()
            .with_need_weights(true)
            .with_average_attn_weights(average)
            .with_kernel(kernel);
        // The query in two blocks: cross-attention has no causal mask, so blocks are free.
        let first = l / 2;
        let mut outs = Vec::new();
        let mut weights = Vec::new();
        for (start, len) in [(0, first), (first, l - first)] {
            let out = mha.forward_with_memory(&q.narrow(seq_dim, start, len)?, &memory, &opts)?;
            outs.push(out.output);
            weights.push(out.weights.expect("weights asked for"));
        }
        let what = format!("seed {seed}");
        assert_close(&what, &Tensor::cat(&outs, seq_dim)?, &full.output, tol)?;
        let w = Tensor::cat(&weights, weights[0].rank() - 2)?;
        assert_close(&what, &w, full.weights.as_ref().unwrap(), tol)?;
    }
    Ok(())
}

fn small_module(e: usize, h: usize, dtype: DType) -> Result<MultiheadAttention> {
    let varmap = VarMap::new();
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
    Ok(MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, 7, dtype, &Device::Cpu),
    )?)
}

#[test]
fn cache_grows_past_its_capacity_and_reset_reuses_it() -> Result<()> {
    let mha = small_module(8, 2, DType::F64)?;
    let x = normal(0., 1., (2, 150, 8), DType::F64, &Device::Cpu, 1)?;
    let full = mha.forward(&x, &x, &x, &AttentionOptions::new().with_is_causal(true))?;
    let mut cache = KvCache::with_capacity(&mha, 2, 3)?;
    assert!(cache.is_empty() && cache.capacity() >= 3 && cache.batch_size() == 2);
    let initial = cache.capacity();
    for round in 0..2 {
        let mut outs = Vec::new();
        for p in 0..150 {
            let q = x.narrow(1, p, 1)?;
            outs.push(
                mha.forward_incremental(&q, &mut cache, &IncrementalOptions::new())?
                    .output,
            );
        }
        assert_eq!(cache.len(), 150);
        assert!(cache.capacity() >= 150 && cache.capacity() > initial);
        let what = format!("round {round}");
        assert_close(&what, &Tensor::cat(&outs, 1)?, &full.output, 1e-12)?;
        let cap = cache.capacity();
        cache.reset();
        assert!(cache.is_empty());
        assert_eq!(cache.capacity(), cap, "reset keeps the buffers");
    }
    Ok(())
}

#[test]
fn a_cloned_cache_is_independent() -> Result<()> {
    let mha = small_module(8, 2, DType::F64)?;
    let x = normal(0., 1., (1, 12, 8), DType::F64, &Device::Cpu, 5)?;
    let y = normal(0., 1., (1, 4, 8), DType::F64, &Device::Cpu, 6)?;
    let opts = IncrementalOptions::new();
    let mut a = KvCache::with_capacity(&mha, 1, 64)?;
    mha.forward_incremental(&x.narrow(1, 0, 8)?, &mut a, &opts)?;
    let mut b = a.clone();
    // Two continuations from the same prefix (as beam search makes): each must equal the
    // full forward over its own sequence, whatever the other wrote.
    // Interleaved, so that shared buffers would show: b overwrites positions 8..12.
    mha.forward_incremental(&x.narrow(1, 8, 2)?, &mut a, &opts)?;
    let out_b = mha.forward_incremental(&y, &mut b, &opts)?;
    let out_a = mha.forward_incremental(&x.narrow(1, 10, 2)?, &mut a, &opts)?;
    assert_eq!((a.len(), b.len()), (12, 12));
    let causal = AttentionOptions::new().with_is_causal(true);
    let full_a = mha.forward(&x, &x, &x, &causal)?.output;
    let xy = Tensor::cat(&[&x.narrow(1, 0, 8)?, &y], 1)?;
    let full_b = mha.forward(&xy, &xy, &xy, &causal)?.output;
    assert_close("a", &out_a.output, &full_a.narrow(1, 10, 2)?, 1e-12)?;
    assert_close("b", &out_b.output, &full_b.narrow(1, 8, 4)?, 1e-12)?;
    Ok(())
}

/// Batched generation's pattern: left-padded prompts with their mask, then new tokens with no
/// mask at all; the cache must remember the prompt's padding and pad nothing new.
#[test]
fn prompt_padding_is_remembered_when_later_calls_have_no_mask() -> Result<()> {
    for kernel in [AttentionKernel::Fused, AttentionKernel::Reference] {
        let mha = small_module(8, 2, DType::F64)?;
        let (prompt, l) = (6, 10);
        let x = normal(0., 1., (3, l, 8), DType::F64, &Device::Cpu, 9)?;
        // Row 0 unpadded, row 1 left-padded by 2, row 2 by 5.
        let mut pad = vec![0u8; 3 * l];
        pad[l..l + 2].fill(1);
        pad[2 * l..2 * l + 5].fill(1);
        let kpm = Tensor::from_vec(pad, (3, l), &Device::Cpu)?;
        let full = mha.forward(
            &x,
            &x,
            &x,
            &AttentionOptions::new()
                .with_is_causal(true)
                .with_key_padding_mask(kpm.clone()),
        )?;
        let mut cache = KvCache::new(&mha, 3)?;
        let opts = IncrementalOptions::new()
            .with_kernel(kernel)
            .with_need_weights(true);
        let first = opts
            .clone()
            .with_key_padding_mask(kpm.narrow(1, 0, prompt)?);
        let out = mha.forward_incremental(&x.narrow(1, 0, prompt)?, &mut cache, &first)?;
        let mut outs = vec![out.output];
        for p in prompt..l {
            outs.push(
                mha.forward_incremental(&x.narrow(1, p, 1)?, &mut cache, &opts)?
                    .output,
            );
        }
        let what = format!("{kernel:?}");
        assert_close(&what, &Tensor::cat(&outs, 1)?, &full.output, 1e-12)?;
    }
    Ok(())
}

/// No new position (or an empty batch): empty results of the shapes `forward` gives for an
/// empty query, the extra key rows counted; the cache is left as it was.
#[test]
fn empty_blocks_give_forwards_empty_shapes() -> Result<()> {
    let cfg = MultiheadAttentionConfig::new(8, 2).with_add_bias_kv(true);
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(
        cfg,
        seeded_var_builder(&varmap, 3, DType::F32, &Device::Cpu),
    )?;
    for n in [2usize, 0] {
        let empty = Tensor::zeros((0, n, 8), DType::F32, &Device::Cpu)?;
        for average in [true, false] {
            let opts = AttentionOptions::new().with_average_attn_weights(average);
            let full = mha.forward(&empty, &empty, &empty, &opts)?;
            let mut cache = KvCache::new(&mha, n)?;
            let inc_opts = IncrementalOptions::new()
                .with_need_weights(true)
                .with_average_attn_weights(average);
            let inc = mha.forward_incremental(&empty, &mut cache, &inc_opts)?;
            assert_eq!(inc.output.dims(), full.output.dims());
            let (w_inc, w_full) = (inc.weights.unwrap(), full.weights.unwrap());
            assert_eq!(w_inc.dims(), w_full.dims(), "N = {n}, average = {average}");
            assert!(cache.is_empty());
            let none = mha.forward_incremental(&empty, &mut cache, &IncrementalOptions::new())?;
            assert!(none.weights.is_none());
        }
    }
    Ok(())
}
