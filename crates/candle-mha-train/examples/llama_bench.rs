//! One phase of the Llama-family benchmark (`scripts/bench_llama.sh`) on a Hugging Face
//! directory: `generate` (64 greedy tokens with the cache after a 16-token prompt), `eval`
//! (4×1024 tokens, no gradient) or `train` (steps of 4×256 tokens: loss, backward, AdamW);
//! `generate-bf16` and `train-bf16` the same with the products in bf16
//! (`candle_mha::autocast`, as `torch.autocast("cpu", torch.bfloat16)`). Prints `phase
//! tokens/s peak_rss_mib`; the peak is the process's (VmHWM).
//!
//! ```text
//! cargo run --release -p candle-mha-train --example llama_bench -- DIR generate
//! ```

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle::{DType, Device, Tensor};
use candle_mha::autocast::{autocast, Precision};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions};
use candle_mha::optim::{AdamW, AdamWConfig};
use candle_mha::zeroed_var_builder;
use candle_mha_train::formats::read_hf_dir;
use candle_mha_train::models::llama::{parameter_shapes, Llama};
use candle_nn::{VarBuilder, VarMap};

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Token ids `0..n` of a fixed pseudo-random sequence (the Python side draws the same).
fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % vocab as u64) as u32)
        .collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(phase)) = (args.get(1), args.get(2)) else {
        bail!("usage: llama_bench DIR generate|eval|train[-bf16] [steps]")
    };
    let (phase, precision) = match phase.strip_suffix("-bf16") {
        Some(p) => (p.to_string(), Precision::Bf16),
        None => (phase.clone(), Precision::F32),
    };
    // Inside candle's pool, as `mha generate` and the trainer run (autocast is the thread's:
    // set inside it).
    Device::Cpu.with_context(|| run(dir, &phase, &args, precision))
}

fn run(dir: &str, phase: &str, args: &[String], precision: Precision) -> Result<()> {
    let steps: usize = args.get(3).map_or(Ok(3), |s| s.parse()).context("steps")?;
    let dev = Device::Cpu;
    let hf = read_hf_dir(std::path::Path::new(dir))?;
    let cfg = hf.config.clone();
    let varmap = VarMap::new();
    // Variables where the weights are trained, or rounded to bf16 once (autocast keeps only
    // variables); plain tensors otherwise (no autograd graph is kept: PyTorch's no_grad).
    let model = if phase == "train" || precision == Precision::Bf16 {
        let model = Llama::new(cfg.clone(), zeroed_var_builder(&varmap, DType::F32, &dev))?;
        load_into_varmap_owned(
            &varmap,
            hf.weights,
            &LoadOptions::new().with_module("Llama"),
        )?;
        model
    } else {
        let tensors = hf.weights.tensors().iter().cloned().collect();
        Llama::new(
            cfg.clone(),
            VarBuilder::from_tensors(tensors, DType::F32, &dev),
        )?
    };
    let v = cfg.vocab_size;
    match phase {
        "generate" => {
            let prompt = tokens(16, v);
            let generate = |n| {
                autocast(precision, || {
                    model.generate_greedy(&prompt, n, &[], true, &dev)
                })
            };
            generate(4)?; // warm-up
            let t = Instant::now();
            let out = generate(64)?;
            let s = t.elapsed().as_secs_f64();
            println!(
                "generate {:.2} {:.0} first={:?}",
                out.len() as f64 / s,
                peak_rss_mib(),
                &out[..4]
            );
        }
        "eval" => {
            let ids = Tensor::from_vec(tokens(4 * 1024, v), (4, 1024), &dev)?;
            let t = Instant::now();
            let loss = model.loss(&ids)?.to_scalar::<f32>()?;
            let s = t.elapsed().as_secs_f64();
            println!(
                "eval {:.2} {:.0} loss={loss:.4}",
                4096.0 / s,
                peak_rss_mib()
            );
        }
        "train" => {
            let ids = Tensor::from_vec(tokens(4 * 256, v), (4, 256), &dev)?;
            let vars = varmap.data().lock().unwrap().clone();
            let params = parameter_shapes(&cfg)
                .into_iter()
                .map(|(n, _)| (n.clone(), vars[&n].clone()))
                .collect();
            let mut opt = AdamW::new(
                params,
                AdamWConfig {
                    lr: 1e-4,
                    ..Default::default()
                },
            )?;
            let mut times = Vec::new();
            let mut last = 0f32;
            for _ in 0..steps {
                let t = Instant::now();
                // The scope ends before the update: its bf16 copies are of this step's weights.
                let (loss, grads) = autocast(precision, || -> Result<_> {
                    let loss = model.loss(&ids)?;
                    let grads = loss.backward()?;
                    Ok((loss, grads))
                })?;
                opt.step(&grads)?;
                last = loss.to_scalar::<f32>()?;
                times.push(t.elapsed().as_secs_f64());
            }
            // The first step allocates the moments: the median of the rest.
            let mut rest = times[1.min(times.len() - 1)..].to_vec();
            rest.sort_by(f64::total_cmp);
            let med = rest[rest.len() / 2];
            println!(
                "train {:.2} {:.0} loss={last:.4}",
                1024.0 / med,
                peak_rss_mib()
            );
        }
        other => bail!("unknown phase {other:?}: generate, eval or train"),
    }
    Ok(())
}
