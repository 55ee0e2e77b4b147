//! The matrix products of the `train_step` bench's models, alone: the `gemm` crate as our
//! linear ops call it (`src/cpu/gemm.rs`: the same strides, rayon on candle's thread count)
//! against PyTorch's `torch.mm` (MKL) on the same machine and threads, alternating in rounds.
//! A model's step is mostly these products, so this table says how much of a gap between the
//! two steps lies in the matrix products, a component neither side's own code owns.
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
//! `python`), `RAYON_NUM_THREADS` (our threads; torch gets the same), `MHA_BENCH_LAYERS`
//! (only the named layers: `in_proj,fc2`, …).
//!

use candle_mha_test_support::bench as support;

use std::convert::Infallible;

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

    /// `dst = lhs · rhs` with the `gemm` crate as our linear ops call it (`dst`: m×n elements).
    fn call(&self, dst: &mut [f32]) {
        let Product { m, n, k, .. } = self.p;
        assert_eq!(dst.len(), m * n);
        // (row stride, column stride) of each operand as stored.
        let (lrs, lcs) = if self.p.lhs_t { (1, m) } else { (k, 1) };
        let (rrs, rcs) = if self.p.rhs_t { (1, k) } else { (n, 1) };
        let threads = candle_mha::candle::utils::get_num_threads();
        let parallelism = match threads {
            1 => gemm::Parallelism::None,
            t => gemm::Parallelism::Rayon(t),
        };
        // SAFETY: every operand holds the elements its strides address; dst is m×n. gemm's
        // arguments: column stride before row stride; `dst = 0·dst + 1·lhs·rhs`.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                self.lhs.as_ptr(),
                lcs as isize,
                lrs as isize,
                self.rhs.as_ptr(),
                rcs as isize,
                rrs as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
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
