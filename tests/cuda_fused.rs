//! The fused CUDA attention kernel (`src/attention/fused/cuda`) against the CPU fused kernel,
//! the CUDA reference path and the PyTorch fixtures: outputs and every gradient, each mask
//! kind, key padding with fully masked rows, `add_bias_kv` / `add_zero_attn`, seeded dropout,
//! f32 / bf16 / f16, head dims that are not a tile width, lengths that are not a multiple of
//! the tiles, decoding one position at a time from the key/value cache, and an L = 16384
//! forward whose memory stays linear in L.
//!
//! Compiled in every build; it runs only in a `--features cuda` build on a machine with a GPU
//! of compute capability 8.0 or more and prints why it skipped otherwise.

use candle_mha_test_support as common;

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::rng::normal;
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, IncrementalOptions, KvCache,
    MultiheadAttention, MultiheadAttentionConfig,
};
use common::{assert_close, fixture_paths, gpu, rel_err, run_fixture, Fixture};

/// A GPU the fused kernel runs on, or `None` (with the reason printed).
fn fused_gpu() -> Option<Device> {
    let dev = gpu()?;
    let probe = || -> Result<()> {
        let x = Tensor::ones((1, 1, 8), DType::F32, &dev)?;
        let varmap = candle_mha::candle_nn::VarMap::new();
        let mha = MultiheadAttention::new(
            MultiheadAttentionConfig::new(8, 1).with_batch_first(true),
            seeded_var_builder(&varmap, 0, DType::F32, &dev),
        )?;
        let opts = AttentionOptions::new()
            .with_need_weights(false)
            .with_kernel(AttentionKernel::Fused);
        mha.forward(&x, &x, &x, &opts)?;
        Ok(())
    };
    match probe() {
        Ok(()) => Some(dev),
        // The kernels' module does not load on GPUs older than compute capability 8.0.
        Err(e) if e.to_string().contains("compute capability 8.0") => {
            println!("skipped: the fused CUDA kernel does not run on this GPU ({e})");
            None
        }
        Err(e) => panic!("the fused CUDA kernel failed on a one-token call: {e}"),
    }
}

/// Tolerance (max |diff| / max |expected|) of a CUDA run in `dtype` against the CPU in f32 on
/// the same (rounded) numbers: a few roundings of the dtype, with room to spare over what the
/// kernel gives (in f32 too, where 3xTF32 keeps f32 accuracy).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 3e-2,
        DType::F16 => 5e-3,
        _ => 2e-5,
    }
}

/// Every PyTorch fixture through the fused CUDA kernel (need_weights=false): the output and
/// every gradient equal PyTorch's (fully masked fixtures: the CPU's, which follow the
/// documented zero rule), in the fixture's dtype and, against the f32 result, in bf16 and f16.
#[test]
fn fused_cuda_matches_pytorch_fixtures() -> Result<()> {
    let Some(gpu) = fused_gpu() else {
        return Ok(());
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in fixture_paths() {
        let f = Fixture::load(&path)?;
        let dtype = f.dtype()?;
        if dtype == DType::F64 {
            continue; // the CUDA kernel takes bf16, f16 and f32
        }
        let cuda = run_fixture(&f, dtype, &gpu, Some(AttentionKernel::Fused))?;
        let cpu = run_fixture(&f, dtype, &Device::Cpu, Some(AttentionKernel::Fused))?;
        let pytorch_ok = !f.flag("fully_masked").unwrap_or(false);
        for (name, got) in &cuda {
            // The fixtures name parameter gradients `grad.param.<name>`.
            let key = match name.strip_prefix("grad.") {
                Some(p) if !["query", "key", "value"].contains(&p) => format!("grad.param.{p}"),
                _ => name.clone(),
            };
            let expected = match (pytorch_ok, f.tensors.get(&key)) {
                (true, Some(t)) => t.to_dtype(DType::F64)?,
                _ => cpu[name].clone(),
            };
            if let Err(e) = assert_close(name, got, &expected, tolerance(dtype)) {
                failures.push(format!("{}: {e}", f.name));
            }
            checked += 1;
        }
        for half in [DType::BF16, DType::F16] {
            let out = run_fixture(&f, half, &gpu, Some(AttentionKernel::Fused))?;
            for (name, got) in &out {
                if let Err(e) = assert_close(name, got, &cpu[name], 2.0 * tolerance(half)) {
                    failures.push(format!("{} {half:?}: {e}", f.name));
                }
            }
        }
    }
    println!("{checked} tensors checked against PyTorch / the CPU");
    assert!(checked > 100, "only {checked} tensors checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    Causal,
    /// u8 `(L, S)`, query row 1 fully masked.
    Bool2d,
    /// f32 `(N·H, L, S)` biases with some `-inf`.
    Float3d,
}

#[derive(Clone, Copy, Debug)]
enum Padding {
    None,
    /// u8 `(N, S)`: the last keys of batch row 1.
    Some,
    /// u8 `(N, S)`: every key of batch row 1 (fully masked rows).
    All,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    l: usize,
    s: usize,
    e: usize,
    h: usize,
    self_attn: bool,
    batch_first: bool,
    bias_kv: bool,
    zero_attn: bool,
    mask: Mask,
    padding: Padding,
    dropout: f64,
}

const BASE: Case = Case {
    n: 2,
    l: 37,
    s: 37,
    e: 64,
    h: 2,
    self_attn: true,
    batch_first: true,
    bias_kv: false,
    zero_attn: false,
    mask: Mask::None,
    padding: Padding::None,
    dropout: 0.0,
};

/// Shapes around the tiles (64 queries / keys; 32 f32 keys in the forward pass; head dims 32,
/// 64, 128), each mask kind, padding, extra keys and dropout.
fn cases() -> Vec<Case> {
    vec![
        BASE,
        Case { l: 1, s: 1, ..BASE },
        Case {
            l: 64,
            s: 64,
            e: 128,
            h: 2,
            ..BASE
        },
        Case {
            l: 130,
            s: 130,
            e: 96,
            h: 3,
            mask: Mask::Causal,
            ..BASE
        },
        Case {
            l: 200,
            s: 200,
            e: 256,
            h: 2,
            mask: Mask::Causal,
            batch_first: false,
            ..BASE
        },
        Case {
            l: 65,
            s: 65,
            e: 48,
            h: 3,
            mask: Mask::Bool2d,
            padding: Padding::Some,
            ..BASE
        },
        Case {
            self_attn: false,
            l: 29,
            s: 75,
            e: 45,
            h: 5,
            mask: Mask::Float3d,
            ..BASE
        },
        Case {
            self_attn: false,
            l: 33,
            s: 3,
            e: 16,
            h: 2,
            padding: Padding::All,
            ..BASE
        },
        Case {
            self_attn: false,
            l: 70,
            s: 45,
            bias_kv: true,
            zero_attn: true,
            padding: Padding::All,
            mask: Mask::Bool2d,
            ..BASE
        },
        Case {
            l: 100,
            s: 100,
            mask: Mask::Causal,
            bias_kv: true,
            ..BASE
        },
        Case {
            l: 90,
            s: 90,
            dropout: 0.3,
            mask: Mask::Causal,
            padding: Padding::Some,
            ..BASE
        },
        Case {
            self_attn: false,
            l: 50,
            s: 66,
            e: 24,
            h: 3,
            dropout: 0.5,
            zero_attn: true,
            batch_first: false,
            ..BASE
        },
    ]
}

/// A mask tensor of the case on the CPU (u8, or f32 for float masks).
fn masks(c: &Case, h: usize) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let cpu = Device::Cpu;
    let (l, s, n) = (c.l, c.s, c.n);
    let attn = match c.mask {
        Mask::None | Mask::Causal => None,
        Mask::Bool2d => {
            let data: Vec<u8> = (0..l)
                .flat_map(|i| (0..s).map(move |j| u8::from(i == 1 || (i * 7 + j * 3) % 5 == 0)))
                .collect();
            Some(Tensor::from_vec(data, (l, s), &cpu)?)
        }
        Mask::Float3d => {
            let data: Vec<f32> = (0..n * h * l * s)
                .map(|x| match x % 11 {
                    0 => f32::NEG_INFINITY,
                    r => (r as f32 * 0.37).sin(),
                })
                .collect();
            Some(Tensor::from_vec(data, (n * h, l, s), &cpu)?)
        }
    };
    let kpm = match c.padding {
        Padding::None => None,
        Padding::Some | Padding::All => {
            let all = matches!(c.padding, Padding::All);
            let data: Vec<u8> = (0..n)
                .flat_map(|b| (0..s).map(move |j| u8::from(b == 1 && (all || j + 3 >= s))))
                .collect();
            Some(Tensor::from_vec(data, (n, s), &cpu)?)
        }
    };
    Ok((attn, kpm))
}

/// The output and every gradient of a case, as f64 CPU tensors by name: parameters and inputs
/// drawn in f32, rounded to `round`, run in `dtype` on `dev` with `kernel`.
fn run_case(
    c: &Case,
    round: DType,
    dtype: DType,
    dev: &Device,
    kernel: AttentionKernel,
) -> Result<HashMap<String, Tensor>> {
    let cfg = MultiheadAttentionConfig::new(c.e, c.h)
        .with_batch_first(c.batch_first)
        .with_add_bias_kv(c.bias_kv)
        .with_add_zero_attn(c.zero_attn)
        .with_dropout(c.dropout);
    let cpu = Device::Cpu;
    let to_run =
        |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(round)?.to_dtype(dtype)?.to_device(dev)?) };
    let varmap = candle_mha::candle_nn::VarMap::new();
    let init = MultiheadAttention::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 3, DType::F32, &cpu),
    )?;
    let mut vars: HashMap<String, Var> = HashMap::new();
    for (name, t) in init.named_parameters() {
        // bias_k / bias_v and the biases start at zero: give them values.
        let t = (t.clone() + normal(0., 0.1, t.shape(), DType::F32, &cpu, 11)?)?;
        vars.insert(name, Var::from_tensor(&to_run(&t)?)?);
    }
    let mha = MultiheadAttention::from_tensors(
        cfg,
        vars.iter()
            .map(|(n, v)| (n.as_str(), v.as_tensor().clone()))
            .collect(),
    )?;
    let shape = |len: usize| match c.batch_first {
        true => (c.n, len, c.e),
        false => (len, c.n, c.e),
    };
    let q = Var::from_tensor(&to_run(&normal(0., 1., shape(c.l), DType::F32, &cpu, 21)?)?)?;
    let (k, v) = match c.self_attn {
        true => (q.clone(), q.clone()),
        false => (
            Var::from_tensor(&to_run(&normal(0., 1., shape(c.s), DType::F32, &cpu, 22)?)?)?,
            Var::from_tensor(&to_run(&normal(0., 1., shape(c.s), DType::F32, &cpu, 23)?)?)?,
        ),
    };
    let mut opts = AttentionOptions::new()
        .with_need_weights(false)
        .with_is_causal(matches!(c.mask, Mask::Causal))
        .with_kernel(kernel);
    if c.dropout > 0.0 {
        opts = opts.with_train(true).with_dropout_seed(99);
    }
    let (attn, kpm) = masks(c, c.h)?;
    if let Some(m) = attn {
        let m = match m.dtype() {
            DType::U8 => m.to_device(dev)?,
            _ => to_run(&m)?,
        };
        opts = opts.with_attn_mask(m);
    }
    if let Some(m) = kpm {
        opts = opts.with_key_padding_mask(m.to_device(dev)?);
    }
    let out = mha.forward(&q, &k, &v, &opts)?.output;
    let r = normal(0., 1., out.shape(), DType::F32, &cpu, 31)?.to_device(dev)?;
    let grads = (out.to_dtype(DType::F32)? * r)?.sum_all()?.backward()?;
    let host = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F64)?.to_device(&cpu)?) };
    let mut res = HashMap::from([("output".to_string(), host(&out)?)]);
    let inputs = [("query", &q), ("key", &k), ("value", &v)];
    let named = vars
        .iter()
        .map(|(n, v)| (n.as_str(), v))
        .chain(inputs.into_iter().take(if c.self_attn { 1 } else { 3 }));
    for (name, var) in named {
        let g = grads
            .get(var.as_tensor())
            .with_context(|| format!("no gradient for {name}"))?;
        res.insert(format!("grad.{name}"), host(g)?);
    }
    Ok(res)
}

/// Records every tensor of `expected` that `got` misses or differs from by more than `tol`,
/// and prints the worst relative error.
fn compare(
    what: &str,
    got: &HashMap<String, Tensor>,
    expected: &HashMap<String, Tensor>,
    tol: f64,
    failures: &mut Vec<String>,
) {
    let mut worst = (0f64, String::new());
    for (name, e) in expected {
        match got.get(name).map(|g| rel_err(g, e)) {
            None => failures.push(format!("{what}: {name} missing")),
            Some(Err(err)) => failures.push(format!("{what}: {name}: {err}")),
            Some(Ok(err)) => {
                if err > tol || err.is_nan() {
                    failures.push(format!(
                        "{what}: {name}: relative error {err:.3e} > {tol:.1e}"
                    ));
                }
                if err > worst.0 || err.is_nan() {
                    worst = (err, name.clone());
                }
            }
        }
    }
    println!("{what}: worst {:.2e} ({})", worst.0, worst.1);
}

/// Each case in f32, bf16 and f16 on CUDA against the CPU fused kernel in f32 on the same
/// rounded numbers (the same dropout mask), and in f32 against the CUDA reference path.
#[test]
fn fused_cuda_matches_the_cpu_kernel() -> Result<()> {
    let Some(gpu) = fused_gpu() else {
        return Ok(());
    };
    let mut failures = Vec::new();
    for c in cases() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let what = format!("{c:?} {dtype:?}");
            let cpu = run_case(&c, dtype, DType::F32, &Device::Cpu, AttentionKernel::Fused)?;
            let cuda = run_case(&c, dtype, dtype, &gpu, AttentionKernel::Fused)
                .with_context(|| what.clone())?;
            compare(&what, &cuda, &cpu, tolerance(dtype), &mut failures);
            if dtype == DType::F32 {
                let reference = run_case(&c, dtype, dtype, &gpu, AttentionKernel::Reference)?;
                compare(
                    &format!("{what} vs CUDA reference"),
                    &cuda,
                    &reference,
                    2e-5,
                    &mut failures,
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

/// Decoding one position at a time from the cache (L = 1 queries over a growing cache, the
/// fused kernel's causal offset) gives the full causal forward's outputs, in f32 and bf16,
/// with padded positions.
#[test]
fn fused_cuda_decoding_steps_match_the_full_forward() -> Result<()> {
    let Some(gpu) = fused_gpu() else {
        return Ok(());
    };
    let (n, t, e, h) = (2, 21, 64, 4);
    for dtype in [DType::F32, DType::BF16] {
        let varmap = candle_mha::candle_nn::VarMap::new();
        let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
        let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 4, dtype, &gpu))?;
        let x = normal(0., 1., (n, t, e), dtype, &gpu, 5)?;
        let pad: Vec<u8> = (0..n * t).map(|i| u8::from(i == t + 4)).collect();
        let pad = Tensor::from_vec(pad, (n, t), &gpu)?;
        let full = mha
            .forward(
                &x,
                &x,
                &x,
                &AttentionOptions::new()
                    .with_need_weights(false)
                    .with_is_causal(true)
                    .with_key_padding_mask(pad.clone()),
            )?
            .output;
        let mut cache = KvCache::new(&mha, n)?;
        let mut steps = Vec::new();
        for i in 0..t {
            let opts = IncrementalOptions::new()
                .with_key_padding_mask(pad.narrow(1, i, 1)?)
                .with_kernel(AttentionKernel::Fused);
            steps.push(
                mha.forward_incremental(&x.narrow(1, i, 1)?, &mut cache, &opts)?
                    .output,
            );
        }
        let inc = Tensor::cat(&steps, 1)?;
        let tol = if dtype == DType::F32 { 1e-4 } else { 3e-2 };
        assert_close(&format!("{dtype:?} decoding"), &inc, &full, tol)?;
    }
    Ok(())
}

/// An L = 16384 forward (N = 1, E = 1024, H = 16, bf16) takes memory linear in L: its peak
/// over what the inputs hold stays far under one `L × L` score matrix per head.
#[test]
fn fused_cuda_long_sequence_memory_is_linear() -> Result<()> {
    let Some(gpu) = fused_gpu() else {
        return Ok(());
    };
    use candle_mha::device::{peak_gpu_memory, reset_peak_gpu_memory};
    let (l, e, h) = (16384, 1024, 16);
    let varmap = candle_mha::candle_nn::VarMap::new();
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 0, DType::BF16, &gpu))?;
    let x = normal(0., 1., (1, l, e), DType::BF16, &gpu, 1)?;
    gpu.synchronize()?;
    if peak_gpu_memory(&gpu)?.is_none() {
        println!("skipped: this GPU has no memory pool statistics");
        return Ok(());
    }
    reset_peak_gpu_memory(&gpu)?;
    let opts = AttentionOptions::new().with_need_weights(false);
    let out = mha.forward(&x, &x, &x, &opts)?.output;
    gpu.synchronize()?;
    let peak = peak_gpu_memory(&gpu)?.unwrap_or(0);
    // The reference path holds the (H, L, L) scores: 16 GiB in f32.
    let two_heads_scores = (2 * l * l * 2) as u64;
    println!(
        "L = {l}: peak GPU memory {:.1} MiB (two heads' L×L scores in bf16: {:.0} MiB)",
        peak as f64 / 1048576.0,
        two_heads_scores as f64 / 1048576.0
    );
    assert!(peak < two_heads_scores, "peak {peak} bytes: an L×L buffer?");
    assert_eq!(out.dims(), &[1, l, e]);
    Ok(())
}

/// The fixture runner is shared with `cuda_parity`; this keeps the fixtures' f32 results on
/// the CPU equal whichever kernel runs (a sanity check that does not need a GPU).
#[test]
fn cpu_fixture_runs_agree_between_kernels() -> Result<()> {
    let f = Fixture::load(&fixture_paths()[0])?;
    let dtype = f.dtype()?;
    let a = run_fixture(&f, dtype, &Device::Cpu, Some(AttentionKernel::Fused))?;
    let b = run_fixture(&f, dtype, &Device::Cpu, Some(AttentionKernel::Reference))?;
    for (name, t) in &a {
        assert_close(name, t, &b[name], 1e-5)?;
    }
    Ok(())
}
