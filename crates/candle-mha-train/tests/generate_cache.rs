//! Incremental decoding of `NextTokenPredictor` through its key/value cache:
//! logits fed in blocks equal the full forward's, generation gives the same tokens with and
//! without the cache (also past `max_len`), a batch of prompts gives each prompt's single
//! result, and a misused cache is a clear error.

use anyhow::Result;
use candle_mha::candle::{DType, Device, IndexOp, Tensor};
use candle_mha::rng::rng_from_seed;
use candle_mha::{seeded_var_builder, AttentionKernel, StackKvCache};
use candle_mha_train::models::{
    generate, generate_batch, generate_stream, GenerateConfig, NextTokenPredictor,
    NextTokenPredictorConfig,
};
use rand::Rng;

/// A model with seeded random weights.
fn model(
    seed: u64,
    dtype: DType,
    layers: usize,
    heads: usize,
    max_len: usize,
) -> Result<NextTokenPredictor> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: 13,
        max_len,
        embed_dim: 8 * heads,
        num_heads: heads,
        num_layers: layers,
        ff_dim: 32,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = candle_nn::VarMap::new();
    let vb = seeded_var_builder(&varmap, seed, dtype, &Device::Cpu);
    Ok(NextTokenPredictor::new(cfg, vb)?)
}

/// Random ids `(N, L)`.
fn tokens(seed: u64, n: usize, l: usize, vocab: u32) -> Result<Tensor> {
    let mut rng = rng_from_seed(seed);
    let ids: Vec<u32> = (0..n * l).map(|_| rng.random_range(0..vocab)).collect();
    Ok(Tensor::from_vec(ids, (n, l), &Device::Cpu)?)
}

/// max |a - b| / max |b|.
fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_dtype(DType::F64)?;
    let b = b.to_dtype(DType::F64)?;
    let diff = (&a - &b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    let scale = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    Ok(diff / scale.max(f64::MIN_POSITIVE))
}

/// Feeds `tokens (N, L)` in blocks of `sizes` (cycled) and returns the logits `(N, L, V)`.
fn incremental(
    m: &NextTokenPredictor,
    tokens: &Tensor,
    kpm: Option<&Tensor>,
    sizes: &[usize],
) -> Result<Tensor> {
    let (n, l) = tokens.dims2()?;
    let mut cache = m.new_cache(n)?;
    let mut out = Vec::new();
    let mut start = 0;
    for &size in sizes.iter().cycle() {
        if start == l {
            break;
        }
        let t = size.min(l - start);
        let block = tokens.narrow(1, start, t)?;
        let mask = kpm.map(|k| k.narrow(1, start, t)).transpose()?;
        out.push(m.forward_incremental(&block, &mut cache, mask.as_ref())?);
        start += t;
        assert_eq!(cache.len(), start);
    }
    Ok(Tensor::cat(&out, 1)?)
}

#[test]
fn incremental_logits_equal_the_full_forward_in_blocks() -> Result<()> {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        for (seed, (layers, heads, max_len, n, l)) in
            [(2, 2, 16, 2, 11), (1, 1, 9, 3, 9), (3, 4, 24, 1, 20)]
                .into_iter()
                .enumerate()
        {
            let m = model(seed as u64, dtype, layers, heads, max_len)?;
            let x = tokens(100 + seed as u64, n, l, 13)?;
            let want = m.forward(&x, None)?;
            for sizes in [&[1][..], &[2], &[3, 1, 5], &[l]] {
                for kernel in [AttentionKernel::Auto, AttentionKernel::Reference] {
                    let m = m.clone().with_attention_kernel(kernel);
                    let got = incremental(&m, &x, None, sizes)?;
                    let d = rel_diff(&got, &want)?;
                    assert!(
                        d <= tol,
                        "{dtype:?} layers {layers} heads {heads} blocks {sizes:?} {kernel:?}: \
                         rel diff {d:e} > {tol:e}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn incremental_logits_with_key_padding_equal_the_full_forward() -> Result<()> {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let m = model(4, dtype, 2, 2, 12)?;
        let (n, l) = (3, 10);
        let x = tokens(5, n, l, 13)?;
        // Row 0 unpadded, row 1 padded at the end, row 2 with padding in the middle.
        let mut mask = vec![0u8; n * l];
        for c in 7..l {
            mask[l + c] = 1;
        }
        mask[2 * l + 3] = 1;
        mask[2 * l + 4] = 1;
        let kpm = Tensor::from_vec(mask, (n, l), &Device::Cpu)?;
        let want = m.forward(&x, Some(&kpm))?;
        for sizes in [&[1][..], &[2], &[4, 1]] {
            let got = incremental(&m, &x, Some(&kpm), sizes)?;
            let d = rel_diff(&got, &want)?;
            assert!(
                d <= tol,
                "{dtype:?} blocks {sizes:?}: rel diff {d:e} > {tol:e}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_left_padded_row_gives_the_logits_of_the_row_alone() -> Result<()> {
    let m = model(6, DType::F64, 2, 2, 12)?;
    let short = tokens(7, 1, 5, 13)?;
    let long = tokens(8, 1, 9, 13)?;
    // Row 0: 4 padding columns then `short`; row 1: `long`.
    let padded = Tensor::cat(
        &[&Tensor::zeros((1, 4), DType::U32, &Device::Cpu)?, &short],
        1,
    )?;
    let batch = Tensor::cat(&[&padded, &long], 0)?;
    let mut mask = vec![0u8; 18];
    mask[..4].fill(1);
    let kpm = Tensor::from_vec(mask, (2, 9), &Device::Cpu)?;
    let mut cache = m.new_cache(2)?;
    cache.set_left_padding(&[4, 0])?;
    let got = m.forward_incremental(&batch, &mut cache, Some(&kpm))?;
    let next = Tensor::new(&[[3u32], [5]], &Device::Cpu)?;
    let got_next = m.forward_incremental(&next, &mut cache, None)?;
    let short_next = Tensor::cat(&[&short, &next.i(0..1)?], 1)?;
    let long_next = Tensor::cat(&[&long, &next.i(1..2)?], 1)?;
    let want_short = m.forward(&short_next, None)?;
    let want_long = m.forward(&long_next, None)?;
    let d = rel_diff(&got.i((0..1, 4..9))?, &want_short.i((.., 0..5))?)?;
    assert!(d <= 1e-12, "left-padded row: rel diff {d:e}");
    let d = rel_diff(&got_next.i(0..1)?, &want_short.i((.., 5..6))?)?;
    assert!(d <= 1e-12, "left-padded row, next token: rel diff {d:e}");
    let d = rel_diff(&got.i(1..2)?, &want_long.i((.., 0..9))?)?;
    assert!(d <= 1e-12, "unpadded row: rel diff {d:e}");
    let d = rel_diff(&got_next.i(1..2)?, &want_long.i((.., 9..10))?)?;
    assert!(d <= 1e-12, "unpadded row, next token: rel diff {d:e}");
    Ok(())
}

/// Greedy and sampling settings, with and without the cache.
fn settings(max_new_tokens: usize) -> Vec<GenerateConfig> {
    let greedy = GenerateConfig {
        max_new_tokens,
        ..Default::default()
    };
    vec![
        greedy.clone(),
        GenerateConfig {
            top_k: Some(4),
            temperature: 0.9,
            seed: 3,
            ..greedy.clone()
        },
        GenerateConfig {
            top_p: Some(0.8),
            seed: 11,
            ..greedy
        },
    ]
}

#[test]
fn generation_gives_the_same_tokens_with_and_without_the_cache_also_past_max_len() -> Result<()> {
    // Context 8: a 3-token prompt plus 20 new tokens outgrows it after 5 tokens.
    for dtype in [DType::F32, DType::F64] {
        let m = model(9, dtype, 2, 2, 8)?;
        for prompt in [&[1u32][..], &[4, 2, 7], &[1, 2, 3, 4, 5, 6, 7, 8], &[5; 11]] {
            for cfg in settings(20) {
                let cached = generate(&m, prompt, &cfg)?;
                let plain = generate(
                    &m,
                    prompt,
                    &GenerateConfig {
                        kv_cache: false,
                        ..cfg.clone()
                    },
                )?;
                assert_eq!(cached.len(), 20);
                assert_eq!(cached, plain, "{dtype:?} prompt {prompt:?} {cfg:?}");
            }
        }
    }
    assert!(
        GenerateConfig::default().kv_cache,
        "the cache is the default"
    );
    Ok(())
}

#[test]
fn streaming_calls_back_with_each_token_and_stops_on_its_error() -> Result<()> {
    let m = model(10, DType::F32, 1, 2, 16)?;
    let cfg = GenerateConfig {
        max_new_tokens: 6,
        ..Default::default()
    };
    let mut seen = Vec::new();
    let got = generate_stream(&m, &[1, 2], &cfg, |id| {
        seen.push(id);
        Ok(())
    })?;
    assert_eq!(seen, got);
    assert_eq!(got, generate(&m, &[1, 2], &cfg)?);
    let mut calls = 0;
    let e = generate_stream(&m, &[1, 2], &cfg, |_| {
        calls += 1;
        match calls {
            3 => candle_mha::candle::bail!("reader went away"),
            _ => Ok(()),
        }
    })
    .unwrap_err();
    assert!(e.to_string().contains("reader went away"), "{e}");
    assert_eq!(calls, 3);
    Ok(())
}

#[test]
fn a_batch_gives_each_prompt_its_single_result() -> Result<()> {
    // Prompts of different lengths; context 8 with 12 new tokens: each row outgrows it at its
    // own step, and the 9-token one starts past it.
    let prompts: Vec<Vec<u32>> = vec![
        vec![3],
        vec![1, 4, 2],
        vec![6, 6, 1, 9, 2, 11],
        vec![1, 4, 2],
        (0..9).collect(),
    ];
    for dtype in [DType::F32, DType::F64] {
        let m = model(12, dtype, 2, 2, 8)?;
        for cfg in settings(12) {
            let batch = generate_batch(&m, &prompts, &cfg)?;
            assert_eq!(batch.len(), prompts.len());
            for (p, got) in prompts.iter().zip(&batch) {
                assert_eq!(
                    got,
                    &generate(&m, p, &cfg)?,
                    "{dtype:?} prompt {p:?} {cfg:?}"
                );
            }
            let plain = GenerateConfig {
                kv_cache: false,
                ..cfg.clone()
            };
            assert_eq!(generate_batch(&m, &prompts, &plain)?, batch);
        }
        // With an end-of-sequence id, rows stop at different steps.
        let m = model(13, dtype, 1, 2, 32)?;
        let single: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| generate(&m, p, &settings(12)[1]))
            .collect::<candle_mha::candle::Result<_>>()?;
        let eos = single[2][2];
        let cfg = GenerateConfig {
            eos_id: Some(eos),
            ..settings(12)[1].clone()
        };
        let batch = generate_batch(&m, &prompts, &cfg)?;
        for (p, got) in prompts.iter().zip(&batch) {
            assert_eq!(got, &generate(&m, p, &cfg)?, "eos {eos}, prompt {p:?}");
        }
        assert!(batch[2].len() <= 3 && batch[2].last() == Some(&eos));
    }
    Ok(())
}

#[test]
fn misuse_is_a_clear_error() -> Result<()> {
    let m = model(14, DType::F32, 2, 2, 6)?;
    let x = tokens(15, 2, 4, 13)?;
    let err = |r: candle_mha::candle::Result<Tensor>| r.unwrap_err().to_string();

    // A cache of another model (layer count) or batch size.
    let mut other = StackKvCache::new(&model(14, DType::F32, 3, 2, 6)?.attentions(), 2)?;
    let e = err(m.forward_incremental(&x, &mut other, None));
    assert!(e.contains("the cache has 3 layers, the model 2"), "{e}");
    let mut one_row = m.new_cache(1)?;
    let e = err(m.forward_incremental(&x, &mut one_row, None));
    assert!(
        e.contains("the cache holds 1 rows") && e.contains("[2, 4]"),
        "{e}"
    );

    // The batch size cannot change mid-way.
    let mut cache = m.new_cache(2)?;
    m.forward_incremental(&x, &mut cache, None)?;
    let e = err(m.forward_incremental(&x.i(0..1)?, &mut cache, None));
    assert!(e.contains("cannot change mid-way"), "{e}");

    // Positions end at max_len = 6: 4 cached + 3 new is one too many; the cache is unchanged.
    let e = err(m.forward_incremental(&x.narrow(1, 0, 3)?, &mut cache, None));
    assert!(e.contains("position 6") && e.contains("max_len = 6"), "{e}");
    assert_eq!(cache.len(), 4);
    m.forward_incremental(&x.narrow(1, 0, 2)?, &mut cache, None)?;
    assert_eq!(cache.len(), 6);

    // Bad tokens and masks.
    let mut cache = m.new_cache(2)?;
    let e = err(m.forward_incremental(&x.narrow(1, 0, 0)?, &mut cache, None));
    assert!(e.contains("at least one column"), "{e}");
    let bad_ids = Tensor::new(&[[1u32, 2], [13, 0]], &Device::Cpu)?;
    let e = err(m.forward_incremental(&bad_ids, &mut cache, None));
    assert!(
        e.contains("token ids must be in [0, 13), got ids from 0 to 13"),
        "{e}"
    );
    let bad_mask = Tensor::zeros((2, 3), DType::U8, &Device::Cpu)?;
    let e = err(m.forward_incremental(&x, &mut cache, Some(&bad_mask)));
    assert!(e.contains("key_padding_mask must be [2, 4]"), "{e}");
    assert!(cache.is_empty());

    // Left padding: one per row, before the first call only.
    let e = cache.set_left_padding(&[1]).unwrap_err().to_string();
    assert!(e.contains("one padding per row (2 rows), got 1"), "{e}");
    m.forward_incremental(&x, &mut cache, None)?;
    let e = cache.set_left_padding(&[1, 0]).unwrap_err().to_string();
    assert!(e.contains("already holds 4 columns"), "{e}");
    cache.reset();
    assert!(cache.is_empty());
    cache.set_left_padding(&[1, 0])?;

    // A cache in another dtype.
    let mut f64_cache = model(14, DType::F64, 2, 2, 6)?.new_cache(2)?;
    assert!(m.forward_incremental(&x, &mut f64_cache, None).is_err());

    // Empty prompts.
    let cfg = GenerateConfig::default();
    let e = generate_batch(&m, &[vec![1], vec![]], &cfg).unwrap_err();
    assert!(e.to_string().contains("prompt 1 is empty"), "{e}");
    assert!(generate_batch(&m, &[], &cfg)?.is_empty());
    Ok(())
}
