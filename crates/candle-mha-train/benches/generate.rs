//! Greedy generation with [`NextTokenPredictor`] on the CPU: tokens per second through the
//! key/value cache, without it (`GenerateConfig::kv_cache = false`: the whole context per
//! token), and for the PyTorch twin with a key/value cache
//! (`scripts/bench_generate_reference.py`), same machine, threads and weights.
//!
//! ```sh
//! cargo bench --bench generate
//! MHA_BENCH_PYTHON=.venv-torch/bin/python MHA_BENCH_ROUNDS=3 cargo bench --bench generate
//! ```
//!
//! The task: 256 new tokens after a 256-token prompt (random ids, seeded), model
//! of 4 layers × 256 wide (8 heads, MLP 1024, vocabulary 512, context `max_len` 512, so the
//! context never slides), f32, greedy. A run is one `generate` call (prefill + 256 steps);
//! tokens/s = 256 / its time. The weights are ours (seeded), saved to a temporary
//! safetensors file that PyTorch's side loads, so both sides generate the same tokens (the
//! table says how many agree).
//!
//! Rounds: for `MHA_BENCH_ROUNDS` rounds (default 3), ours with the cache, ours without, and
//! PyTorch's, one after the other (a shared machine's load drifts within minutes); a cell
//! is the median over rounds of each round's median, "per round" the range over rounds.
//!
//! Environment: `MHA_BENCH_ROUNDS`; `MHA_BENCH_REPEATS` (timed runs per round with the
//! cache, default 3; one without it, after no warmup, as it takes seconds);
//! `MHA_BENCH_NEW_TOKENS` / `MHA_BENCH_PROMPT` (default 256 / 256); `MHA_BENCH_PYTHON` (the
//! Python with torch; unset: `python3`, then `python`); `RAYON_NUM_THREADS` (candle's CPU
//! threads; torch gets the same; unset, it is pinned to candle's default as `mha generate`
//! pins it, because candle otherwise parses `/proc/cpuinfo` on every matmul);
//! `MHA_BENCH_MODE`: `retained` (the default: ours runs as `mha generate` does, freed memory
//! kept and `runtime::recommended_env()` where the environment does not set it), `user`
//! (glibc's allocator defaults on both sides and candle's default spin limit), or both
//! comma-separated, each in a child process (see
//! `candle_mha_test_support::bench::mode_children`).

use candle_mha_test_support::bench as support;

use std::time::Instant;

use support::{
    env_usize, find_torch, median, mode_children, print_machine, print_table, thread_setting,
    Allocator, TorchServer, CLI_MODE,
};

use candle::{DType, Device, Result, Tensor};
use candle_mha::rng::rng_from_seed;
use candle_mha::seeded_var_builder;
use candle_mha_train::models::{
    generate, GenerateConfig, NextTokenPredictor, NextTokenPredictorConfig,
};
use rand::Rng;

/// Times `repeats` generate calls after `warmup` untimed ones: (median seconds, tokens).
fn time_ours(
    model: &NextTokenPredictor,
    prompt: &[u32],
    cfg: &GenerateConfig,
    warmup: usize,
    repeats: usize,
) -> Result<(f64, Vec<u32>)> {
    let mut times = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..warmup + repeats {
        let t0 = Instant::now();
        tokens = generate(model, prompt, cfg)?;
        if i >= warmup {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok((median(&times), tokens))
}

/// Our per-phase medians with the cache: (prefill ms, one step ms), over `steps` steps.
fn phases(model: &NextTokenPredictor, prompt: &[u32], steps: usize) -> Result<(f64, f64)> {
    let dev = Device::Cpu;
    let mut cache = model.new_cache(1)?;
    let t0 = Instant::now();
    let input = Tensor::new(prompt, &dev)?.unsqueeze(0)?;
    let logits = model.forward_incremental(&input, &mut cache, None)?;
    let mut next = logits
        .get(0)?
        .get(prompt.len() - 1)?
        .argmax(0)?
        .to_scalar::<u32>()?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = Instant::now();
        let input = Tensor::new(&[next], &dev)?.unsqueeze(0)?;
        let logits = model.forward_incremental(&input, &mut cache, None)?;
        next = logits.get(0)?.get(0)?.argmax(0)?.to_scalar::<u32>()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((prefill * 1e3, median(&times) * 1e3))
}

fn main() -> Result<()> {
    // One child process per allocator setting (see `mode_children`): `retained` unless named.
    match mode_children("MHA_BENCH_MODE", &[CLI_MODE], &["user"]) {
        Some(mode) => run_mode(&mode),
        None => Ok(()),
    }
}

/// One allocator setting's table, in its child process.
fn run_mode(mode: &str) -> Result<()> {
    let (pin, threads_from) = thread_setting();
    if let Some(n) = pin {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let allocator = Allocator::new(mode == CLI_MODE);
    print_machine(&threads_from);
    let threads = candle::utils::get_num_threads();
    println!("{}", allocator.describe());
    let rounds = env_usize("MHA_BENCH_ROUNDS").unwrap_or(3).max(1);
    let repeats = env_usize("MHA_BENCH_REPEATS").unwrap_or(3).max(1);
    let new_tokens = env_usize("MHA_BENCH_NEW_TOKENS").unwrap_or(256).max(1);
    let prompt_len = env_usize("MHA_BENCH_PROMPT").unwrap_or(256).max(1);

    let config = NextTokenPredictorConfig {
        vocab_size: 512,
        max_len: (prompt_len + new_tokens).max(512),
        embed_dim: 256,
        num_heads: 8,
        num_layers: 4,
        ff_dim: 1024,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let dev = Device::Cpu;
    let varmap = candle_nn::VarMap::new();
    let model = NextTokenPredictor::new(
        config.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &dev),
    )?;
    let mut rng = rng_from_seed(1);
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    println!(
        "task: {new_tokens} new tokens after a {prompt_len}-token prompt, greedy, f32; model \
         V {} / E {} / H {} / {} layers / ff {} / max_len {}",
        config.vocab_size,
        config.embed_dim,
        config.num_heads,
        config.num_layers,
        config.ff_dim,
        config.max_len
    );
    println!("{rounds} rounds; in each: ours with the cache ({repeats} runs after 1 warmup), ours without (1 run), PyTorch's (as ours with the cache)");

    let dir = tempfile::tempdir().map_err(candle::Error::wrap)?;
    let weights = dir.path().join("model.safetensors");
    varmap.save(&weights)?;
    let torch = find_torch();
    let mut server = match &torch {
        Some((py, version)) => {
            println!("torch: {version} ({py}), torch.set_num_threads({threads})");
            let s = TorchServer::start(py, "bench_generate_reference.py", threads, &allocator);
            if s.is_none() {
                eprintln!("torch: scripts/bench_generate_reference.py --serve did not start");
            }
            s
        }
        None => {
            println!("torch: not available (set MHA_BENCH_PYTHON)");
            None
        }
    };
    let config_json: serde_json::Value =
        serde_json::from_str(&config.to_json()).map_err(candle::Error::wrap)?;
    let request = serde_json::json!({
        "weights": weights.to_string_lossy(), "config": config_json, "prompt": prompt,
        "new_tokens": new_tokens, "repeats": repeats, "warmup": 1,
    });

    let cached = GenerateConfig {
        max_new_tokens: new_tokens,
        ..Default::default()
    };
    let uncached = GenerateConfig {
        kv_cache: false,
        ..cached.clone()
    };
    let (mut with_r, mut without_r, mut torch_r) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ours_tokens, mut plain_tokens, mut torch_tokens) = (Vec::new(), Vec::new(), None);
    for round in 0..rounds {
        eprintln!("round {}/{rounds}: ours with the cache…", round + 1);
        let (t, tokens) = time_ours(&model, &prompt, &cached, 1, repeats)?;
        with_r.push(t);
        ours_tokens = tokens;
        eprintln!("round {}/{rounds}: ours without the cache…", round + 1);
        let (t, tokens) = time_ours(&model, &prompt, &uncached, 0, 1)?;
        without_r.push(t);
        plain_tokens = tokens;
        if let Some(s) = server.as_mut() {
            eprintln!("round {}/{rounds}: PyTorch with its cache…", round + 1);
            match s.request(&request) {
                Some(rep) => {
                    torch_r.push(rep["median_s"].as_f64().unwrap_or(f64::NAN));
                    torch_tokens = rep["tokens"].as_array().map(|a| {
                        a.iter()
                            .map(|v| v.as_u64().unwrap_or(u64::MAX) as u32)
                            .collect::<Vec<u32>>()
                    });
                }
                None => eprintln!("torch: no answer"),
            }
        }
    }
    let (prefill_ms, step_ms) = phases(&model, &prompt, new_tokens)?;

    let agree = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let range = |xs: &[f64]| {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(0.0, f64::max);
        format!(
            "{:.0}–{:.0}",
            new_tokens as f64 / hi,
            new_tokens as f64 / lo
        )
    };
    let with_s = median(&with_r);
    let header: Vec<String> = [
        "generation (greedy)",
        "median s / run",
        "tokens/s",
        "tokens/s per round",
        "time vs ours cached",
        "same tokens as ours cached",
    ]
    .map(String::from)
    .to_vec();
    let row = |name: &str, times: &[f64], agree: String| {
        let m = median(times);
        vec![
            name.to_string(),
            format!("{m:.3}"),
            format!("{:.0}", new_tokens as f64 / m),
            range(times),
            format!("{:.2}×", m / with_s),
            agree,
        ]
    };
    let mut rows = vec![
        row("candle-mha, KV cache", &with_r, "—".into()),
        row(
            "candle-mha, no cache (--no-kv-cache)",
            &without_r,
            format!("{}/{new_tokens}", agree(&ours_tokens, &plain_tokens)),
        ),
    ];
    if !torch_r.is_empty() {
        let t = torch_tokens.unwrap_or_default();
        rows.push(row(
            "PyTorch twin, KV cache",
            &torch_r,
            format!("{}/{new_tokens}", agree(&ours_tokens, &t)),
        ));
    }
    println!();
    print_table(&header, &rows);
    println!(
        "\nmedian over rounds of each round's median; \"same tokens\": the length of the common \
         prefix of the greedy continuations.\nours with the cache, one run apart: prefill of the \
         prompt {prefill_ms:.1} ms, one step (1 token, median over {new_tokens}) {step_ms:.2} ms"
    );
    Ok(())
}
