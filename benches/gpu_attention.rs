//! GPU benchmark: our `MultiheadAttention` against PyTorch's `nn.MultiheadAttention`
//! (need_weights true and false) and `F.scaled_dot_product_attention` on the same GPU and
//! shapes; forward and training step (forward + backward), time and TFLOP/s.
//!
//! ```text
//! cargo bench --features cuda --bench gpu_attention          # on a GPU machine
//! MHA_BENCH_SMOKE=1 cargo bench --bench gpu_attention         # tiny shapes on the CPU: checks the bench runs
//! ```
//! FLOPs of one forward (batch_first self-attention, N, L, E, H):
//! projections `4 · 2·N·L·E²` (q, k, v, out) + attention `2 · 2·N·L²·E` (QKᵀ and PV)
//! = `8NLE² + 4NL²E`; a training step counts 3× the forward (backward ≈ 2× forward).
//! Environment: `MHA_BENCH_SHAPES=512,1024` (L values), `MHA_BENCH_DTYPES=bf16,f32`,
//! `MHA_BENCH_PYTHON` (a python3 with torch; `none` to skip the PyTorch side).

use std::process::Command;
use std::time::Instant;

use candle_mha::candle::{DType, Device, Result, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};

struct Case {
    n: usize,
    l: usize,
    e: usize,
    h: usize,
    dtype: DType,
}

fn flops(c: &Case) -> f64 {
    let (n, l, e) = (c.n as f64, c.l as f64, c.e as f64);
    8.0 * n * l * e * e + 4.0 * n * l * l * e
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over `iters` runs after `warmup`, synchronising the device.
fn time(
    dev: &Device,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    dev.synchronize()?;
    let mut times = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

fn ours(c: &Case, dev: &Device, iters: usize) -> Result<[f64; 3]> {
    let varmap = candle_nn::VarMap::new();
    let cfg = MultiheadAttentionConfig::new(c.e, c.h).with_batch_first(true);
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, c.dtype, dev))?;
    let x = Tensor::randn(0f32, 1., (c.n, c.l, c.e), dev)?.to_dtype(c.dtype)?;
    let fwd = |need: bool| {
        let opts = AttentionOptions::new().with_need_weights(need);
        let (mha, x) = (&mha, &x);
        move || mha.forward(x, x, x, &opts).map(|_| ())
    };
    let f_false = time(dev, 2, iters, fwd(false))?;
    let f_true = time(dev, 2, iters, fwd(true))?;
    let opts = AttentionOptions::new().with_need_weights(false);
    let step = time(dev, 2, iters, || {
        let out = mha.forward(&x, &x, &x, &opts)?.output;
        out.to_dtype(DType::F32)?
            .sqr()?
            .mean_all()?
            .backward()
            .map(|_| ())
    })?;
    Ok([f_false, f_true, step])
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F64 => "f64",
        _ => "f32",
    }
}

/// PyTorch's times for the same case: JSON from scripts/bench_gpu_reference.py.
fn torch(c: &Case, device: &str, iters: usize) -> Option<serde_json::Value> {
    let python = std::env::var("MHA_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    if python == "none" {
        return None;
    }
    let script = std::env::var("MHA_BENCH_SCRIPT").unwrap_or_else(|_| {
        for p in ["scripts/bench_gpu_reference.py", "bench_gpu_reference.py"] {
            if std::path::Path::new(p).exists() {
                return p.to_string();
            }
        }
        "scripts/bench_gpu_reference.py".into()
    });
    let out = Command::new(python)
        .args([
            &script,
            "--n",
            &c.n.to_string(),
            "--l",
            &c.l.to_string(),
            "--e",
            &c.e.to_string(),
        ])
        .args([
            "--h",
            &c.h.to_string(),
            "--dtype",
            dtype_name(c.dtype),
            "--device",
            device,
            "--iters",
            &iters.to_string(),
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "torch side failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn main() -> Result<()> {
    let smoke = std::env::var("MHA_BENCH_SMOKE").is_ok();
    let dev = match (smoke, Device::new_cuda(0)) {
        (true, _) => Device::Cpu,
        (false, Ok(d)) => d,
        (false, Err(e)) => {
            println!("gpu_attention: no CUDA device ({e}); build with --features cuda on a GPU machine, or set MHA_BENCH_SMOKE=1");
            return Ok(());
        }
    };
    let torch_device = if dev.is_cuda() { "cuda" } else { "cpu" };
    let ls: Vec<usize> = std::env::var("MHA_BENCH_SHAPES")
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|_| {
            if smoke {
                vec![32, 64]
            } else {
                vec![512, 1024, 2048, 4096]
            }
        });
    let dtypes: Vec<DType> = std::env::var("MHA_BENCH_DTYPES")
        .unwrap_or_else(|_| {
            if smoke {
                "f32".into()
            } else {
                "bf16,f32".into()
            }
        })
        .split(',')
        .map(|d| {
            if d == "bf16" {
                DType::BF16
            } else if d == "f16" {
                DType::F16
            } else {
                DType::F32
            }
        })
        .collect();
    let (n, e, h, iters) = if smoke {
        (2, 64, 4, 3)
    } else {
        (8, 1024, 16, 10)
    };
    println!("gpu_attention on {torch_device}: N={n}, E={e}, H={h}; times are medians of {iters} runs (ms), TFLOP/s = (8NLE² + 4NL²E) / time (×3 for a step)");
    println!(
        "{:>5} {:>5} | {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7}",
        "dtype",
        "L",
        "fwd nw=F",
        "fwd nw=T",
        "step",
        "TF/s",
        "pt nw=F",
        "pt nw=T",
        "pt sdpa",
        "pt step",
        "x fwd",
        "x step"
    );
    for &dtype in &dtypes {
        for &l in &ls {
            let c = Case { n, l, e, h, dtype };
            let ms = |s: f64| format!("{:.3}", s * 1e3);
            let (a, b, st, tf) = match ours(&c, &dev, iters) {
                Ok([a, b, st]) => (ms(a), ms(b), ms(st), format!("{:.1}", flops(&c) / a / 1e12)),
                Err(err) => {
                    let msg = err.to_string();
                    let short = if msg.to_lowercase().contains("out of memory") {
                        "OOM".to_string()
                    } else {
                        "error".to_string()
                    };
                    eprintln!("ours L={l} {dtype:?}: {msg}");
                    (short.clone(), short.clone(), short, "-".into())
                }
            };
            let t = torch(&c, torch_device, iters);
            let get = |k: &str| t.as_ref().and_then(|v| v[k].as_f64());
            let fmt = |k: &str| get(k).map(ms).unwrap_or_else(|| "-".into());
            let ratio = |ours: &str, k: &str| match (ours.parse::<f64>(), get(k)) {
                (Ok(o), Some(p)) => format!("{:.2}", o / (p * 1e3)),
                _ => "-".into(),
            };
            println!(
                "{:>5} {:>5} | {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7}",
                dtype_name(dtype),
                l,
                a,
                b,
                st,
                tf,
                fmt("fwd_need_weights_false"),
                fmt("fwd_need_weights_true"),
                fmt("sdpa_fwd"),
                fmt("step"),
                ratio(&a, "fwd_need_weights_false"),
                ratio(&st, "step")
            );
        }
    }
    println!("x = our time / PyTorch nn.MultiheadAttention's (need_weights=False); < 1 is faster");
    Ok(())
}
