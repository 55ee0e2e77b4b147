//! The fused CPU ops keep their large scratch buffers in a pool between calls
//! (`candle_mha::runtime::workspace_bytes`, `release_workspace`). A reused buffer comes back with
//! whatever its last call left in it, so these tests fill the pool with NaNs (calls on
//! non-finite inputs) and check that later calls give, to the bit, what they give on fresh
//! buffers (an emptied pool): calls of growing and shrinking shapes in f32 and f64, two
//! modules on two threads at once, and a call that fails half-way followed by a good one;
//! forward, forward with weights (per head and averaged) and the gradients of a training
//! step (every parameter and the input).

use std::sync::Mutex;

use anyhow::{ensure, Result};
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::rng::normal;
use candle_mha::runtime::{release_workspace, workspace_bytes};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::VarMap;

/// The pool is process-wide and the test harness runs tests on several threads: tests that
/// need a fresh pool (an emptied one) hold this while they empty it and compute.
static FRESH: Mutex<()> = Mutex::new(());

fn fresh_lock() -> std::sync::MutexGuard<'static, ()> {
    FRESH.lock().unwrap_or_else(|e| e.into_inner())
}

/// One call pattern: `(N, L, E, H)`, dtype, batch_first, self-attention (else cross with a
/// key/value of `S = L + 3`).
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: (usize, usize, usize, usize),
    dtype: DType,
    batch_first: bool,
    self_attn: bool,
    seed: u64,
}

struct Setup {
    mha: MultiheadAttention,
    _vars: VarMap,
    q: Var,
    kv: Var,
    r: Tensor,
}

fn setup(c: Case) -> Result<Setup> {
    let (n, l, e, h) = c.shape;
    let dev = Device::Cpu;
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(c.batch_first);
    let vars = VarMap::new();
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&vars, c.seed, c.dtype, &dev))?;
    let s = if c.self_attn { l } else { l + 3 };
    let dims = |len: usize| {
        if c.batch_first {
            (n, len, e)
        } else {
            (len, n, e)
        }
    };
    let q = Var::from_tensor(&normal(0.0, 1.0, dims(l), c.dtype, &dev, c.seed + 1)?)?;
    let kv = Var::from_tensor(&normal(0.0, 1.0, dims(s), c.dtype, &dev, c.seed + 2)?)?;
    let r = normal(0.0, 1.0, dims(l), c.dtype, &dev, c.seed + 3)?;
    Ok(Setup {
        mha,
        _vars: vars,
        q,
        kv,
        r,
    })
}

/// The bits of a tensor (as f64: exact for f32).
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(t.to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?
        .into_iter()
        .map(f64::to_bits)
        .collect())
}

/// Every result of the case: forward without weights, with per-head and averaged weights,
/// and the step's gradients (input(s) and every parameter).
fn results(s: &Setup, self_attn: bool) -> Result<Vec<Vec<u64>>> {
    let (q, kv) = (s.q.as_tensor(), s.kv.as_tensor());
    let kv = if self_attn { q } else { kv };
    let mut out = Vec::new();
    let nw = AttentionOptions::new().with_need_weights(false);
    out.push(bits(&s.mha.forward(q, kv, kv, &nw)?.output)?);
    for average in [false, true] {
        let opts = AttentionOptions::new().with_average_attn_weights(average);
        let o = s.mha.forward(q, kv, kv, &opts)?;
        out.push(bits(&o.output)?);
        out.push(bits(&o.weights.expect("weights asked for"))?);
    }
    let y = s.mha.forward(q, kv, kv, &nw.with_train(true))?.output;
    let grads = candle_mha::autograd::backward_with(&y, &s.r)?;
    let mut wrt: Vec<Tensor> = vec![q.clone()];
    if !self_attn {
        wrt.push(kv.clone());
    }
    wrt.extend(s.mha.named_parameters().into_iter().map(|(_, t)| t));
    for t in &wrt {
        match grads.get(t) {
            Some(g) => out.push(bits(g)?),
            None => out.push(Vec::new()),
        }
    }
    Ok(out)
}

/// The results on fresh buffers: the pool emptied before the call.
fn fresh(c: Case) -> Result<Vec<Vec<u64>>> {
    let s = setup(c)?;
    release_workspace();
    results(&s, c.self_attn)
}

/// Fills the pool with NaN-filled buffers of the case's sizes: the same calls on an input
/// of NaNs (and a NaN output gradient).
fn poison(c: Case) -> Result<()> {
    let s = setup(c)?;
    let nan = |t: &Tensor| -> Result<Var> { Ok(Var::from_tensor(&(t.ones_like()? * f64::NAN)?)?) };
    let bad = Setup {
        q: nan(s.q.as_tensor())?,
        kv: nan(s.kv.as_tensor())?,
        r: (s.r.ones_like()? * f64::NAN)?,
        ..s
    };
    let r = results(&bad, c.self_attn)?;
    ensure!(
        r.iter()
            .any(|v| v.iter().any(|b| f64::from_bits(*b).is_nan())),
        "the poisoning call gave no NaN"
    );
    Ok(())
}

fn same(what: &str, c: Case, got: &[Vec<u64>], want: &[Vec<u64>]) -> Result<()> {
    ensure!(
        got.len() == want.len(),
        "{what} {c:?}: result counts differ"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            g == w,
            "{what} {c:?}: result {i} differs from fresh buffers"
        );
    }
    Ok(())
}

fn case(shape: (usize, usize, usize, usize), dtype: DType, batch_first: bool) -> Case {
    Case {
        shape,
        dtype,
        batch_first,
        self_attn: true,
        seed: 7,
    }
}

/// Growing, shrinking, f32 and f64, both layouts, self and cross attention: each call on a
/// pool that earlier calls (and NaN calls of the largest sizes) left full gives what it
/// gives on fresh buffers.
#[test]
fn changing_shapes_match_fresh_buffers() -> Result<()> {
    let _fresh = fresh_lock();
    let mut cases = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        cases.extend([
            case((2, 16, 32, 4), dtype, true),
            case((3, 70, 48, 4), dtype, false),
            case((1, 9, 16, 2), dtype, true),
            case((2, 130, 64, 8), dtype, true),
            case((4, 33, 32, 2), dtype, false),
        ]);
    }
    let cross = Case {
        self_attn: false,
        seed: 11,
        ..case((2, 40, 32, 4), DType::F32, true)
    };
    cases.push(cross);
    let want: Vec<_> = cases.iter().map(|&c| fresh(c)).collect::<Result<_>>()?;
    // The largest sizes first, then every case, then again in reverse (shrinking after
    // growing), with NaN calls in between.
    for &c in cases.iter().filter(|c| c.shape.1 >= 70) {
        poison(c)?;
    }
    ensure!(workspace_bytes() > 0, "the calls left nothing in the pool");
    for (i, &c) in cases.iter().enumerate() {
        same(
            "growing/shrinking",
            c,
            &results(&setup(c)?, c.self_attn)?,
            &want[i],
        )?;
    }
    for (i, &c) in cases.iter().enumerate().rev() {
        poison(c)?;
        same(
            "after NaN call",
            c,
            &results(&setup(c)?, c.self_attn)?,
            &want[i],
        )?;
    }
    Ok(())
}

/// Two modules called from two threads at once, repeatedly, with NaN calls in between on a
/// third: each call gives what it gives alone on fresh buffers.
#[test]
fn two_modules_two_threads() -> Result<()> {
    let _fresh = fresh_lock();
    let a = Case {
        seed: 21,
        ..case((4, 64, 64, 8), DType::F32, true)
    };
    let b = Case {
        seed: 22,
        ..case((2, 96, 32, 4), DType::F64, false)
    };
    let c = Case {
        seed: 23,
        ..case((3, 50, 64, 4), DType::F32, false)
    };
    let want = [fresh(a)?, fresh(b)?, fresh(c)?];
    let run = |k: usize, case: Case| -> Result<()> {
        let s = setup(case)?;
        for _ in 0..4 {
            same("threads", case, &results(&s, true)?, &want[k])?;
        }
        Ok(())
    };
    std::thread::scope(|scope| -> Result<()> {
        let ta = scope.spawn(|| run(0, a));
        let tb = scope.spawn(|| run(1, b));
        let tc = scope.spawn(|| -> Result<()> {
            for _ in 0..3 {
                poison(a)?;
                poison(b)?;
                poison(c)?;
            }
            run(2, c)
        });
        for t in [ta, tb, tc] {
            t.join().expect("thread panicked")?;
        }
        Ok(())
    })
}

/// A step that fails half-way (the forward pass took and filled its buffers, the backward
/// pass is refused), and a graph dropped without a backward pass, followed by good calls:
/// the good calls give what they give on fresh buffers, and emptying the pool is safe while
/// a graph still holds a buffer.
#[test]
fn failed_step_then_good_step() -> Result<()> {
    let _fresh = fresh_lock();
    let c = case((2, 48, 32, 4), DType::F32, true);
    let want = fresh(c)?;
    let s = setup(c)?;
    let q = s.q.as_tensor();
    let train = AttentionOptions::new()
        .with_need_weights(false)
        .with_train(true);
    // A wrong-shaped output gradient: refused after the forward pass.
    let y = s.mha.forward(q, q, q, &train)?.output;
    let wrong = Tensor::zeros((1, 2, 3), DType::F32, &Device::Cpu)?;
    ensure!(candle_mha::autograd::backward_with(&y, &wrong).is_err());
    // A module call refused on a bad mask after a graph holds its buffer.
    let held = s.mha.forward(q, q, q, &train)?.output;
    let bad_mask =
        AttentionOptions::new().with_attn_mask(Tensor::zeros((5, 5), DType::F32, &Device::Cpu)?);
    ensure!(s.mha.forward(q, q, q, &bad_mask).is_err());
    release_workspace();
    drop((y, held));
    same("after a failed step", c, &results(&s, true)?, &want)?;
    Ok(())
}

/// The pool is bounded and emptied on request.
#[test]
fn release_empties_the_pool() -> Result<()> {
    let _fresh = fresh_lock();
    let c = case((2, 64, 64, 8), DType::F64, true);
    let s = setup(c)?;
    results(&s, true)?;
    let held = workspace_bytes();
    // A step holds the packed projection and its gradient: N·L·3E elements each.
    ensure!(held >= 2 * 64 * 3 * 64 * 8, "pool holds {held} bytes");
    let freed = release_workspace();
    ensure!(freed >= held && workspace_bytes() == 0);
    Ok(())
}

/// The model's step (its attention and linear+GELU ops take pooled buffers): gradients on a
/// pool left full of NaNs by a larger model's step equal those on fresh buffers.
#[test]
fn model_step_matches_fresh_buffers() -> Result<()> {
    use candle_mha_train::models::{
        masked_cross_entropy, NextTokenPredictor, NextTokenPredictorConfig,
    };
    let _fresh = fresh_lock();
    let dev = Device::Cpu;
    let step = |cfg: &NextTokenPredictorConfig, n: usize, l: usize, nan: bool| -> Result<_> {
        let vars = VarMap::new();
        let m =
            NextTokenPredictor::new(cfg.clone(), seeded_var_builder(&vars, 3, DType::F32, &dev))?;
        if nan {
            for v in vars.all_vars() {
                v.set(&(v.ones_like()? * f64::NAN)?)?;
            }
        }
        let ids: Vec<u32> = (0..n * l)
            .map(|i| (i * 7 % cfg.vocab_size) as u32)
            .collect();
        let tokens = Tensor::from_vec(ids, (n, l), &dev)?;
        let targets = tokens.roll(-1, 1)?;
        let mask = Tensor::ones((n, l), DType::F32, &dev)?;
        let logits = m.forward_train(&tokens, None, 5)?;
        let grads = masked_cross_entropy(&logits, &targets, &mask)?.backward()?;
        let mut named: Vec<_> = vars.data().lock().unwrap().clone().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
            .iter()
            .map(|(_, v)| grads.get(v).map_or(Ok(Vec::new()), bits))
            .collect::<Result<Vec<_>>>()
    };
    let small = NextTokenPredictorConfig::new(40);
    let large = NextTokenPredictorConfig {
        ff_dim: 512,
        ..NextTokenPredictorConfig::new(40)
    };
    release_workspace();
    let want = step(&small, 3, 20, false)?;
    step(&large, 4, 48, true)?;
    ensure!(
        workspace_bytes() > 0,
        "the model's step left nothing in the pool"
    );
    ensure!(
        step(&small, 3, 20, false)? == want,
        "model gradients differ from fresh buffers"
    );
    Ok(())
}
