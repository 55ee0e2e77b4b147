//! The matrix products of the `train_step` bench's models, alone, as our linear ops compute
//! them (`src/cpu/gemm.rs`: the `gemm` crate on candle's thread count, or with the `mkl`
//! feature MKL's sequential `sgemm` on each of rayon's threads, the same strides) against
//! PyTorch's `torch.mm` (MKL) on the same machine and threads, alternating in rounds. A
//! model's step is mostly these products, so this table says how much of a gap between the
//! two steps lies in the matrix products, a component neither side's own code owns.
//!
//! Then the attention kernels' tile products (`tiles`), on one thread: the register tiles of
//! `src/attention/fused/kernel` (right operand packed once, as a head's keys and values are)
//! against the library's product on the same operands (MKL's sequential `sgemm` with `mkl`,
//! else the `gemm` crate): whether the kernels should call the library instead.
//!
//! ```sh
//! cargo bench --features bench-internals --bench products
//! RAYON_NUM_THREADS=2 MHA_BENCH_PYTHON=VENV/bin/python cargo bench --features bench-internals --bench products
//! ```
//!
//! Per model (`medium`, `large`: `T = N·L` tokens, embedding `E`, feed-forward `4E`, vocabulary
//! `V`) and per linear layer (`in_proj` E→3E, `out_proj` E→E, `fc1` E→4E, `fc2` 4E→E, `head`
//! E→V), the three products of its training step with the layouts PyTorch's `nn.Linear` uses
//! too:
//! - forward `x·Wᵀ` (`T × out`, `W` read transposed);
//! - input gradient `g·W` (`T × in`);
//! - weight gradient `gᵀ·x` (`out × in` over the `T` tokens, `g` read transposed).
//!
//! Each side writes into an output made once (PyTorch: `torch.mm(..., out=)`); operands hold
//! random values. Per product: a warm-up of at least 3 calls and 100 ms, then
//! `MHA_BENCH_REPS` timed calls (default 15); the table gives the medians over rounds of each
//! round's median, in GFLOP/s, and the ratio of times (ours/PyTorch's); "fastest" compares
//! each side's fastest call of all rounds (noise only slows a call down). The last row of a
//! model sums its products' median times, once per layer (the model has several blocks; the
//! ratio is what matters).
//!
//! Environment: `MHA_BENCH_SHAPES` (`medium,large,tiles` by default), `MHA_BENCH_ROUNDS` (3),
//! `MHA_BENCH_REPS` (15), `MHA_BENCH_PYTHON` (a Python with torch; unset: `python3`, then
//! `python`), `RAYON_NUM_THREADS` (our threads; torch gets the same), `MHA_BENCH_LAYERS`
//! (only the named layers: `in_proj,fc2`, …).
//!

use candle_mha_test_support::bench as support;

use std::convert::Infallible;

use candle_mha::bench_internals::{self as internals, Operand};
use support::{
    env_usize, find_torch, median, print_machine, print_table, thread_setting, time_calls,
    Allocator, TorchServer,
};

/// One product `dst[m×n] = lhs[m×k] · rhs[k×n]`; `lhs_t` / `rhs_t`: that operand is stored
/// transposed (`k × m` / `n × k`, row-major).
#[derive(Clone, Copy, Debug)]
struct Product {
    layer: &'static str,
    what: &'static str,
    m: usize,
    n: usize,
    k: usize,
    lhs_t: bool,
    rhs_t: bool,
}

impl Product {
    fn flop(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }

    /// `m×n×k` and which operands are read transposed.
    fn dims(&self) -> String {
        let t = |yes: bool, which: &str| match yes {
            true => format!(" ({which} read transposed)"),
            false => String::new(),
        };
        format!(
            "{}×{}×{}{}{}",
            self.m,
            self.n,
            self.k,
            t(self.lhs_t, "lhs"),
            t(self.rhs_t, "rhs")
        )
    }
}

/// The three products of a linear layer `in → out` over `t` tokens.
fn linear_products(layer: &'static str, t: usize, inp: usize, out: usize) -> [Product; 3] {
    let p = |what, m, n, k, lhs_t, rhs_t| Product {
        layer,
        what,
        m,
        n,
        k,
        lhs_t,
        rhs_t,
    };
    [
        p("forward x·Wᵀ", t, out, inp, false, true),
        p("input grad g·W", t, inp, out, false, false),
        p("weight grad gᵀ·x", out, inp, t, true, false),
    ]
}

/// A model of `crates/candle-mha-train/benches/train_step.rs`: `(name, tokens, E, V)`.
fn models() -> Vec<(&'static str, usize, usize, usize)> {
    let all = [
        ("medium", 16 * 128, 256, 512),
        ("large", 8 * 256, 512, 1024),
    ];
    all.into_iter().filter(|(name, ..)| wanted(name)).collect()
}

/// Whether `MHA_BENCH_SHAPES` (default `medium,large,tiles`) names `shape`.
fn wanted(shape: &str) -> bool {
    let shapes = std::env::var("MHA_BENCH_SHAPES").unwrap_or_else(|_| "medium,large,tiles".into());
    shapes.split(',').any(|w| w.trim() == shape)
}

/// The attention kernels' tile products for head dimension `d`
/// (`src/attention/fused/kernel`): the forward's tiles of 64 queries × 256 keys, the
/// backward's of 256 × 256 (dK's product is dV's shape and layout).
fn tile_products(d: usize) -> [Product; 5] {
    let p = |what, m, n, k, lhs_t, rhs_t| Product {
        layer: "tile",
        what,
        m,
        n,
        k,
        lhs_t,
        rhs_t,
    };
    [
        p("forward scores q·kᵀ", 64, 256, d, false, true),
        p("forward context p·v", 64, d, 256, false, false),
        p("backward dP = dO·vᵀ", 256, 256, d, false, true),
        p("backward dV += Pᵀ·dO", 256, d, 256, true, false),
        p("backward dQ += dS·k", 256, d, 256, false, false),
    ]
}

/// The products of a model's linear layers (those named in `MHA_BENCH_LAYERS`, if set).
fn products(t: usize, e: usize, v: usize) -> Vec<Product> {
    let layers = std::env::var("MHA_BENCH_LAYERS").ok();
    [
        ("in_proj", e, 3 * e),
        ("out_proj", e, e),
        ("fc1", e, 4 * e),
        ("fc2", 4 * e, e),
        ("head", e, v),
    ]
    .into_iter()
    .filter(|(layer, ..)| {
        layers
            .as_deref()
            .is_none_or(|l| l.split(',').any(|w| w.trim() == *layer))
    })
    .flat_map(|(layer, inp, out)| linear_products(layer, t, inp, out))
    .collect()
}

/// `len` seeded values in [0, 1) (the crate's RNG): the products' speed does not depend on them.
fn values(len: usize, seed: u64) -> Vec<f32> {
    use candle_mha::candle::{DType, Device};
    candle_mha::rng::uniform(0.0, 1.0, len, DType::F32, &Device::Cpu, seed)
        .and_then(|t| t.to_vec1())
        .expect("a seeded uniform tensor on the CPU")
}

/// A product's operands, seeded, as stored.
struct Operands {
    p: Product,
    lhs: Vec<f32>,
    rhs: Vec<f32>,
}

impl Operands {
    fn new(p: &Product) -> Self {
        Self {
            p: *p,
            lhs: values(p.m * p.k, 1),
            rhs: values(p.k * p.n, 2),
        }
    }

    /// `dst = lhs · rhs` as our linear ops compute it (`dst`: m×n elements).
    fn call(&self, dst: &mut [f32]) {
        let Product { m, n, k, .. } = self.p;
        let (lhs, rhs) = self.operands();
        internals::linear_product((m, n, k), lhs, rhs, dst)
            .expect("operands of the product's sizes");
    }

    fn operands(&self) -> (Operand<'_>, Operand<'_>) {
        (
            Operand {
                data: &self.lhs,
                transposed: self.p.lhs_t,
            },
            Operand {
                data: &self.rhs,
                transposed: self.p.rhs_t,
            },
        )
    }
}

/// Our side: median and fastest seconds of one product.
fn time_ours(p: &Product, reps: usize) -> (f64, f64) {
    let ops = Operands::new(p);
    let mut dst = vec![0f32; p.m * p.n];
    let timed = time_one(reps, || ops.call(&mut dst));
    std::hint::black_box(&dst);
    timed
}

/// The median over rounds of each round's median call (the first of `time_one`'s pairs).
fn round_median(rounds: &[(f64, f64)]) -> f64 {
    median(&rounds.iter().map(|t| t.0).collect::<Vec<_>>())
}

/// The fastest call of all rounds.
fn fastest(rounds: &[(f64, f64)]) -> f64 {
    rounds.iter().map(|t| t.1).fold(f64::INFINITY, f64::min)
}

/// Median and fastest seconds of `call`, a product on this thread.
fn time_one(reps: usize, mut call: impl FnMut()) -> (f64, f64) {
    let timed = time_calls(reps, 3, 100.0, || -> Result<(), Infallible> {
        call();
        Ok(())
    });
    timed.unwrap_or_else(|never| match never {})
}

/// The tile products for head dimensions 32, 64 and 128, on this thread: the kernels'
/// register tiles against the library's product, alternating in rounds.
fn tiles(rounds: usize, reps: usize) {
    let library = match cfg!(feature = "mkl") {
        true => "MKL sgemm, sequential",
        false => "gemm crate, 1 thread",
    };
    let ps: Vec<(usize, Product)> = [32, 64, 128]
        .into_iter()
        .flat_map(|d| tile_products(d).map(|p| (d, p)))
        .collect();
    let dims = |p: &Product| (p.m, p.n, p.k);
    let mut times = vec![[Vec::new(), Vec::new()]; ps.len()];
    for round in 0..rounds {
        eprintln!("tiles: round {}/{rounds}…", round + 1);
        for ((_, p), t) in ps.iter().zip(&mut times) {
            let ops = Operands::new(p);
            let (lhs, rhs) = ops.operands();
            let packed = internals::pack(p.k, p.n, rhs).expect("the product's sizes");
            let mut dst = vec![0f32; p.m * p.n];
            let run = |r: candle_mha::candle::Result<()>| r.expect("the product's sizes");
            t[0].push(time_one(reps, || {
                run(internals::tile_product(dims(p), lhs, &packed, &mut dst))
            }));
            t[1].push(time_one(reps, || {
                run(internals::library_product(dims(p), lhs, rhs, &mut dst))
            }));
            std::hint::black_box(&dst);
        }
    }
    let header: Vec<String> = [
        "d",
        "product",
        "m×n×k",
        "tiles GFLOP/s",
        &format!("{library} GFLOP/s"),
        "tiles/library time",
        "fastest tiles/library",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = ps
        .iter()
        .zip(&times)
        .map(|((d, p), [ours, lib])| {
            vec![
                d.to_string(),
                p.what.to_string(),
                p.dims(),
                format!("{:.0}", p.flop() / round_median(ours) / 1e9),
                format!("{:.0}", p.flop() / round_median(lib) / 1e9),
                format!("{:.2}", round_median(ours) / round_median(lib)),
                format!("{:.2}", fastest(ours) / fastest(lib)),
            ]
        })
        .collect();
    println!("\n### tiles: the attention kernels' products on one thread\n");
    print_table(&header, &rows);
}

/// PyTorch's side for a list of products, in the same order.
fn time_torch(server: &mut TorchServer, ps: &[Product], reps: usize) -> Option<Vec<(f64, f64)>> {
    let list: Vec<_> = ps
        .iter()
        .map(|p| serde_json::json!([p.m, p.n, p.k, p.lhs_t, p.rhs_t]))
        .collect();
    let rec = server.request(&serde_json::json!({
        "products": list, "reps": reps, "warmup": 3, "warmup_ms": 100,
    }))?;
    rec["times"]
        .as_array()?
        .iter()
        .map(|t| Some((t[0].as_f64()?, t[1].as_f64()?)))
        .collect()
}

fn main() {
    let (pin, threads_from) = thread_setting();
    if let Some(n) = pin {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    print_machine(&threads_from);
    let threads = candle_mha::candle::utils::get_num_threads();
    let (rounds, reps) = (
        env_usize("MHA_BENCH_ROUNDS").unwrap_or(3).max(1),
        env_usize("MHA_BENCH_REPS").unwrap_or(15).max(1),
    );
    // glibc's defaults on both sides: the outputs are made once, so the setting does not
    // enter the timed calls.
    let allocator = Allocator::new(false);
    let mut server = find_torch().and_then(|(py, v)| {
        let s = TorchServer::start(&py, "bench_products_reference.py", threads, &allocator)?;
        println!("torch: {v} ({py}), torch.set_num_threads({threads})");
        Some(s)
    });
    if server.is_none() {
        println!("torch: not available (set MHA_BENCH_PYTHON)");
    }
    println!("{rounds} rounds; in each, every product runs on our side, then all on PyTorch's");
    for (name, t, e, v) in models() {
        let ps = products(t, e, v);
        let mut ours: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ps.len()];
        let mut theirs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ps.len()];
        for round in 0..rounds {
            eprintln!("{name}: round {}/{rounds}…", round + 1);
            for (i, p) in ps.iter().enumerate() {
                ours[i].push(time_ours(p, reps));
            }
            if let Some(times) = server.as_mut().and_then(|s| time_torch(s, &ps, reps)) {
                for (i, t) in times.into_iter().enumerate() {
                    theirs[i].push(t);
                }
            }
        }
        let header: Vec<String> = [
            "layer",
            "product",
            "m×n×k",
            "ours GFLOP/s",
            "torch GFLOP/s",
            "ours/torch time",
            "fastest ours/torch",
        ]
        .map(String::from)
        .to_vec();
        let ratio = |a: f64, b: Option<f64>| b.map_or("n/a".into(), |b| format!("{:.2}", a / b));
        let mut rows = Vec::new();
        let (mut sum_ours, mut sum_theirs) = (0.0, 0.0);
        for (i, p) in ps.iter().enumerate() {
            let (o, o_best) = (round_median(&ours[i]), fastest(&ours[i]));
            let (t, t_best) = match theirs[i].is_empty() {
                true => (None, None),
                false => (Some(round_median(&theirs[i])), Some(fastest(&theirs[i]))),
            };
            sum_ours += o;
            sum_theirs += t.unwrap_or(f64::NAN);
            rows.push(vec![
                p.layer.to_string(),
                p.what.to_string(),
                p.dims(),
                format!("{:.0}", p.flop() / o / 1e9),
                t.map_or("n/a".into(), |t| format!("{:.0}", p.flop() / t / 1e9)),
                ratio(o, t),
                ratio(o_best, t_best),
            ]);
        }
        let total_flop: f64 = ps.iter().map(Product::flop).sum();
        let with_torch = !theirs[0].is_empty();
        rows.push(vec![
            "all".into(),
            "one of each layer".into(),
            format!("{:.1} GFLOP", total_flop / 1e9),
            format!("{:.0}", total_flop / sum_ours / 1e9),
            match with_torch {
                true => format!("{:.0}", total_flop / sum_theirs / 1e9),
                false => "n/a".into(),
            },
            ratio(sum_ours, with_torch.then_some(sum_theirs)),
            String::new(),
        ]);
        println!(
            "\n### {name}: T = {t} tokens, E = {e}, feed-forward {}, V = {v}\n",
            4 * e
        );
        print_table(&header, &rows);
    }
    if wanted("tiles") {
        tiles(rounds, reps);
    }
    println!(
        "\nGFLOP/s and time ratios: medians over the rounds of each round's median call; fastest: \
         each side's fastest call of all rounds.\nratio < 1: our product is faster than \
         PyTorch's mm; > 1: slower. tiles/library < 1: the attention kernels' register tiles \
         are faster than the library's product."
    );
}
