//! CUDA against CPU: every PyTorch fixture's forward, weights and gradients on the GPU equal
//! the CPU's (f32 ≤ 1e-4 relative, TF32 off), half precision runs end to end, and a few
//! training steps agree, and incremental decoding (the key/value cache) gives the CPU's logits
//! and tokens.
//!
//! Compiled in every build (so CPU CI keeps the CUDA code paths compiling); it runs only in a
//! `--features cuda` build on a machine with a GPU and prints why it skipped otherwise.

use candle_mha_test_support as common;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Tensor};
use common::{assert_close, fixture_paths, gpu, run_fixture, Fixture};

#[test]
fn cuda_matches_cpu_on_every_fixture() -> Result<()> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let mut failures = Vec::new();
    for path in fixture_paths() {
        let f = Fixture::load(&path)?;
        let dtype = f.dtype()?;
        let (cpu, cuda) = (
            run_fixture(&f, dtype, &Device::Cpu, None)?,
            run_fixture(&f, dtype, &gpu, None)?,
        );
        for (name, expected) in &cpu {
            let got = cuda
                .get(name)
                .with_context(|| format!("{}: {name} missing on CUDA", f.name))?;
            if let Err(e) = assert_close(name, got, expected, 1e-4) {
                failures.push(format!("{}: {e}", f.name));
            }
        }
        // Half precision end to end on the GPU (reductions in f32), against the f32 result.
        if dtype == DType::F32 {
            for half in [DType::F16, DType::BF16] {
                let out = run_fixture(&f, half, &gpu, None)?;
                if let Err(e) = assert_close("output", &out["output"], &cpu["output"], 8e-2) {
                    failures.push(format!("{} {half:?}: {e}", f.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn training_steps_agree_on_cuda() -> Result<()> {
    use candle_mha_train::data::AssociativeRecall;
    use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
    use candle_mha_train::{TrainConfig, Trainer};
    let Some(gpu) = gpu() else { return Ok(()) };
    let task = AssociativeRecall::default();
    let (train, val) = (task.generate(512, 1), task.generate(64, 2));
    let mut losses = Vec::new();
    for dev in [Device::Cpu, gpu] {
        let mut cfg = NextTokenPredictorConfig::new(task.vocab().len());
        cfg.max_len = task.seq_len();
        let varmap = candle_nn::VarMap::new();
        let model = NextTokenPredictor::new(
            cfg,
            candle_mha::seeded_var_builder(&varmap, 0, DType::F32, &dev),
        )?;
        let tc = TrainConfig {
            steps: 20,
            batch_size: 16,
            eval_every: 0,
            save_every: 0,
            ..TrainConfig::default()
        };
        let mut t = Trainer::new(model, varmap, tc, None)?;
        t.run(&train, &val, None, &mut ())?;
        losses.push(t.state().losses.clone());
    }
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!(
            (a - b).abs() <= 1e-3 * a.abs().max(1.0),
            "CPU {:?}\nCUDA {:?}",
            losses[0],
            losses[1]
        );
    }
    Ok(())
}

/// Incremental decoding on CUDA (candle's generic ops): the cached logits equal the CPU's
/// and the full forward's, and greedy generation gives the CPU's tokens, with and without the
/// cache.
#[test]
fn incremental_decoding_agrees_on_cuda() -> Result<()> {
    use candle_mha_train::models::{
        generate, GenerateConfig, NextTokenPredictor, NextTokenPredictorConfig,
    };
    let Some(gpu) = gpu() else { return Ok(()) };
    let prompt: Vec<u32> = (0..12).map(|i| (i * 7 % 40) as u32).collect();
    let mut tokens = Vec::new();
    let mut logits = Vec::new();
    for dev in [Device::Cpu, gpu] {
        let mut cfg = NextTokenPredictorConfig::new(40);
        cfg.max_len = 24;
        let varmap = candle_nn::VarMap::new();
        let model = NextTokenPredictor::new(
            cfg,
            candle_mha::seeded_var_builder(&varmap, 5, DType::F32, &dev),
        )?;
        // The prompt in blocks of 5, 1 and 6 through the cache, against the full forward.
        let ids = Tensor::new(prompt.as_slice(), &dev)?.unsqueeze(0)?;
        let mut cache = model.new_cache(1)?;
        let mut parts = Vec::new();
        for (a, b) in [(0, 5), (5, 6), (6, 12)] {
            parts.push(model.forward_incremental(&ids.narrow(1, a, b - a)?, &mut cache, None)?);
        }
        let inc = Tensor::cat(&parts, 1)?;
        let full = model.forward(&ids, None)?;
        assert_close("incremental vs full", &inc, &full, 1e-4)?;
        logits.push(inc.to_device(&Device::Cpu)?);
        // Past max_len (24) too: the sliding context.
        let mut run = Vec::new();
        for kv_cache in [true, false] {
            let g = GenerateConfig {
                max_new_tokens: 20,
                kv_cache,
                ..Default::default()
            };
            run.push(generate(&model, &prompt, &g)?);
        }
        assert_eq!(run[0], run[1], "with and without the cache on {dev:?}");
        tokens.push(run.remove(0));
    }
    assert_close("CUDA vs CPU logits", &logits[1], &logits[0], 1e-4)?;
    assert_eq!(tokens[0], tokens[1], "CUDA and CPU tokens");
    Ok(())
}
