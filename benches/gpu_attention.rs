//! GPU benchmark: our `MultiheadAttention` (need_weights=false) on the fused CUDA kernel and
//! on the reference path, against PyTorch's `nn.MultiheadAttention` and
//! `F.scaled_dot_product_attention` on the same GPU and shapes; forward and training step
//! (forward + backward), time and TFLOP/s; then the peak GPU memory of an L = 16384 forward.
//!
//! Our attention alone is estimated as the module's forward minus its two projections (the
//! same candle matrix products timed on their own), to set beside PyTorch's SDPA.
//!
//! ```text
//! cargo bench --features cuda --bench gpu_attention          # on a GPU machine
//! MHA_BENCH_SMOKE=1 cargo bench --bench gpu_attention         # tiny shapes on the CPU: checks the bench runs
//! ```
//! FLOPs of one forward (batch_first self-attention, N, L, E, H):
//! projections `4 · 2·N·L·E²` (q, k, v, out) + attention `2 · 2·N·L²·E` (QKᵀ and PV)
//! = `8NLE² + 4NL²E`; a training step counts 3× the forward (backward ≈ 2× forward).
//! Environment: `MHA_BENCH_SHAPES=512,1024` (L values), `MHA_BENCH_DTYPES=bf16,f32`,
//! `MHA_BENCH_PYTHON` (a python3 with torch; `none` to skip the PyTorch side),
//! `MHA_BENCH_REF_MAX_L` (the longest L the reference path runs, 4096: its scores are
//! `N·H·L²` floats), `MHA_BENCH_LONG_L` (the memory check's L, 16384; 0 skips it).

use std::process::Command;
use std::time::Instant;

use candle_mha::candle::{DType, Device, Result, Tensor};
use candle_mha::device::{peak_gpu_memory, reset_peak_gpu_memory};
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, MultiheadAttention,
    MultiheadAttentionConfig,
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

fn module(c: &Case, dev: &Device) -> Result<(MultiheadAttention, Tensor)> {
    let varmap = candle_nn::VarMap::new();
    let cfg = MultiheadAttentionConfig::new(c.e, c.h).with_batch_first(true);
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, c.dtype, dev))?;
    let x = Tensor::randn(0f32, 1., (c.n, c.l, c.e), dev)?.to_dtype(c.dtype)?;
    Ok((mha, x))
}

/// Forward and training-step times of the module with `kernel` (need_weights=false).
fn ours(c: &Case, dev: &Device, iters: usize, kernel: AttentionKernel) -> Result<[f64; 2]> {
    let (mha, x) = module(c, dev)?;
    let opts = AttentionOptions::new()
        .with_need_weights(false)
        .with_kernel(kernel);
    let fwd = time(dev, 2, iters, || mha.forward(&x, &x, &x, &opts).map(|_| ()))?;
    let step = time(dev, 2, iters, || {
        let out = mha.forward(&x, &x, &x, &opts)?.output;
        out.to_dtype(DType::F32)?
            .sqr()?
            .mean_all()?
            .backward()
            .map(|_| ())
    })?;
    Ok([fwd, step])
}

/// The module's two projections alone, as its forward runs them on CUDA (one `(N·L, E)`
/// matrix product each, then the bias).
fn projections(c: &Case, dev: &Device, iters: usize) -> Result<f64> {
    let (mha, x) = module(c, dev)?;
    let (w_in, b_in) = (mha.in_proj_weight().unwrap(), mha.in_proj_bias().unwrap());
    let (w_out, b_out) = (mha.out_proj().weight(), mha.out_proj().bias().unwrap());
    let x2 = x.reshape((c.n * c.l, c.e))?;
    time(dev, 2, iters, || {
        let qkv = x2.matmul(&w_in.t()?)?.broadcast_add(b_in)?;
        let y = x2.matmul(&w_out.t()?)?.broadcast_add(b_out)?;
        drop((qkv, y));
        Ok(())
    })
}

/// Peak GPU memory (bytes) of one forward at length `l` (N = 1), over what was in use before.
fn long_forward_peak(dev: &Device, l: usize, e: usize, h: usize) -> Result<Option<u64>> {
    let c = Case {
        n: 1,
        l,
        e,
        h,
        dtype: DType::BF16,
    };
    let (mha, x) = module(&c, dev)?;
    dev.synchronize()?;
    reset_peak_gpu_memory(dev)?;
    let Some(base) = peak_gpu_memory(dev)? else {
        return Ok(None);
    };
    let opts = AttentionOptions::new().with_need_weights(false);
    let out = mha.forward(&x, &x, &x, &opts)?.output;
    dev.synchronize()?;
    drop(out);
    Ok(peak_gpu_memory(dev)?.map(|p| p - base))
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
fn torch(c: &Case, device: &str, iters: usize, extra: &[&str]) -> Option<serde_json::Value> {
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
        .args(extra)
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
    let ref_max: usize = std::env::var("MHA_BENCH_REF_MAX_L")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    println!("gpu_attention on {torch_device}: N={n}, E={e}, H={h}; times are medians of {iters} runs (ms); TF/s = (8NLE² + 4NL²E) / fused fwd");
    println!("fused / ref: our module on the fused kernel / the reference path; proj: its two projections alone; attn = fused fwd - proj");
    println!(
        "{:>5} {:>5} | {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} | {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6}",
        "dtype", "L", "fused fw", "fused st", "ref fw", "ref st", "proj", "attn", "TF/s",
        "pt mha", "pt sdpa", "pt step", "sdpa st", "x fwd", "x step", "x attn"
    );
    let ms = |s: f64| format!("{:.3}", s * 1e3);
    for &dtype in &dtypes {
        for &l in &ls {
            let c = Case { n, l, e, h, dtype };
            let show = |r: Result<[f64; 2]>, what: &str| match r {
                Ok([a, b]) => (Some(a), Some(b)),
                Err(err) => {
                    eprintln!("{what} L={l} {dtype:?}: {err}");
                    (None, None)
                }
            };
            let (ff, fs) = show(ours(&c, &dev, iters, AttentionKernel::Auto), "fused");
            let (rf, rs) = match l <= ref_max {
                true => show(
                    ours(&c, &dev, iters, AttentionKernel::Reference),
                    "reference",
                ),
                false => (None, None),
            };
            let proj = projections(&c, &dev, iters).ok();
            let attn = match (ff, proj) {
                (Some(f), Some(p)) => Some(f - p),
                _ => None,
            };
            let t = torch(&c, torch_device, iters, &[]);
            let get = |k: &str| t.as_ref().and_then(|v| v[k].as_f64());
            let opt = |x: Option<f64>| x.map(ms).unwrap_or_else(|| "-".into());
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            println!(
                "{:>5} {:>5} | {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} | {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6}",
                dtype_name(dtype),
                l,
                opt(ff),
                opt(fs),
                opt(rf),
                opt(rs),
                opt(proj),
                opt(attn),
                ff.map(|f| format!("{:.1}", flops(&c) / f / 1e12)).unwrap_or_else(|| "-".into()),
                opt(get("fwd_need_weights_false")),
                opt(get("sdpa_fwd")),
                opt(get("step")),
                opt(get("sdpa_step")),
                ratio(ff, get("fwd_need_weights_false")),
                ratio(fs, get("step")),
                ratio(attn, get("sdpa_fwd")),
            );
            if let Some(v) = &t {
                println!(
                    "{:>13} projections alone (ms): ours {}, PyTorch {}",
                    "",
                    opt(proj),
                    opt(get("proj"))
                );
                let backends: Vec<String> = ["flash", "efficient", "cudnn", "math"]
                    .iter()
                    .filter_map(|b| {
                        v[format!("sdpa_fwd_{b}")]
                            .as_f64()
                            .map(|x| format!("{b} {}", ms(x)))
                    })
                    .collect();
                if !backends.is_empty() {
                    println!(
                        "{:>13} PyTorch SDPA forward by backend (ms): {}",
                        "",
                        backends.join(", ")
                    );
                }
            }
        }
    }
    println!("x = our time / PyTorch's (fwd, step: nn.MultiheadAttention, need_weights=False; attn: SDPA); < 1 is faster");
    let long: usize = std::env::var("MHA_BENCH_LONG_L")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 0 } else { 16384 });
    if long > 0 && dev.is_cuda() {
        match long_forward_peak(&dev, long, e, h) {
            Ok(Some(p)) => {
                let pt = torch(
                    &Case {
                        n: 1,
                        l: long,
                        e,
                        h,
                        dtype: DType::BF16,
                    },
                    torch_device,
                    1,
                    &["--peak"],
                );
                let pt_peak = pt.as_ref().and_then(|v| v["peak_bytes"].as_f64());
                println!(
                    "peak GPU memory of one bf16 forward at N=1, L={long}, E={e}, H={h}: ours {:.0} MiB, PyTorch MHA {} (one head's L×L scores: {:.0} MiB)",
                    p as f64 / 1048576.0,
                    pt_peak.map(|b| format!("{:.0} MiB", b / 1048576.0)).unwrap_or_else(|| "-".into()),
                    (long * long * 2) as f64 / 1048576.0
                );
            }
            Ok(None) => println!("peak memory: this GPU has no memory pool statistics"),
            Err(err) => println!("peak memory at L={long}: {err}"),
        }
    }
    Ok(())
}
