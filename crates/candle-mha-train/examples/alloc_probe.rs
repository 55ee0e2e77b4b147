//! Times and page faults per call of the attention module under one allocator setting: the
//! tool behind the allocator rows of `docs/benchmarks.md` (the setting is process-wide, so each
//! setting needs its own process; alternate them for an A/B).
//!
//! ```sh
//! cargo run --release --example alloc_probe -- default 32,128,256,8
//! cargo run --release --example alloc_probe -- retain 8,512,512,8 1,2048,512,8
//! cargo run --release --example alloc_probe -- default model:small model:medium model:large
//! ```
//!
//! Per shape `N,L,E,H` (batch_first self-attention, f32, bias on): forward without weights
//! and with head-mean weights (plain tensors, no graph), and the training step three ways:
//! `autograd::backward_with(&out, &r)` and `out.sum_all()?.backward()` (what a plain user
//! writes) with `x` a variable, and the latter with `x` plain data (no gradient of `x`, so no
//! product for it). Each line: fastest and median milliseconds, minor page faults per call
//! (Linux: `/proc/self/stat`; 0 elsewhere) and those of the last call: a mean over warming
//! calls and a last call of 0 is a heap still growing to its steady size, not a cost every
//! call pays (a large shape's forward heap keeps growing for a dozen or so calls in either
//! setting). `model:small|medium|large`: one `NextTokenPredictor` training step as
//! `benches/train_step` times it (`train_loss`, backward, `clip_grad_norm`, AdamW; its
//! shapes), on one fixed batch.
//! `MHA_BENCH_REPS` / `MHA_BENCH_WARMUP` (default 10 / 3).

use std::time::Instant;

use candle::{DType, Device, Result, Tensor, Var};
use candle_mha::rng::normal;
use candle_mha::MultiheadAttentionConfig;
use candle_mha::{seeded_var_builder, AttentionOptions, MultiheadAttention};
use candle_nn::VarMap;

fn minflt() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; minflt is field 10 (index 7 after it).
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or(0)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Fastest and median seconds, mean minor faults per call and those of the last call.
fn probe(mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64, f64, u64)> {
    let (reps, warmup) = (
        env_usize("MHA_BENCH_REPS", 10),
        env_usize("MHA_BENCH_WARMUP", 3),
    );
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(reps);
    let f0 = minflt();
    let mut last = 0;
    for _ in 0..reps {
        let (t, before) = (Instant::now(), minflt());
        f()?;
        times.push(t.elapsed().as_secs_f64());
        last = minflt() - before;
    }
    let faults = (minflt() - f0) as f64 / reps.max(1) as f64;
    times.sort_by(f64::total_cmp);
    Ok((times[0], times[times.len() / 2], faults, last))
}

/// One `NextTokenPredictor` training step at `benches/train_step`'s shape `name`.
fn model_step(name: &str) -> Result<(f64, f64, f64, u64)> {
    use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
    use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
    // (N, L, vocab, E, H, layers), as in the train_step bench.
    let (n, l, v, e, h, layers) = match name {
        "small" => (64, 11, 37, 64, 4, 2),
        "medium" => (16, 128, 512, 256, 8, 4),
        "large" => (8, 256, 1024, 512, 8, 4),
        other => candle::bail!("model shape {other:?}: expected small, medium or large"),
    };
    let dev = Device::Cpu;
    let cfg = NextTokenPredictorConfig {
        vocab_size: v,
        max_len: l,
        embed_dim: e,
        num_heads: h,
        num_layers: layers,
        ff_dim: 4 * e,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &dev))?;
    let mut opt = AdamW::from_varmap(&varmap, AdamWConfig::default())?;
    let vars = opt.vars();
    let ids: Vec<u32> = (0..n * l).map(|i| ((i * 7919) % v) as u32).collect();
    let input = Tensor::from_vec(ids, (n, l), &dev)?;
    let targets = input.roll(-1, 1)?;
    let kpm = Tensor::zeros((n, l), DType::U8, &dev)?;
    let loss_mask = Tensor::ones((n, l), DType::U8, &dev)?;
    probe(|| {
        let loss = model.train_loss(&input, Some(&kpm), (2, 0), &targets, &loss_mask)?;
        loss.to_scalar::<f32>()?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, &vars, 1.0)?;
        opt.step(&grads)
    })
}

/// One line of the table.
fn report(
    setting: &str,
    shape: &str,
    what: &str,
    (best, median, faults, last): (f64, f64, f64, u64),
) {
    println!(
        "{setting:7} {shape:14} {what:20} best {:9.3} ms median {:9.3} ms {faults:9.0} faults/call {last:7} in the last",
        best * 1e3,
        median * 1e3
    );
}

fn main() -> Result<()> {
    // candle's element-wise threads as the `mha` CLI sets them (see `candle_mha::runtime`).
    for (name, value) in candle_mha::runtime::recommended_env() {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    let mut args = std::env::args().skip(1);
    let setting = args.next().unwrap_or_else(|| "default".into());
    if setting == "retain" {
        candle_mha::runtime::retain_freed_memory();
    }
    let dev = Device::Cpu;
    for shape in args {
        if let Some(name) = shape.strip_prefix("model:") {
            report(&setting, &shape, "model step", model_step(name)?);
            continue;
        }
        let v: Vec<usize> = shape.split(',').filter_map(|x| x.parse().ok()).collect();
        let [n, l, e, h] = v[..] else {
            candle::bail!("shape {shape:?}: expected N,L,E,H")
        };
        let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
        let varmap = VarMap::new();
        let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &dev))?;
        let x = normal(0.0, 1.0, (n, l, e), DType::F32, &dev, 1)?;
        let plain: Vec<(String, Tensor)> = mha
            .named_parameters()
            .into_iter()
            .map(|(k, t)| Ok((k, t.detach().copy()?)))
            .collect::<Result<_>>()?;
        let plain_refs = plain.iter().map(|(k, t)| (k.as_str(), t.clone())).collect();
        let inf = MultiheadAttention::from_tensors(
            MultiheadAttentionConfig::new(e, h).with_batch_first(true),
            plain_refs,
        )?;
        let opts = AttentionOptions::new();
        let nw = opts.clone().with_need_weights(false);
        let train = nw.clone().with_train(true);
        let xv = Var::from_tensor(&x)?;
        let r = normal(0.0, 1.0, x.shape(), DType::F32, &dev, 2)?;
        let rows = [
            ("forward", probe(|| inf.forward(&x, &x, &x, &nw).map(drop))?),
            (
                "forward+weights",
                probe(|| inf.forward(&x, &x, &x, &opts).map(drop))?,
            ),
            (
                "step backward_with",
                probe(|| {
                    let out = mha.forward(&xv, &xv, &xv, &train)?.output;
                    candle_mha::autograd::backward_with(&out, &r).map(drop)
                })?,
            ),
            (
                "step sum_all",
                probe(|| {
                    let out = mha.forward(&xv, &xv, &xv, &train)?.output;
                    out.sum_all()?.backward().map(drop)
                })?,
            ),
            (
                "step sum_all, data x",
                probe(|| {
                    let out = mha.forward(&x, &x, &x, &train)?.output;
                    out.sum_all()?.backward().map(drop)
                })?,
            ),
        ];
        for (what, row) in rows {
            report(&setting, &shape, what, row);
        }
    }
    Ok(())
}
