//! One training step of [`NextTokenPredictor`] on the CPU, against its PyTorch twin
//! (`scripts/reference_model.py`) on the same machine, threads and shapes.
//!
//! ```sh
//! cargo bench --bench train_step
//! MHA_BENCH_SHAPES=small,medium MHA_BENCH_STEPS=20 MHA_BENCH_PYTHON=.venv-torch/bin/python \
//!     cargo bench --bench train_step
//! ```
//!
//! A step is what `Trainer::train_step` does: `train_loss` (the forward pass in training mode
//! with an all-zero key padding mask, then the output head and the cross-entropy, every
//! position counted, as one op) + reading the loss + `backward` +
//! `clip_grad_norm(1.0)` + `AdamW::step` (PyTorch's default hyper-parameters), f32. Tokens
//! are random (seeded), a fresh batch per step, drawn outside the timed region. Like
//! `Trainer::train_step`, the step runs inside candle's CPU thread pool
//! (`Device::with_context`: the calling thread takes part in the parallel ops);
//! `MHA_BENCH_CONTEXT=0` times a plain loop instead.
//!
//! Rounds: for `MHA_BENCH_ROUNDS` rounds (default 3), each shape runs on our side and right
//! after on PyTorch's (a `--serve` child of `scripts/bench_reference.py`), so that both sides
//! of a ratio see the same load; a cell is the median over rounds of the round medians, and
//! "per round" is the range of the ratio over the rounds. "fastest/torch's" divides our fastest
//! step of all rounds by PyTorch's: noise only ever slows a step down, so on a loaded host it
//! is the steadier comparison of what each side can do.
//!
//! Environment:
//! - `MHA_BENCH_SHAPES`: comma-separated subset of `small,medium,large` (default: all);
//! - `MHA_BENCH_ROUNDS`: rounds (default 3);
//! - `MHA_BENCH_STEPS` / `MHA_BENCH_WARMUP`: timed / untimed steps for every shape (default:
//!   10 + 3 for small and medium, 5 + 2 for large); `MHA_BENCH_WARMUP_MS` (default 250): the
//!   untimed steps go on until this long has passed, on both sides;
//! - `MHA_BENCH_PYTHON`: the Python with torch (unset: `python3`, then
//!   `python`); without torch the PyTorch columns are left out;
//! - `MHA_BENCH_KERNEL=reference`: our model's attention on the reference ops instead of the
//!   fused kernel (`NextTokenPredictor::with_attention_kernel`);
//! - `RAYON_NUM_THREADS`: candle's CPU threads (default: the cores, pinned as `mha` does); torch
//!   gets the same;
//! - `MHA_BENCH_MODE` (as in the `attention_cpu` bench): `user`, `retained`, or both
//!   comma-separated (the default: both, one table each). Each setting runs in a child process
//!   of its own (allocator settings are process-wide): `user` leaves glibc's allocator
//!   defaults on both sides (a library user's program); `retained` keeps freed memory on both
//!   sides (`runtime::retain_freed_memory` here, the equivalent `GLIBC_TUNABLES` in PyTorch's
//!   process) and runs our side with `runtime::recommended_env()` where the environment does
//!   not set it, as the `mha` CLI trains.

use candle_mha_test_support::bench as support;

use std::time::Instant;

use support::{
    env_usize, find_torch, median, mode_children, print_machine, print_table, thread_setting,
    Allocator, TorchServer,
};

use candle::{DType, Device, Result, Tensor};
use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
use candle_mha::rng::{derive_seed, rng_from_seed};
use candle_mha::{seeded_var_builder, AttentionKernel};
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use rand::Rng;

/// One benchmark shape: `N` batch, `L` sequence length, `V` vocab, `E`, `H`, layers; ff = 4E.
#[derive(Clone, Debug)]
struct BenchShape {
    name: &'static str,
    n: usize,
    l: usize,
    v: usize,
    e: usize,
    h: usize,
    layers: usize,
    warmup: usize,
    steps: usize,
}

impl BenchShape {
    fn ff(&self) -> usize {
        4 * self.e
    }

    /// The position table covers at least 64 positions (the `mha train` default).
    fn max_len(&self) -> usize {
        self.l.max(64)
    }

    fn tokens(&self) -> usize {
        self.n * self.l
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name, "n": self.n, "l": self.l, "v": self.v, "e": self.e,
            "h": self.h, "layers": self.layers, "ff": self.ff(), "max_len": self.max_len(),
            "steps": self.steps, "warmup": self.warmup,
            "warmup_ms": env_usize("MHA_BENCH_WARMUP_MS").unwrap_or(250),
        })
    }
}

const ALL_SHAPES: [BenchShape; 3] = [
    // The default `mha train` task.
    BenchShape {
        name: "small",
        n: 64,
        l: 11,
        v: 37,
        e: 64,
        h: 4,
        layers: 2,
        warmup: 3,
        steps: 10,
    },
    BenchShape {
        name: "medium",
        n: 16,
        l: 128,
        v: 512,
        e: 256,
        h: 8,
        layers: 4,
        warmup: 3,
        steps: 10,
    },
    BenchShape {
        name: "large",
        n: 8,
        l: 256,
        v: 1024,
        e: 512,
        h: 8,
        layers: 4,
        warmup: 2,
        steps: 5,
    },
];

/// What one side measured for one shape.
#[derive(Clone, Debug)]
struct Timing {
    median_s: f64,
    /// The fastest step (over rounds: of all rounds). A loaded machine only slows steps down.
    fastest_s: f64,
    tokens_per_s: f64,
    /// Median seconds of forward + loss, backward, clipping, AdamW (PyTorch's side: where
    /// its script reports them; its first phase includes `zero_grad`).
    phases: Option<[f64; 4]>,
}

fn selected_shapes() -> Vec<BenchShape> {
    let steps = env_usize("MHA_BENCH_STEPS").filter(|&s| s > 0);
    let warmup = env_usize("MHA_BENCH_WARMUP");
    let wanted: Option<Vec<String>> = std::env::var("MHA_BENCH_SHAPES").ok().map(|s| {
        s.split(',')
            .map(|p| p.trim().to_lowercase())
            .filter(|p| !p.is_empty())
            .collect()
    });
    if let Some(w) = &wanted {
        for name in w {
            if !ALL_SHAPES.iter().any(|s| s.name == name) {
                eprintln!("warning: unknown shape {name:?} in MHA_BENCH_SHAPES (known: small, medium, large)");
            }
        }
    }
    ALL_SHAPES
        .iter()
        .filter(|s| {
            wanted
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == s.name))
        })
        .map(|s| BenchShape {
            steps: steps.unwrap_or(s.steps),
            warmup: warmup.unwrap_or(s.warmup),
            ..s.clone()
        })
        .collect()
}

/// Random tokens `(N, L + 1)` split into inputs `(N, L)` and next-token targets `(N, L)`.
fn random_batch(shape: &BenchShape, seed: u64, dev: &Device) -> Result<(Tensor, Tensor)> {
    let mut rng = rng_from_seed(seed);
    let (n, l) = (shape.n, shape.l);
    let data: Vec<u32> = (0..n * (l + 1))
        .map(|_| rng.random_range(0..shape.v as u32))
        .collect();
    let all = Tensor::from_vec(data, (n, l + 1), dev)?;
    Ok((
        all.narrow(1, 0, l)?.contiguous()?,
        all.narrow(1, 1, l)?.contiguous()?,
    ))
}

/// Our model, optimiser and masks for one shape: one training step at a time.
struct Stepper {
    shape: BenchShape,
    dev: Device,
    model: NextTokenPredictor,
    opt: AdamW,
    vars: Vec<candle::Var>,
    kpm: Tensor,
    loss_mask: Tensor,
    in_context: bool,
}

impl Stepper {
    fn new(shape: &BenchShape) -> Result<Self> {
        let dev = Device::Cpu;
        let cfg = NextTokenPredictorConfig {
            vocab_size: shape.v,
            max_len: shape.max_len(),
            embed_dim: shape.e,
            num_heads: shape.h,
            num_layers: shape.layers,
            ff_dim: shape.ff(),
            dropout: 0.0,
            resid_dropout: 0.0,
            ..NextTokenPredictorConfig::new(0)
        };
        let varmap = candle_nn::VarMap::new();
        let kernel = match std::env::var("MHA_BENCH_KERNEL").as_deref() {
            Ok("reference") => AttentionKernel::Reference,
            _ => AttentionKernel::Auto,
        };
        let model = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 0, DType::F32, &dev))?
            .with_attention_kernel(kernel);
        let opt = AdamW::from_varmap(&varmap, AdamWConfig::default())?;
        let vars = opt.vars();
        Ok(Self {
            kpm: Tensor::zeros((shape.n, shape.l), DType::U8, &dev)?, // no padding
            loss_mask: Tensor::ones((shape.n, shape.l), DType::U8, &dev)?, // every position
            in_context: std::env::var("MHA_BENCH_CONTEXT").as_deref() != Ok("0"),
            shape: shape.clone(),
            dev,
            model,
            opt,
            vars,
        })
    }

    /// Step number `step` (its batch drawn before the clock starts): the seconds of forward +
    /// loss, backward, clipping and AdamW.
    fn step(&mut self, step: usize) -> Result<[f64; 4]> {
        let label = format!("bench/{}/{step}", self.shape.name);
        let (input, targets) = random_batch(&self.shape, derive_seed(1, &label), &self.dev)?;
        let Self {
            model,
            opt,
            vars,
            kpm,
            loss_mask,
            ..
        } = self;
        let mut body = || -> Result<_> {
            let t0 = Instant::now();
            let seed = derive_seed(2, &label);
            let loss = model.train_loss(&input, Some(kpm), (seed, 0), &targets, loss_mask)?;
            let loss_value = loss.to_scalar::<f32>()?;
            let t1 = Instant::now();
            let mut grads = loss.backward()?;
            let t2 = Instant::now();
            clip_grad_norm(&mut grads, vars, 1.0)?;
            let t3 = Instant::now();
            opt.step(&grads)?;
            let t4 = Instant::now();
            Ok((t0, t1, t2, t3, t4, loss_value))
        };
        // As `Trainer::train_step` runs it: inside candle's thread pool (unless
        // MHA_BENCH_CONTEXT=0, the plain loop of a program of one's own).
        let (t0, t1, t2, t3, t4, loss_value) = match self.in_context {
            true => self.dev.with_context(&mut body)?,
            false => body()?,
        };
        if !loss_value.is_finite() {
            candle::bail!("{}: loss is {loss_value} at step {step}", self.shape.name)
        }
        Ok([(t0, t1), (t1, t2), (t2, t3), (t3, t4)].map(|(a, b)| (b - a).as_secs_f64()))
    }
}

/// Our side: the median of `shape.steps` timed full training steps.
fn bench_ours(shape: &BenchShape) -> Result<Timing> {
    let mut stepper = Stepper::new(shape)?;
    let mut times = Vec::with_capacity(shape.steps);
    let mut phases: [Vec<f64>; 4] = Default::default();
    // Warm-up: at least `warmup` steps and `MHA_BENCH_WARMUP_MS` (default 250) milliseconds,
    // on both sides (right after the other side's cell, a small model's short steps run slower
    // for a few steps).
    let warmup_ms = env_usize("MHA_BENCH_WARMUP_MS").unwrap_or(250) as f64;
    let start = Instant::now();
    let mut step = 0;
    while times.len() < shape.steps {
        let timed = step >= shape.warmup && start.elapsed().as_secs_f64() * 1e3 >= warmup_ms;
        let took = stepper.step(step)?;
        if timed {
            times.push(took.iter().sum());
            for (k, t) in took.into_iter().enumerate() {
                phases[k].push(t);
            }
        }
        step += 1;
    }
    let median_s = median(&times);
    Ok(Timing {
        median_s,
        fastest_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        tokens_per_s: shape.tokens() as f64 / median_s,
        phases: Some(phases.map(|p| median(&p))),
    })
}

/// The PyTorch side for one shape: a request to `scripts/bench_reference.py --serve`.
fn bench_torch(server: &mut TorchServer, shape: &BenchShape) -> Option<Timing> {
    let rec = server.request(&shape.to_json())?;
    Some(Timing {
        median_s: rec["median_s"].as_f64()?,
        fastest_s: rec["min_s"].as_f64()?,
        tokens_per_s: rec["tokens_per_s"].as_f64()?,
        phases: rec["phases_s"].as_array().and_then(|p| {
            let p: Vec<f64> = p.iter().filter_map(|v| v.as_f64()).collect();
            p.try_into().ok()
        }),
    })
}

/// The median over rounds of each round's timing (`None` rounds left out).
fn over_rounds(rounds: &[Option<Timing>]) -> Option<Timing> {
    let got: Vec<&Timing> = rounds.iter().flatten().collect();
    if got.is_empty() {
        return None;
    }
    let median_s = median(&got.iter().map(|t| t.median_s).collect::<Vec<_>>());
    let phases = got[0].phases.map(|_| {
        std::array::from_fn(|k| {
            median(
                &got.iter()
                    .filter_map(|t| t.phases.map(|p| p[k]))
                    .collect::<Vec<_>>(),
            )
        })
    });
    Some(Timing {
        median_s,
        fastest_s: got
            .iter()
            .map(|t| t.fastest_s)
            .fold(f64::INFINITY, f64::min),
        tokens_per_s: got[0].tokens_per_s * got[0].median_s / median_s,
        phases,
    })
}

fn main() -> Result<()> {
    match mode_children("MHA_BENCH_MODE", &["user", "retained"], &[]) {
        Some(mode) => run_mode(&mode),
        None => Ok(()),
    }
}

/// One allocator setting's table (in a child process, see [`mode_children`]).
fn run_mode(mode: &str) -> Result<()> {
    let (pin, threads_from) = thread_setting();
    if let Some(n) = pin {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let shapes = selected_shapes();
    if shapes.is_empty() {
        eprintln!("no shape selected (MHA_BENCH_SHAPES: small, medium, large)");
        return Ok(());
    }
    // Both sides under the same allocator settings (see the module docs).
    let allocator = Allocator::new(mode == "retained");
    print_machine(&threads_from);
    let threads = candle::utils::get_num_threads();
    println!("{}", allocator.describe());
    let rounds = env_usize("MHA_BENCH_ROUNDS").unwrap_or(3).max(1);
    println!("{rounds} rounds; in each, every shape runs on our side and right after on PyTorch's");
    println!(
        "our step: {}",
        match std::env::var("MHA_BENCH_CONTEXT").as_deref() {
            Ok("0") => "a plain loop (MHA_BENCH_CONTEXT=0)",
            _ =>
                "inside candle's thread pool (Device::with_context), as Trainer::train_step runs it",
        }
    );
    let torch = find_torch();
    let mut server = match &torch {
        Some((py, version)) => {
            println!("torch: {version} ({py}), torch.set_num_threads({threads})");
            let server = TorchServer::start(py, "bench_reference.py", threads, &allocator);
            if server.is_none() {
                eprintln!("torch: scripts/bench_reference.py --serve did not start");
            }
            server
        }
        None => {
            println!("torch: not available (set MHA_BENCH_PYTHON)");
            None
        }
    };
    let with_torch = server.is_some();

    // Per shape, per round: ours, then PyTorch's on the same load.
    let mut ours_r: Vec<Vec<Option<Timing>>> = vec![Vec::new(); shapes.len()];
    let mut theirs_r: Vec<Vec<Option<Timing>>> = vec![Vec::new(); shapes.len()];
    for round in 0..rounds {
        for (i, s) in shapes.iter().enumerate() {
            eprintln!(
                "round {}/{rounds}: {} ({} warmup + {} timed steps)…",
                round + 1,
                s.name,
                s.warmup,
                s.steps
            );
            ours_r[i].push(Some(bench_ours(s)?));
            if let Some(server) = server.as_mut() {
                theirs_r[i].push(bench_torch(server, s));
            }
        }
    }
    let ours: Vec<Timing> = ours_r
        .iter()
        .map(|r| over_rounds(r).expect("our side ran every round"))
        .collect();
    let theirs: Option<Vec<Option<Timing>>> =
        with_torch.then(|| theirs_r.iter().map(|r| over_rounds(r)).collect());
    // The lowest and highest ours/torch ratio of a round.
    let per_round = |i: usize| -> Option<String> {
        let ratios: Vec<f64> = ours_r[i]
            .iter()
            .zip(&theirs_r[i])
            .filter_map(|(o, t)| Some(o.as_ref()?.median_s / t.as_ref()?.median_s))
            .collect();
        let lo = ratios.iter().copied().reduce(f64::min)?;
        let hi = ratios.iter().copied().reduce(f64::max)?;
        Some(format!("{lo:.2}–{hi:.2}"))
    };

    let mut header: Vec<String> = [
        "shape",
        "N×L (tokens)",
        "V",
        "E/H/layers",
        "warmup+steps",
        "ours median ms",
        "ours tok/s",
    ]
    .map(String::from)
    .to_vec();
    if theirs.is_some() {
        header.extend(
            [
                "torch median ms",
                "torch tok/s",
                "ratio (ours/torch time)",
                "per round",
                "fastest/torch's",
            ]
            .map(String::from),
        );
    }
    let mut rows = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let o = &ours[i];
        let mut row = vec![
            s.name.to_string(),
            format!("{}×{} ({})", s.n, s.l, s.tokens()),
            s.v.to_string(),
            format!("{}/{}/{}", s.e, s.h, s.layers),
            format!("{}+{}", s.warmup, s.steps),
            format!("{:.1}", o.median_s * 1e3),
            format!("{:.0}", o.tokens_per_s),
        ];
        if let Some(t) = &theirs {
            match &t[i] {
                Some(t) => row.extend([
                    format!("{:.1}", t.median_s * 1e3),
                    format!("{:.0}", t.tokens_per_s),
                    format!("{:.2}", o.median_s / t.median_s),
                    per_round(i).unwrap_or_else(|| "n/a".into()),
                    format!("{:.2}", o.fastest_s / t.fastest_s),
                ]),
                None => row.extend(["n/a", "n/a", "n/a", "n/a", "n/a"].map(String::from)),
            }
        }
        rows.push(row);
    }
    println!();
    print_table(&header, &rows);
    if theirs.is_some() {
        println!(
            "\nmedians over the rounds of each round's median; per round: the lowest and highest \
             ours/torch ratio of a round; fastest/torch's: our fastest step of all rounds over \
             PyTorch's (noise only slows a step down).\nratio < 1: candle-mha is faster; > 1: slower."
        );
    }
    println!("\nmedian ms per phase: forward+loss / backward / clip_grad_norm / AdamW step");
    let theirs = theirs.unwrap_or_default();
    for (i, s) in shapes.iter().enumerate() {
        let sides = [
            ("ours", Some(&ours[i])),
            ("torch", theirs.get(i).and_then(|t| t.as_ref())),
        ];
        for (side, t) in sides {
            if let Some(p) = t.and_then(|t| t.phases) {
                println!(
                    "  {:<6} {:<5} {:>8.1} / {:>8.1} / {:>6.1} / {:>6.1}",
                    s.name,
                    side,
                    p[0] * 1e3,
                    p[1] * 1e3,
                    p[2] * 1e3,
                    p[3] * 1e3
                );
            }
        }
    }
    Ok(())
}
