//! The fused kernel against the reference path: outputs, weights and gradients (of every
//! parameter and input, through the output and the weights) on random shapes, masks, options
//! and dtypes, dropout included (both paths draw the same mask). f32 within 1e-5, f64 within
//! 1e-12, relative to the largest reference value or 1, whichever is larger: a gradient that
//! is exactly zero in one path (a row with a single live key has a constant softmax) is
//! rounding noise in the other, and noise relative to zero is unbounded.

use candle_mha_test_support as common;

use anyhow::{bail, Result};
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::rng::{normal, rng_from_seed, uniform};
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, MultiheadAttention,
    MultiheadAttentionConfig,
};
use candle_nn::VarMap;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Inputs {
    /// query = key = value (one tensor: the packed projection).
    SelfAttn,
    /// key = value.
    KvSame,
    /// Three tensors.
    Cross,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum MaskKind {
    None,
    Bool2d,
    Bool3d,
    Float2d,
    Float3d,
}

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    n: usize,
    l: usize,
    s: usize,
    h: usize,
    d: usize,
    kdim: usize,
    vdim: usize,
    inputs: Inputs,
    batch_first: bool,
    unbatched: bool,
    bias: bool,
    add_bias_kv: bool,
    add_zero_attn: bool,
    attn_mask: MaskKind,
    /// 0: none, 1: bool, 2: float.
    key_padding: u8,
    causal: bool,
    need_weights: bool,
    average: bool,
    dropout: Option<f64>,
    dropout_seed: u64,
    head_mask: bool,
    dtype: DType,
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn random_case(seed: u64, dtype: DType) -> Case {
    let mut rng = rng_from_seed(seed);
    let inputs = pick(&mut rng, &[Inputs::SelfAttn, Inputs::KvSame, Inputs::Cross]);
    let (h, d) = (pick(&mut rng, &[1, 2, 4]), pick(&mut rng, &[1, 3, 8, 16]));
    let e = h * d;
    let l = pick(&mut rng, &[1, 2, 7, 33, 64, 65, 130, 200]);
    let s = match inputs {
        Inputs::SelfAttn => l,
        _ => pick(&mut rng, &[1, 5, 64, 129, 150]),
    };
    let (kdim, vdim) = match inputs {
        Inputs::Cross if rng.random_bool(0.4) => (e + 3, e + 1),
        _ => (e, e),
    };
    Case {
        seed,
        n: pick(&mut rng, &[1, 2, 3]),
        l,
        s,
        h,
        d,
        kdim,
        vdim,
        inputs,
        batch_first: rng.random_bool(0.5),
        unbatched: rng.random_bool(0.15),
        bias: rng.random_bool(0.8),
        add_bias_kv: rng.random_bool(0.25),
        add_zero_attn: rng.random_bool(0.25),
        attn_mask: pick(
            &mut rng,
            &[
                MaskKind::None,
                MaskKind::None,
                MaskKind::Bool2d,
                MaskKind::Bool3d,
                MaskKind::Float2d,
                MaskKind::Float3d,
            ],
        ),
        key_padding: pick(&mut rng, &[0, 0, 1, 2]),
        causal: rng.random_bool(0.3),
        need_weights: rng.random_bool(0.6),
        average: rng.random_bool(0.5),
        dropout: if rng.random_bool(0.3) {
            Some(pick(&mut rng, &[0.1, 0.5, 1.0]))
        } else {
            None
        },
        dropout_seed: seed + 40,
        head_mask: rng.random_bool(0.1),
        dtype,
    }
}

/// A u8 mask with about `p` of its entries set, and, when `full_row`, one row all set.
fn bool_mask(shape: &[usize], p: f64, seed: u64, full_row: bool) -> Result<Tensor> {
    let mut rng = rng_from_seed(seed);
    let cols = *shape.last().unwrap();
    let mut data: Vec<u8> = (0..shape.iter().product::<usize>())
        .map(|_| u8::from(rng.random_bool(p)))
        .collect();
    if full_row && !data.is_empty() {
        data[..cols].iter_mut().for_each(|x| *x = 1);
    }
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// A float mask: U(-2, 2) with about `p` of its entries `-inf`.
fn float_mask(shape: &[usize], p: f64, seed: u64, dtype: DType) -> Result<Tensor> {
    let vals = uniform(-2.0, 2.0, shape, DType::F64, &Device::Cpu, seed)?;
    let holes = bool_mask(shape, p, seed + 1, false)?;
    let inf = Tensor::full(f64::NEG_INFINITY, shape, &Device::Cpu)?;
    Ok(holes.where_cond(&inf, &vals)?.to_dtype(dtype)?)
}

struct Run {
    output: Tensor,
    weights: Option<Tensor>,
    grads: Vec<(String, Tensor)>,
}

fn run(case: &Case, kernel: AttentionKernel) -> Result<Run> {
    let (dev, dt) = (Device::Cpu, case.dtype);
    let e = case.h * case.d;
    let cfg = MultiheadAttentionConfig::new(e, case.h)
        .with_kdim(case.kdim)
        .with_vdim(case.vdim)
        .with_bias(case.bias)
        .with_add_bias_kv(case.add_bias_kv)
        .with_add_zero_attn(case.add_zero_attn)
        .with_batch_first(case.batch_first)
        .with_dropout(case.dropout.unwrap_or(0.0));
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, case.seed, dt, &dev))?;
    let shape = |len: usize, width: usize| -> Vec<usize> {
        match (case.unbatched, case.batch_first) {
            (true, _) => vec![len, width],
            (false, true) => vec![case.n, len, width],
            (false, false) => vec![len, case.n, width],
        }
    };
    let input = |len, width, seed| -> Result<Var> {
        Ok(Var::from_tensor(&normal(
            0.0,
            1.0,
            shape(len, width),
            dt,
            &dev,
            seed,
        )?)?)
    };
    let q = input(case.l, e, case.seed + 10)?;
    let (k, v) = match case.inputs {
        Inputs::SelfAttn => (q.clone(), q.clone()),
        Inputs::KvSame => {
            let k = input(case.s, case.kdim, case.seed + 11)?;
            (k.clone(), k)
        }
        Inputs::Cross => (
            input(case.s, case.kdim, case.seed + 11)?,
            input(case.s, case.vdim, case.seed + 12)?,
        ),
    };
    let n = if case.unbatched { 1 } else { case.n };
    let mut opts = AttentionOptions::new()
        .with_need_weights(case.need_weights)
        .with_average_attn_weights(case.average)
        .with_is_causal(case.causal)
        .with_kernel(kernel);
    let (l, s, h) = (case.l, case.s, case.h);
    let mask3 = if case.unbatched {
        vec![h, l, s]
    } else {
        vec![n * h, l, s]
    };
    let seed = case.seed;
    let mask = match case.attn_mask {
        MaskKind::None => None,
        MaskKind::Bool2d => Some(bool_mask(&[l, s], 0.3, seed + 20, true)?),
        MaskKind::Bool3d => Some(bool_mask(&mask3, 0.3, seed + 20, true)?),
        MaskKind::Float2d => Some(float_mask(&[l, s], 0.2, seed + 20, dt)?),
        MaskKind::Float3d => Some(float_mask(&mask3, 0.2, seed + 20, dt)?),
    };
    if let Some(m) = mask {
        opts = opts.with_attn_mask(m);
    }
    let kpm_shape = if case.unbatched { vec![s] } else { vec![n, s] };
    match case.key_padding {
        1 => opts = opts.with_key_padding_mask(bool_mask(&kpm_shape, 0.3, seed + 30, true)?),
        2 => opts = opts.with_key_padding_mask(float_mask(&kpm_shape, 0.3, seed + 30, dt)?),
        _ => {}
    }
    if case.dropout.is_some() {
        opts = opts.with_train(true).with_dropout_seed(case.dropout_seed);
    }
    if case.head_mask {
        let factors: Vec<f64> = (0..h).map(|i| (i % 3) as f64 * 0.5).collect();
        opts = opts.with_head_mask(Tensor::from_vec(factors, h, &dev)?.to_dtype(dt)?);
    }
    let out = mha.forward(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
    // A loss through the output and the weights.
    let r = normal(0.0, 1.0, out.output.shape(), dt, &dev, seed + 50)?;
    let mut loss = (&out.output * r)?.sum_all()?;
    if let Some(w) = &out.weights {
        let rw = normal(0.0, 1.0, w.shape(), dt, &dev, seed + 51)?;
        loss = (loss + (w * rw)?.sum_all()?)?;
    }
    let store = loss.backward()?;
    let mut grads = Vec::new();
    for (name, p) in mha.named_parameters() {
        match store.get(&p) {
            Some(g) => grads.push((name, g.clone())),
            None => grads.push((name, p.zeros_like()?)),
        }
    }
    for (name, x) in [("query", &q), ("key", &k), ("value", &v)] {
        let g = match store.get(x.as_tensor()) {
            Some(g) => g.clone(),
            None => x.zeros_like()?,
        };
        grads.push((name.to_string(), g));
    }
    Ok(Run {
        output: out.output,
        weights: out.weights,
        grads,
    })
}

/// max|a - b| / max(max|b|, 1).
fn rel_err(a: &Tensor, b: &Tensor) -> Result<f64> {
    let scale = b
        .abs()?
        .max_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok(common::rel_err(a, b)? * scale.max(1e-30) / scale.max(1.0))
}

/// Runs `case` on both kernels and returns the worst relative difference.
fn compare(case: &Case) -> Result<f64> {
    let fused = run(case, AttentionKernel::Fused)?;
    let reference = run(case, AttentionKernel::Reference)?;
    // need_weights only decides whether weights are returned: the same output to the bit.
    let flipped = Case {
        need_weights: !case.need_weights,
        ..case.clone()
    };
    let other = run(&flipped, AttentionKernel::Fused)?;
    if common::rel_err(&other.output, &fused.output)? != 0.0 {
        bail!("need_weights changed the fused output")
    }
    let mut worst = rel_err(&fused.output, &reference.output)?;
    match (&fused.weights, &reference.weights) {
        (Some(a), Some(b)) => worst = worst.max(rel_err(a, b)?),
        (None, None) => {}
        _ => bail!("weights presence differs"),
    }
    for ((name, a), (_, b)) in fused.grads.iter().zip(&reference.grads) {
        let err = rel_err(a, b).map_err(|e| anyhow::anyhow!("grad {name}: {e}"))?;
        if !err.is_finite() {
            bail!("grad {name} is not finite")
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

fn property(dtype: DType, cases: u64, tol: f64) -> Result<()> {
    let mut worst = (0.0, None);
    for seed in 0..cases {
        let case = random_case(1000 + seed, dtype);
        let err = compare(&case).map_err(|e| anyhow::anyhow!("{case:?}: {e}"))?;
        if err > tol {
            bail!("fused vs reference: relative difference {err:.3e} > {tol:.0e} in {case:?}")
        }
        if err > worst.0 {
            worst = (err, Some(case));
        }
    }
    println!(
        "{cases} random cases in {dtype:?}: worst relative difference {:.3e} ({:?})",
        worst.0, worst.1
    );
    Ok(())
}

#[test]
fn fused_matches_reference_f32() -> Result<()> {
    property(DType::F32, 120, 1e-5)
}

#[test]
fn fused_matches_reference_f64() -> Result<()> {
    property(DType::F64, 120, 1e-12)
}

#[test]
fn fused_matches_reference_in_half_precision() -> Result<()> {
    // The fused kernel runs half inputs in f32; the reference multiplies in the half type.
    for (dtype, tol) in [(DType::F16, 2e-2), (DType::BF16, 1e-1)] {
        for seed in 0..10 {
            let case = random_case(5000 + seed, dtype);
            let err = compare(&case).map_err(|e| anyhow::anyhow!("{case:?}: {e}"))?;
            if err > tol {
                bail!("{dtype:?}: relative difference {err:.3e} > {tol} in {case:?}")
            }
        }
    }
    Ok(())
}

/// A case with every option at once, over several tiles of queries and keys.
#[test]
fn fused_matches_reference_with_everything_on() -> Result<()> {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        for inputs in [Inputs::SelfAttn, Inputs::Cross] {
            let case = Case {
                seed: 7,
                n: 2,
                l: 150,
                s: if inputs == Inputs::SelfAttn { 150 } else { 200 },
                h: 2,
                d: 8,
                kdim: 16,
                vdim: 16,
                inputs,
                batch_first: true,
                unbatched: false,
                bias: true,
                add_bias_kv: true,
                add_zero_attn: true,
                attn_mask: MaskKind::Float3d,
                key_padding: 1,
                causal: false,
                need_weights: true,
                average: false,
                dropout: Some(0.3),
                dropout_seed: 47,
                head_mask: false,
                dtype,
            };
            let err = compare(&case)?;
            assert!(err <= tol, "{dtype:?} {inputs:?}: {err:.3e}");
            let causal = Case {
                attn_mask: MaskKind::None,
                causal: true,
                average: true,
                ..case
            };
            let err = compare(&causal)?;
            assert!(err <= tol, "{dtype:?} {inputs:?} causal: {err:.3e}");
        }
    }
    Ok(())
}

/// Dropout in the fused kernel: the same seed gives the same output and the same gradients
/// (the backward pass regenerates the mask), another seed another output.
#[test]
fn fused_dropout_is_reproducible_through_backward() -> Result<()> {
    let case = Case {
        dropout: Some(0.3),
        attn_mask: MaskKind::None,
        key_padding: 0,
        need_weights: false,
        ..random_case(42, DType::F32)
    };
    let a = run(&case, AttentionKernel::Fused)?;
    let b = run(&case, AttentionKernel::Fused)?;
    assert_eq!(common::rel_err(&a.output, &b.output)?, 0.0);
    for ((name, ga), (_, gb)) in a.grads.iter().zip(&b.grads) {
        assert_eq!(common::rel_err(ga, gb)?, 0.0, "gradient of {name}");
    }
    let other = run(
        &Case {
            dropout_seed: case.dropout_seed + 1,
            ..case.clone()
        },
        AttentionKernel::Fused,
    )?;
    assert!(common::rel_err(&other.output, &a.output)? > 1e-3);
    Ok(())
}

/// Arguments no variable leads to get no gradient, and the others the same bits as when
/// every argument is a variable: packed self-attention with and without weights (the loss
/// goes through both), batch-first, f32 and f64. First the input is data (not a variable),
/// then the in-projection is frozen (plain tensors), then the out-projection, then data
/// input and a frozen in-projection (no gradient reaches the attention op at all).
#[test]
fn frozen_arguments_get_no_gradient_and_change_no_other() -> Result<()> {
    for dtype in [DType::F32, DType::F64] {
        let (n, l, e, h) = (2, 40, 16, 2);
        let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
        let varmap = VarMap::new();
        let mha = MultiheadAttention::new(
            cfg.clone(),
            seeded_var_builder(&varmap, 3, dtype, &Device::Cpu),
        )?;
        let params = mha.named_parameters();
        let x0 = normal(0.0, 1.0, (n, l, e), dtype, &Device::Cpu, 5)?;
        let opts = AttentionOptions::new().with_train(true);
        // (x is a variable, frozen parameter prefix or "")
        let run = |x_var: bool, frozen: &str| -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
            let tensors: Vec<(&str, Tensor)> = params
                .iter()
                .map(|(name, t)| {
                    let t = match name.starts_with(frozen) && !frozen.is_empty() {
                        true => t.detach().copy()?,
                        false => Var::from_tensor(t)?.as_tensor().clone(),
                    };
                    Ok((name.as_str(), t))
                })
                .collect::<Result<_>>()?;
            let handles: Vec<Tensor> = tensors.iter().map(|(_, t)| t.clone()).collect();
            let module = MultiheadAttention::from_tensors(cfg.clone(), tensors)?;
            let x = match x_var {
                true => Var::from_tensor(&x0)?.as_tensor().clone(),
                false => x0.clone(),
            };
            let out = module.forward(&x, &x, &x, &opts)?;
            let weights = out.weights.expect("weights");
            let loss = (out.output.sqr()?.sum_all()? + (weights.sqr()?.sum_all()? * 10.0)?)?;
            let grads = loss.backward()?;
            let of = |t: &Tensor| grads.get(t).cloned();
            Ok((handles.iter().map(of).collect(), of(&x)))
        };
        let (all, dx) = run(true, "")?;
        assert!(dx.is_some(), "{dtype:?}: a variable input has a gradient");
        assert!(
            all.iter().all(Option::is_some),
            "{dtype:?}: every parameter has one"
        );
        let cases = [
            (false, ""),
            (true, "in_proj"),
            (true, "out_proj"),
            (false, "in_proj"),
        ];
        for (x_var, frozen) in cases {
            let (got, got_dx) = run(x_var, frozen)?;
            assert_eq!(
                got_dx.is_some(),
                x_var,
                "{dtype:?} {frozen}: input gradient"
            );
            if let (Some(a), Some(b)) = (&got_dx, &dx) {
                assert_eq!(
                    common::rel_err(a, b)?,
                    0.0,
                    "{dtype:?} {frozen}: input gradient"
                );
            }
            for ((name, _), (g, want)) in params.iter().zip(got.iter().zip(&all)) {
                let is_frozen = !frozen.is_empty() && name.starts_with(frozen);
                match (g, is_frozen) {
                    (None, true) => {}
                    (Some(g), false) => {
                        let want = want.as_ref().expect("checked above");
                        assert_eq!(common::rel_err(g, want)?, 0.0, "{dtype:?} {frozen}: {name}");
                    }
                    (g, _) => bail!(
                        "{dtype:?} {frozen}: {name} frozen {is_frozen}, gradient {}",
                        g.is_some()
                    ),
                }
            }
        }
    }
    Ok(())
}

/// One forward call's graph, backed up twice (two losses on the same output), gives the
/// same gradients twice; a loss on the weights alone gives the reference path's gradients
/// (the output projection's backward pass, which hands the context's gradient to the
/// attention's, does not run then). Packed self-attention, f32 and f64.
#[test]
fn repeated_and_weights_only_backward() -> Result<()> {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let (n, l, e, h) = (2, 70, 16, 4);
        let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
        let varmap = VarMap::new();
        let mha =
            MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 9, dtype, &Device::Cpu))?;
        let x = Var::from_tensor(&normal(0.0, 1.0, (n, l, e), dtype, &Device::Cpu, 4)?)?;
        let params: Vec<Tensor> = mha.named_parameters().into_iter().map(|(_, t)| t).collect();
        let all = |store: &candle_mha::candle::backprop::GradStore| -> Result<Vec<Tensor>> {
            params
                .iter()
                .chain([x.as_tensor()])
                .map(|t| match store.get(t) {
                    Some(g) => Ok(g.clone()),
                    None => Ok(t.zeros_like()?),
                })
                .collect()
        };
        let opts = AttentionOptions::new();
        let out = mha.forward(&x, &x, &x, &opts)?;
        let loss = out.output.sqr()?.sum_all()?;
        let (a, b) = (all(&loss.backward()?)?, all(&loss.backward()?)?);
        for (ga, gb) in a.iter().zip(&b) {
            assert_eq!(common::rel_err(ga, gb)?, 0.0, "{dtype:?}: second backward");
        }
        let weights_only = |kernel| -> Result<Vec<Tensor>> {
            let out = mha.forward(&x, &x, &x, &opts.clone().with_kernel(kernel))?;
            let w = out.weights.expect("weights");
            let r = normal(0.0, 1.0, w.shape(), dtype, &Device::Cpu, 6)?;
            all(&(w * r)?.sum_all()?.backward()?)
        };
        let fused = weights_only(AttentionKernel::Fused)?;
        let reference = weights_only(AttentionKernel::Reference)?;
        for (i, (f, r)) in fused.iter().zip(&reference).enumerate() {
            let err = common::rel_err(f, r)?;
            assert!(
                err <= tol,
                "{dtype:?}: weights-only gradient {i}: {err:.3e}"
            );
        }
        // The output projection gets no gradient from the weights.
        let out_w = mha.out_proj().weight();
        let g = &fused[params
            .iter()
            .position(|p| p.id() == out_w.id())
            .expect("out_proj")];
        assert_eq!(
            g.abs()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?,
            0.0
        );
    }
    Ok(())
}
