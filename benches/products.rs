//! The matrix products of the `train_step` bench's models, alone: our linear ops' product
//! (`src/cpu/gemm.rs` on all threads, through `candle_mha::bench_hooks`: the same strides and
//! backend, `par_gemm` or the `gemm` crate as `on_all_threads` there chooses) against
//! PyTorch's `torch.mm` (MKL) on the same machine and threads, alternating in rounds. A
//! model's step is mostly these products (75% of CPU time in the `gemm` crate's micro-kernel
//! for the large model on the Zen 3 of `BENCHMARKS.md`, before `par_gemm`), so this table
//! says how much of a gap between the two steps is the products'.
//!
//! ```sh
//! cargo bench --bench products
//! RAYON_NUM_THREADS=2 MHA_BENCH_PYTHON=VENV/bin/python cargo bench --bench products
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
//! Environment: `MHA_BENCH_SHAPES` (`medium,large` by default), `MHA_BENCH_ROUNDS` (3),
//! `MHA_BENCH_REPS` (15), `MHA_BENCH_PYTHON` (a Python with torch; unset: `python3`, then
//! `python`), `RAYON_NUM_THREADS` (our threads; torch gets the same).
//!
//! **Paired mode** (`MHA_BENCH_PAIRED`, no PyTorch): variants of our own product, alternated
//! call by call in this one process, so that a host whose speed drifts within minutes slows
//! both sides of every ratio alike. The value lists the variants, comma-separated, the first
//! the baseline; a variant joins with `+` any of `default` (the library's choice), `par`
//! (`par_gemm`), `crate` (the `gemm` crate's own threading), `crate-norow` (the crate except
//! for products that start from a bias row; this bench's products have none), `kcN`
//! (`par_gemm`'s inner block N for a packed left operand, the weight gradients) and `slicesN`
//! (at most N inner-dimension slices of a weight gradient; 1: none):
//!
//! ```sh
//! MHA_BENCH_PAIRED=default,crate,kc512 MHA_BENCH_SHAPES=large MHA_BENCH_LAYERS=fc2 \
//!   RAYON_NUM_THREADS=2 cargo bench --bench products
//! ```
//!
//! Each round (`MHA_BENCH_ROUNDS`, 20 in this mode, after one warm-up round) calls every
//! product once per variant and once more for the baseline, **the control**, the order
//! reversed every other round. The table gives per product, and for the sum over the
//! products, the median and quartiles over the rounds of each variant's time over the
//! baseline's in the same round; the control's ratio shows how far the same code moves
//! within a round, so only a variant's ratio well outside the control's quartiles is a
//! difference. Every variant's output is checked against the baseline's first.
//! `MHA_BENCH_LAYERS` keeps only the named layers (`in_proj,fc2`, …).

mod support;

use std::convert::Infallible;

use support::{
    env_usize, find_torch, median, pin_threads, print_machine, print_table, time_calls, Allocator,
    Paired, TorchServer,
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

/// A model of `benches/train_step.rs`: `(name, tokens, E, V)`.
fn models() -> Vec<(&'static str, usize, usize, usize)> {
    let all = [
        ("medium", 16 * 128, 256, 512),
        ("large", 8 * 256, 512, 1024),
    ];
    let wanted = std::env::var("MHA_BENCH_SHAPES").unwrap_or_else(|_| "medium,large".into());
    all.into_iter()
        .filter(|(name, ..)| wanted.split(',').any(|w| w.trim() == *name))
        .collect()
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

    /// `dst = lhs · rhs` with our linear ops' product (`dst`: m×n elements).
    fn call(&self, dst: &mut [f32]) {
        let Product { m, n, k, .. } = self.p;
        assert_eq!(dst.len(), m * n);
        // (row stride, column stride) of each operand as stored.
        let (lrs, lcs) = if self.p.lhs_t { (1, m) } else { (k, 1) };
        let (rrs, rcs) = if self.p.rhs_t { (1, k) } else { (n, 1) };
        // SAFETY: every operand holds the elements its strides address; dst is m×n.
        unsafe {
            candle_mha::bench_hooks::linear_product_f32(
                (m, n, k),
                dst.as_mut_ptr(),
                (self.lhs.as_ptr(), lrs, lcs),
                (self.rhs.as_ptr(), rrs, rcs),
            )
        }
    }
}

/// Our side: median and fastest seconds of one product.
fn time_ours(p: &Product, reps: usize) -> (f64, f64) {
    let ops = Operands::new(p);
    let mut dst = vec![0f32; p.m * p.n];
    let mut call = || ops.call(&mut dst);
    let timed = time_calls(reps, 3, 100.0, || -> Result<(), Infallible> {
        call();
        Ok(())
    });
    std::hint::black_box(&dst);
    timed.unwrap_or_else(|never| match never {})
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
    let threads_from = pin_threads();
    print_machine(&threads_from);
    if let Some(paired) = Paired::from_env() {
        return run_paired(&paired);
    }
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
        let med = |v: &[(f64, f64)]| median(&v.iter().map(|t| t.0).collect::<Vec<_>>());
        let best = |v: &[(f64, f64)]| v.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
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
            let (o, o_best) = (med(&ours[i]), best(&ours[i]));
            let (t, t_best) = match theirs[i].is_empty() {
                true => (None, None),
                false => (Some(med(&theirs[i])), Some(best(&theirs[i]))),
            };
            sum_ours += o;
            sum_theirs += t.unwrap_or(f64::NAN);
            rows.push(vec![
                p.layer.to_string(),
                p.what.to_string(),
                format!(
                    "{}×{}×{}{}{}",
                    p.m,
                    p.n,
                    p.k,
                    if p.lhs_t {
                        " (lhs read transposed)"
                    } else {
                        ""
                    },
                    if p.rhs_t {
                        " (rhs read transposed)"
                    } else {
                        ""
                    }
                ),
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
    println!(
        "\nGFLOP/s and time ratios: medians over the rounds of each round's median call; fastest: \
         each side's fastest call of all rounds.\nratio < 1: our product is faster than \
         PyTorch's mm; > 1: slower."
    );
}

/// `MHA_BENCH_PAIRED`: variants of our product alternated call by call (see the top).
fn run_paired(paired: &Paired) {
    let rounds = env_usize("MHA_BENCH_ROUNDS").unwrap_or(20).max(1);
    let slots = paired.slots();
    println!("{}", paired.describe(rounds, "call per product"));
    for (name, t, e, v) in models() {
        let ps: Vec<Product> = products(t, e, v);
        let ops: Vec<Operands> = ps.iter().map(Operands::new).collect();
        let mut dsts: Vec<Vec<Vec<f32>>> = ps
            .iter()
            .map(|p| vec![vec![0f32; p.m * p.n]; slots.len()])
            .collect();
        // times[round][product][slot], seconds; round 0 is the warm-up.
        let mut times: Vec<Vec<Vec<f64>>> = Vec::new();
        for round in 0..=rounds {
            eprintln!("{name}: round {round}/{rounds}");
            let this: Vec<Vec<f64>> = ops
                .iter()
                .zip(dsts.iter_mut())
                .map(|(o, d)| {
                    paired.time_round(round, |slot| -> Result<(), Infallible> {
                        o.call(&mut d[slot]);
                        Ok(())
                    })
                })
                .collect::<Result<_, _>>()
                .unwrap_or_else(|never| match never {});
            if round > 0 {
                times.push(this);
            }
        }
        let mut header: Vec<String> = ["layer", "product", "m×n×k"].map(String::from).to_vec();
        header.push(format!("{} GFLOP/s", paired.names[0]));
        header.extend(paired.ratio_headers());
        let mut rows = Vec::new();
        for (i, p) in ps.iter().enumerate() {
            let per_round: Vec<Vec<f64>> = times.iter().map(|r| r[i].clone()).collect();
            let base = median(&per_round.iter().map(|r| r[0]).collect::<Vec<_>>());
            let mut row = vec![
                p.layer.to_string(),
                p.what.to_string(),
                format!("{}×{}×{}", p.m, p.n, p.k),
                format!("{:.0}", p.flop() / base / 1e9),
            ];
            row.extend(paired.ratio_cells(&per_round));
            rows.push(row);
        }
        // The sum over the products, per round and slot.
        let sums: Vec<Vec<f64>> = times
            .iter()
            .map(|r| {
                (0..slots.len())
                    .map(|s| r.iter().map(|p| p[s]).sum())
                    .collect()
            })
            .collect();
        let flop: f64 = ps.iter().map(Product::flop).sum();
        let mut row = vec![
            "all".to_string(),
            format!("the {} products", ps.len()),
            format!("{:.1} GFLOP", flop / 1e9),
            format!(
                "{:.0}",
                flop / median(&sums.iter().map(|s| s[0]).collect::<Vec<_>>()) / 1e9
            ),
        ];
        row.extend(paired.ratio_cells(&sums));
        rows.push(row);
        println!(
            "\n### {name}: T = {t} tokens, E = {e}, feed-forward {}, V = {v}\n",
            4 * e
        );
        print_table(&header, &rows);
        // Every slot's outputs against the baseline's: the largest |difference| / (1 + |it|).
        let agree: Vec<f64> = (1..slots.len())
            .map(|slot| {
                dsts.iter()
                    .flat_map(|d| {
                        d[slot]
                            .iter()
                            .zip(&d[0])
                            .map(|(a, b)| f64::from(((a - b) / (1.0 + b.abs())).abs()))
                    })
                    .fold(0.0, f64::max)
            })
            .collect();
        println!(
            "\nlargest |difference| / (1 + |{}|) of the outputs: {}",
            paired.names[0],
            paired
                .names
                .iter()
                .skip(1)
                .map(String::as_str)
                .chain(["control"])
                .zip(&agree)
                .map(|(v, a)| format!("{v} {a:.1e}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if agree.iter().any(|&a| a > 1e-3) {
            eprintln!("a variant's outputs differ from the baseline's by more than 1e-3");
            std::process::exit(1);
        }
    }
    println!("\n{}", paired.legend());
}
