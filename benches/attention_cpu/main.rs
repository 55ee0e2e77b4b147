//! CPU benchmark of the attention module: the fused kernel and the reference path against
//! PyTorch's `nn.MultiheadAttention` on the same machine, threads and shapes, in one run;
//! plus the peak memory of a long `need_weights=false` forward.
//!
//! ```sh
//! cargo bench --bench attention_cpu
//! RAYON_NUM_THREADS=2 MHA_BENCH_PYTHON=.venv-torch/bin/python cargo bench --bench attention_cpu
//! ```
//!
//! Shapes `(N, L, E, H)`: batch_first self-attention, f32, dropout 0, bias on.
//! - forward: module parameters as plain tensors (no autograd graph), `need_weights` false,
//!   then true (weights averaged over heads); PyTorch in `eval()` under `torch.no_grad()`;
//! - step: forward (`train`, `need_weights=false`) + backward to every parameter and the
//!   input; PyTorch in `train()`, gradients set to `None` between steps. The backward pass
//!   depends on the mode (below).
//!
//! A shape may be causal (`is_causal`: ours builds no mask, the kernel skips masked tiles;
//! PyTorch gets the float causal mask as `attn_mask` with `is_causal=True`, with which its
//! training path runs sdpa's causal kernel; its eval fast path is faster with the float mask
//! than with the bool one).
//!
//! Modes, each in a child process of its own (allocator settings are process-wide), both by
//! default, one after the other (`MHA_BENCH_MODE=user` or `=retained` runs one):
//! - `user`: what a library user's own program does: glibc's allocator defaults on both
//!   sides, the step's backward from `out.sum_all()?.backward()?` (PyTorch:
//!   `out.sum().backward()`); the reference path is not timed (`MHA_BENCH_REFERENCE=1` times
//!   it);
//! - `retained`: both processes keep freed memory for reuse (`alloc::retain_freed_memory`
//!   here, the equivalent `GLIBC_TUNABLES` for PyTorch's child), our side with
//!   `runtime::recommended_env()` where the environment does not set it, as the `mha` CLI
//!   runs; and the step's backward starts from an output gradient `r` (`autograd::backward_with(&out,
//!   &r)`, PyTorch's `out.backward(r)`): the module's backward and nothing else.
//!
//! Two more modes run only when named: `MHA_BENCH_MODE=backward` (glibc defaults) and
//! `backward-retained` time our step's backward pass alone, started four ways in turn (none:
//! the forward only; `sum_all().backward()`; `backward_with(&out, &ones)`;
//! `backward_with(&out, &r)`), with the minor page faults per step.
//!
//! Memory: a child process runs one `need_weights=false` forward at `N=1, E=512, H=8` and
//! `L=8192` (fused) and `L=4096` (fused and reference) and reports its peak RSS (`VmHWM`)
//! against the bytes of the input, output, parameters and what a backward pass would keep
//! (the packed projection, the attention context, the row log-sum-exp).
//!
//! Rounds: the reference path runs once; then, for `MHA_BENCH_ROUNDS` rounds, each shape runs
//! on the fused path and right after on PyTorch (a `--serve` child of
//! `scripts/bench_attention_reference.py`), so that both sides of a ratio see the same load.
//!
//! Floor and efficiency: the matrix-product FLOPs of a measure at the best matmul rate of the
//! run (`flops`), and floor / our time. Beside the medians, each side's fastest call of all
//! rounds: "fastest/torch's" and "efficiency, fastest" (floor over our fastest call). Noise
//! only ever slows a call down, so on a loaded host these are the steadier comparison of what
//! each side can do; the medians say what the run got.
//!
//! Environment: `MHA_BENCH_REPS` / `MHA_BENCH_WARMUP` / `MHA_BENCH_ROUNDS` (default 10 / 3 / 3),
//! `MHA_BENCH_WARMUP_MS` (default 250: warm-up calls continue until this long has passed, on
//! both sides),
//! `MHA_BENCH_SHAPES` (`;`-separated `N,L,E,H`, `N,L,E,H,causal` for a causal one),
//! `MHA_BENCH_MODE` (`user`, `retained`, or both comma-separated), `MHA_BENCH_REFERENCE`
//! (`1`/`0`: time the reference path or not), `MHA_BENCH_MEMORY=0` to skip the memory part,
//! `MHA_BENCH_PYTHON` (a Python with torch; unset: `python3`, then `python`),
//! `RAYON_NUM_THREADS` (candle's threads; torch gets the same).

mod memory;
use candle_mha_test_support::bench as support;

use std::time::Instant;

use candle::{DType, Device, Result, Tensor, Var};
use candle_mha::rng::normal;
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, MultiheadAttention,
    MultiheadAttentionConfig,
};
use candle_nn::VarMap;
use support::{
    cpu_model, env_usize, find_torch, median, minor_faults, mode_children, print_table, time_calls,
    utc_now, Allocator, TorchServer,
};

/// `(N, L, E, H)` and whether the attention is causal.
#[derive(Clone, Copy, Debug)]
struct Shape4 {
    n: usize,
    l: usize,
    e: usize,
    h: usize,
    causal: bool,
}

impl Shape4 {
    const fn new(n: usize, l: usize, e: usize, h: usize, causal: bool) -> Self {
        Self { n, l, e, h, causal }
    }

    fn label(&self) -> String {
        let Self { n, l, e, h, causal } = *self;
        match causal {
            true => format!("({n}, {l}, {e}, {h}) causal"),
            false => format!("({n}, {l}, {e}, {h})"),
        }
    }
}

const SHAPES: [Shape4; 5] = [
    Shape4::new(32, 128, 256, 8, false),
    Shape4::new(8, 512, 512, 8, false),
    Shape4::new(1, 2048, 512, 8, false),
    Shape4::new(4, 1024, 1024, 16, false),
    Shape4::new(8, 512, 512, 8, true),
];

fn shapes() -> Vec<Shape4> {
    match std::env::var("MHA_BENCH_SHAPES") {
        Ok(s) if !s.trim().is_empty() => s
            .split(';')
            .filter_map(|t| {
                let parts: Vec<&str> = t.split(',').map(str::trim).collect();
                let v: Vec<usize> = parts.iter().filter_map(|x| x.parse().ok()).collect();
                let causal = parts.len() == 5 && parts[4].eq_ignore_ascii_case("causal");
                let ok = v.len() == 4 && (parts.len() == 4 || causal);
                if !ok {
                    eprintln!("warning: ignoring shape {t:?} (N,L,E,H or N,L,E,H,causal)");
                }
                ok.then(|| Shape4::new(v[0], v[1], v[2], v[3], causal))
            })
            .collect(),
        _ => SHAPES.to_vec(),
    }
}

/// How the step's backward pass starts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Backward {
    /// `out.sum_all()?.backward()?` (PyTorch: `out.sum().backward()`).
    SumAll,
    /// `autograd::backward_with(&out, &r)` (PyTorch: `out.backward(r)`).
    Seeded,
}

/// Warm-up time per measure at least, in milliseconds (`MHA_BENCH_WARMUP_MS`, default 250):
/// besides the `warmup` calls, calls continue until this long has passed. Right after the other
/// side's cell, the first few calls run slower (both sides get the same rule).
fn warmup_ms() -> f64 {
    env_usize("MHA_BENCH_WARMUP_MS").unwrap_or(250) as f64
}

/// The median and the fastest of `reps` timed calls, in seconds, after the warm-up.
fn time_it(reps: usize, warmup: usize, f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    time_calls(reps, warmup, warmup_ms(), f)
}

/// One side's seconds for one shape and round, per measure (forward without weights, forward
/// with weights, training step): the median call and the fastest.
#[derive(Clone, Copy, Debug)]
struct Cell {
    median: [f64; 3],
    fastest: [f64; 3],
}

impl Cell {
    fn new(measures: [(f64, f64); 3]) -> Self {
        Self {
            median: measures.map(|m| m.0),
            fastest: measures.map(|m| m.1),
        }
    }
}

/// A module and its input: trainable (parameters are `Var`s) or for inference (plain tensors).
fn setup(s: Shape4, trainable: bool) -> Result<(MultiheadAttention, Tensor, VarMap)> {
    let Shape4 { n, l, e, h, .. } = s;
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
    let varmap = VarMap::new();
    let dev = Device::Cpu;
    let mha = MultiheadAttention::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &dev),
    )?;
    let mha = match trainable {
        true => mha,
        false => {
            let params = mha.named_parameters();
            let plain = params
                .iter()
                .map(|(name, t)| Ok((name.as_str(), t.detach().copy()?)))
                .collect::<Result<Vec<_>>>()?;
            MultiheadAttention::from_tensors(cfg, plain)?
        }
    };
    let x = normal(0.0, 1.0, (n, l, e), DType::F32, &dev, 1)?;
    Ok((mha, x, varmap))
}

/// The machine's matrix-product rate in FLOP/s: a 1024³ candle `matmul` (the `gemm` crate,
/// on all threads), 20 runs after 5 warmup: the fastest (the best the machine gave, so that
/// the floor derived from it is a low one) and the median. PyTorch's MKL reaches the same
/// rate within noise, so one floor serves both sides (`docs/benchmarks.md`).
fn gemm_rate() -> Result<(f64, f64)> {
    let n = 1024;
    let a = normal(0.0, 1.0, (n, n), DType::F32, &Device::Cpu, 3)?;
    let b = normal(0.0, 1.0, (n, n), DType::F32, &Device::Cpu, 4)?;
    for _ in 0..5 {
        a.matmul(&b)?;
    }
    let mut times = Vec::with_capacity(20);
    for _ in 0..20 {
        let t = Instant::now();
        a.matmul(&b)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let flop = 2.0 * (n as f64).powi(3);
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((flop / best, flop / median(&times)))
}

/// The matrix-product FLOPs of one forward and of one training step: projections
/// `8·T·E²` (T = N·L tokens) forward and twice that backward; attention `2·N·L²·E` per
/// product, 2 forward and 4 backward (probabilities stored, as PyTorch's step does; our
/// kernel recomputes them: one product more). Causal: the attention products over the
/// `L(L+1)/2` query–key pairs that are not masked.
fn flops(s: Shape4) -> (f64, f64) {
    let (n, l, e) = (s.n as f64, s.l as f64, s.e as f64);
    let pairs = match s.causal {
        true => l * (l + 1.0) / 2.0,
        false => l * l,
    };
    let proj = 8.0 * n * l * e * e;
    let attn = 2.0 * n * pairs * e;
    (proj + 2.0 * attn, 3.0 * proj + 6.0 * attn)
}

/// One training step of a trainable module: the forward pass (`train`: its options), then the
/// backward pass started as `backward` says (`r`: the output gradient of `Backward::Seeded`).
fn train_step(
    mha: &MultiheadAttention,
    x: &Tensor,
    train: &AttentionOptions,
    backward: Backward,
    r: &Tensor,
) -> Result<()> {
    let out = mha.forward(x, x, x, train)?.output;
    match backward {
        Backward::SumAll => out.sum_all()?.backward().map(drop),
        Backward::Seeded => candle_mha::autograd::backward_with(&out, r).map(drop),
    }
}

/// Our side's times for one shape.
fn bench_ours(
    shape: Shape4,
    kernel: AttentionKernel,
    backward: Backward,
    reps: usize,
    warmup: usize,
) -> Result<Cell> {
    let (mha, x, _) = setup(shape, false)?;
    let opts = AttentionOptions::new()
        .with_kernel(kernel)
        .with_is_causal(shape.causal);
    let nw = opts.clone().with_need_weights(false);
    let fwd_nw = time_it(reps, warmup, || mha.forward(&x, &x, &x, &nw).map(drop))?;
    let fwd_w = time_it(reps, warmup, || mha.forward(&x, &x, &x, &opts).map(drop))?;
    let (mha, x, _) = setup(shape, true)?;
    let x = Var::from_tensor(&x)?;
    let r = normal(0.0, 1.0, x.shape(), DType::F32, &Device::Cpu, 2)?;
    let train = nw.with_train(true);
    let step = time_it(reps, warmup, || train_step(&mha, &x, &train, backward, &r))?;
    Ok(Cell::new([fwd_nw, fwd_w, step]))
}

/// PyTorch's times for one shape, as [`bench_ours`] returns ours.
fn torch_run(
    server: &mut TorchServer,
    s: Shape4,
    backward: Backward,
    reps: usize,
    warmup: usize,
) -> Option<Cell> {
    let rec = server.request(&serde_json::json!({
        "shape": [s.n, s.l, s.e, s.h],
        "causal": s.causal,
        "backward": match backward {
            Backward::SumAll => "sum",
            Backward::Seeded => "grad",
        },
        "reps": reps,
        "warmup": warmup,
        "warmup_ms": warmup_ms(),
    }))?;
    let get = |name: &str| {
        Some((
            rec[format!("{name}_s")].as_f64()?,
            rec[format!("{name}_min_s")].as_f64()?,
        ))
    };
    Some(Cell::new([get("fwd_nw")?, get("fwd_w")?, get("step")?]))
}

fn main() -> Result<()> {
    if let Ok(spec) = std::env::var("MHA_BENCH_MEMORY_CHILD") {
        let (l, kernel) = spec.split_once(',').unwrap_or(("8192", "fused"));
        return memory::memory_child(l.parse().unwrap_or(8192), kernel);
    }
    match mode_children(
        "MHA_BENCH_MODE",
        &["user", "retained"],
        &["backward", "backward-retained"],
    ) {
        Some(mode) if mode.starts_with("backward") => backward_mode(mode == "backward-retained"),
        Some(mode) => run_mode(&mode),
        None => {
            // The memory part once, after the modes (it runs in children of its own).
            if std::env::var("MHA_BENCH_MEMORY").as_deref() != Ok("0") {
                memory::print_memory();
            }
            Ok(())
        }
    }
}

/// One mode's tables (in a child process, see [`mode_children`]).
fn run_mode(mode: &str) -> Result<()> {
    let (reps, warmup, rounds) = (
        env_usize("MHA_BENCH_REPS").unwrap_or(10),
        env_usize("MHA_BENCH_WARMUP").unwrap_or(3),
        env_usize("MHA_BENCH_ROUNDS").unwrap_or(3).max(1),
    );
    let user = mode == "user";
    let allocator = Allocator::new(!user);
    let backward = match user {
        true => Backward::SumAll,
        false => Backward::Seeded,
    };
    let with_reference = match std::env::var("MHA_BENCH_REFERENCE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !user,
    };
    let threads = candle::utils::get_num_threads();
    println!(
        "machine: {} | {threads} threads | {} | {rounds} rounds of {reps} timed + {warmup} warmup per cell (warmup at least {} ms)",
        cpu_model(),
        utc_now(),
        warmup_ms()
    );
    println!("{}", allocator.describe());
    println!(
        "step backward: {}",
        match backward {
            Backward::SumAll => "out.sum_all()?.backward()? (PyTorch: out.sum().backward())",
            Backward::Seeded => "autograd::backward_with(&out, &r) (PyTorch: out.backward(r))",
        }
    );
    let mut torch = find_torch().and_then(|(py, v)| {
        let server = TorchServer::start(&py, "bench_attention_reference.py", threads, &allocator)?;
        println!("torch: {v} ({py}), torch.set_num_threads({threads})");
        Some(server)
    });
    if torch.is_none() {
        println!("torch: not available (set MHA_BENCH_PYTHON)");
    }
    let shapes = shapes();
    // Measured again each round: the best rate of the run, and each round's median.
    let mut rates = vec![gemm_rate()?];
    // The reference path once (it is several times slower); the fused path and PyTorch
    // alternate shape by shape for several rounds: on a shared machine the load drifts, and each
    // ratio should compare runs seconds apart.
    let mut reference = Vec::new();
    if with_reference {
        for &s in &shapes {
            eprintln!("{mode}: reference: {}…", s.label());
            reference.push(bench_ours(
                s,
                AttentionKernel::Reference,
                backward,
                reps,
                warmup,
            )?);
        }
    }
    let mut fused = vec![Vec::new(); shapes.len()];
    let mut theirs = vec![Vec::new(); shapes.len()];
    for round in 0..rounds {
        rates.push(gemm_rate()?);
        for (i, &s) in shapes.iter().enumerate() {
            eprintln!("{mode}: round {}/{rounds}: {}…", round + 1, s.label());
            fused[i].push(bench_ours(
                s,
                AttentionKernel::Fused,
                backward,
                reps,
                warmup,
            )?);
            if let Some(t) = torch
                .as_mut()
                .and_then(|t| torch_run(t, s, backward, reps, warmup))
            {
                theirs[i].push(t);
            }
        }
    }
    drop(torch);
    let rate = rates.iter().map(|r| r.0).fold(0.0, f64::max);
    let typical = median(&rates.iter().map(|r| r.1).collect::<Vec<_>>());
    println!(
        "matrix products (1024x1024x1024 matmul, {threads} threads): best {:.0} GFLOP/s, median {:.0} GFLOP/s",
        rate / 1e9,
        typical / 1e9
    );
    let mut header = vec!["(N, L, E, H)", "measure", "fused ms"];
    if with_reference {
        header.push("reference ms");
    }
    header.extend(["torch ms", "fused/torch", "per round"]);
    if with_reference {
        header.push("reference/torch");
    }
    header.extend([
        "floor ms",
        "floor/torch",
        "efficiency",
        "fastest/torch's",
        "efficiency, fastest",
    ]);
    let header: Vec<String> = header.into_iter().map(String::from).collect();
    let mut rows = Vec::new();
    let names = ["forward, no weights", "forward, weights", "train step"];
    for (i, s) in shapes.iter().enumerate() {
        for (m, name) in names.iter().enumerate() {
            let f = median(&fused[i].iter().map(|r| r.median[m]).collect::<Vec<_>>());
            // The fastest call of all rounds: on a loaded machine noise only slows a call down.
            let fastest = |cells: &[Cell]| {
                cells
                    .iter()
                    .map(|r| r.fastest[m])
                    .fold(f64::INFINITY, f64::min)
            };
            let f_min = fastest(&fused[i]);
            let floor = match m {
                2 => flops(*s).1,
                _ => flops(*s).0,
            } / rate;
            let t = (!theirs[i].is_empty())
                .then(|| median(&theirs[i].iter().map(|r| r.median[m]).collect::<Vec<_>>()));
            let t_min = (!theirs[i].is_empty()).then(|| fastest(&theirs[i]));
            let ratio = |x: f64| t.map_or("n/a".into(), |t| format!("{:.2}", x / t));
            let per_round: Vec<f64> = fused[i]
                .iter()
                .zip(&theirs[i])
                .map(|(f, t)| f.median[m] / t.median[m])
                .collect();
            let range = match per_round.iter().copied().reduce(f64::min) {
                Some(lo) => {
                    let hi = per_round.iter().copied().fold(lo, f64::max);
                    format!("{lo:.2}–{hi:.2}")
                }
                None => "n/a".into(),
            };
            let mut row = vec![s.label(), name.to_string(), format!("{:.2}", f * 1e3)];
            if with_reference {
                row.push(format!("{:.2}", reference[i].median[m] * 1e3));
            }
            row.extend([
                t.map_or("n/a".into(), |t| format!("{:.2}", t * 1e3)),
                ratio(f),
                range,
            ]);
            if with_reference {
                row.push(ratio(reference[i].median[m]));
            }
            row.extend([
                format!("{:.1}", floor * 1e3),
                ratio(floor),
                format!("{:.2}", floor / f),
                t_min.map_or("n/a".into(), |t| format!("{:.2}", f_min / t)),
                format!("{:.2}", floor / f_min),
            ]);
            rows.push(row);
        }
    }
    println!();
    print_table(&header, &rows);
    println!(
        "\nms: medians over the rounds of each round's median (reference: one round). \
         per round: the lowest and highest fused/torch ratio of a round.\n\
         floor: the matrix-product FLOPs of the measure (`flops` in this file) at the best matmul \
         rate above, what any implementation that does those products needs at that rate.\n\
         efficiency: floor ms / fused ms.\n\
         fastest/torch's: our fastest call of all rounds over PyTorch's; efficiency, fastest: \
         floor ms over our fastest call (a loaded machine only slows calls down, so on a noisy \
         host these compare what each side can do; the medians compare what a run got)."
    );
    println!("\nratio < 1: candle-mha is faster than PyTorch; > 1: slower.");
    Ok(())
}

/// The `backward` modes: our training step with its backward pass started in four ways, in
/// turn for each rep, so that the differences are what each way costs.
fn backward_mode(retain: bool) -> Result<()> {
    let (reps, warmup, rounds) = (
        env_usize("MHA_BENCH_REPS").unwrap_or(10),
        env_usize("MHA_BENCH_WARMUP").unwrap_or(3),
        env_usize("MHA_BENCH_ROUNDS").unwrap_or(3).max(1),
    );
    let allocator = Allocator::new(retain);
    println!(
        "machine: {} | {} threads | {} | {rounds} rounds of {reps} timed + {warmup} warmup per cell",
        cpu_model(),
        candle::utils::get_num_threads(),
        utc_now()
    );
    println!("{}", allocator.describe());
    let ways = [
        "forward only",
        "out.sum_all()?.backward()?",
        "backward_with(&out, &ones)",
        "backward_with(&out, &r)",
    ];
    let mut rows = Vec::new();
    for s in shapes() {
        eprintln!("backward: {}…", s.label());
        let (mha, x, _) = setup(s, true)?;
        let x = Var::from_tensor(&x)?;
        let r = normal(0.0, 1.0, x.shape(), DType::F32, &Device::Cpu, 2)?;
        let ones = r.ones_like()?;
        let opts = AttentionOptions::new()
            .with_need_weights(false)
            .with_is_causal(s.causal)
            .with_train(true);
        let step = |way: usize| -> Result<(f64, u64)> {
            let faults = minor_faults();
            let t = Instant::now();
            let out = mha.forward(&x, &x, &x, &opts)?.output;
            match way {
                0 => {}
                1 => drop(out.sum_all()?.backward()?),
                2 => drop(candle_mha::autograd::backward_with(&out, &ones)?),
                _ => drop(candle_mha::autograd::backward_with(&out, &r)?),
            }
            drop(out);
            Ok((t.elapsed().as_secs_f64(), minor_faults() - faults))
        };
        // Per way: each round's median time and faults per step.
        let mut times = vec![Vec::new(); ways.len()];
        let mut faults = vec![Vec::new(); ways.len()];
        for _ in 0..rounds {
            let mut t = vec![Vec::new(); ways.len()];
            let mut f = vec![Vec::new(); ways.len()];
            for rep in 0..warmup + reps {
                for way in 0..ways.len() {
                    let (secs, flt) = step(way)?;
                    if rep >= warmup {
                        t[way].push(secs);
                        f[way].push(flt as f64);
                    }
                }
            }
            for way in 0..ways.len() {
                times[way].push(median(&t[way]));
                // The mean: a step that trims or maps memory is the exception, not the median.
                faults[way].push(f[way].iter().sum::<f64>() / f[way].len() as f64);
            }
        }
        let fwd = median(&times[0]);
        for (way, name) in ways.iter().enumerate() {
            let total = median(&times[way]);
            rows.push(vec![
                s.label(),
                name.to_string(),
                format!("{:.2}", total * 1e3),
                match way {
                    0 => "—".into(),
                    _ => format!("{:.2}", (total - fwd) * 1e3),
                },
                format!("{:.0}", median(&faults[way])),
            ]);
        }
    }
    let header: Vec<String> = [
        "(N, L, E, H)",
        "backward",
        "step ms",
        "backward ms",
        "minor faults per step (mean)",
    ]
    .map(String::from)
    .to_vec();
    println!();
    print_table(&header, &rows);
    println!(
        "\nstep: forward (train, need_weights=false) + the backward as named, ways alternating \
         rep by rep; ms: medians over rounds of round medians; backward ms = step - forward only."
    );
    Ok(())
}
