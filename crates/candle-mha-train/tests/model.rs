//! `NextTokenPredictor`, its loss and one clipped AdamW step against PyTorch
//! (`scripts/reference_model.py`, fixtures by `scripts/make_model_fixtures.py`).

use candle_mha_test_support as common;

use anyhow::{Context, Result};
use candle_mha::candle::backprop::GradStore;
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::checkpoint::{load_into_varmap, LoadOptions, StateDict};
use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
use candle_mha::{seeded_var_builder, AttentionKernel};
use candle_mha_train::models::{
    masked_cross_entropy, NextTokenPredictor, NextTokenPredictorConfig,
};
use candle_nn::VarMap;
use common::{assert_close, Fixture};

fn fixture(name: &str) -> Result<Fixture> {
    Fixture::load(&common::fixtures_dir().join("model").join(name))
}

fn meta_f64(f: &Fixture, key: &str) -> Result<f64> {
    f.str(key).parse().with_context(|| key.to_string())
}

/// The fixture's model, loaded strictly into a fresh VarMap.
fn model(f: &Fixture) -> Result<(NextTokenPredictor, VarMap)> {
    let cfg = NextTokenPredictorConfig {
        vocab_size: f.usize("vocab_size")?,
        max_len: f.usize("max_len")?,
        embed_dim: f.usize("embed_dim")?,
        num_heads: f.usize("num_heads")?,
        num_layers: f.usize("num_layers")?,
        ff_dim: f.usize("ff_dim")?,
        dropout: 0.0,
        resid_dropout: 0.0,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    let m = NextTokenPredictor::new(
        cfg,
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    let report = load_into_varmap(
        &varmap,
        &StateDict::from_tensors(f.params()),
        &LoadOptions::new(),
    )?;
    assert_eq!(report.loaded.len(), 30, "{report}");
    Ok((m, varmap))
}

/// The gradient of `var` (the parameter `name`) in `grads`, checked against the fixture's
/// `grad.<name>`.
fn checked_grad<'a>(
    f: &Fixture,
    grads: &'a GradStore,
    name: &str,
    var: &Var,
) -> Result<&'a Tensor> {
    let g = grads
        .get(var.as_tensor())
        .with_context(|| format!("no gradient for {name}"))?;
    assert_close(
        &format!("grad.{name}"),
        g,
        f.tensor(&format!("grad.{name}"))?,
        2e-5,
    )?;
    Ok(g)
}

/// `train_loss` (the head and the loss as one op, what the trainer runs) against PyTorch's
/// loss and gradients, and bit for bit against `forward_train` + `masked_cross_entropy`.
#[test]
fn the_training_loss_matches_pytorch_and_the_two_step_path() -> Result<()> {
    let f = fixture("next_token.safetensors")?;
    let (m, varmap) = model(&f)?;
    let tokens = f.tensor("tokens")?.to_dtype(DType::U32)?;
    let kpm = f.tensor("key_padding_mask")?;
    let targets = f.tensor("targets")?.to_dtype(DType::U32)?;
    let mask = f.tensor("loss_mask")?;
    let loss = m.train_loss(&tokens, Some(kpm), (7, 0), &targets, mask)?;
    assert_close("loss", &loss, f.tensor("loss")?, 2e-6)?;
    let two_step = masked_cross_entropy(&m.forward_train(&tokens, Some(kpm), 7)?, &targets, mask)?;
    let bits = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
    assert_eq!(bits(&loss.reshape(1)?)?, bits(&two_step.reshape(1)?)?);
    let (grads, grads_two) = (loss.backward()?, two_step.backward()?);
    let data = varmap.data().lock().unwrap();
    assert_eq!(data.len(), 30);
    for (name, var) in data.iter() {
        let g = checked_grad(&f, &grads, name, var)?;
        assert_eq!(
            bits(g)?,
            bits(grads_two.get(var.as_tensor()).unwrap())?,
            "{name}"
        );
    }
    Ok(())
}

#[test]
fn logits_loss_gradients_and_one_clipped_adamw_step_match_pytorch() -> Result<()> {
    let f = fixture("next_token.safetensors")?;
    let (m, varmap) = model(&f)?;
    let tokens = f.tensor("tokens")?.to_dtype(DType::U32)?;
    let kpm = f.tensor("key_padding_mask")?;
    let logits = m.forward(&tokens, Some(kpm))?;
    assert_close("logits", &logits, f.tensor("logits")?, 2e-5)?;
    let loss = masked_cross_entropy(
        &logits,
        &f.tensor("targets")?.to_dtype(DType::U32)?,
        f.tensor("loss_mask")?,
    )?;
    assert_close("loss", &loss, f.tensor("loss")?, 2e-6)?;

    let mut grads = loss.backward()?;
    let mut opt = AdamW::from_varmap(
        &varmap,
        AdamWConfig {
            lr: meta_f64(&f, "lr")?,
            beta1: meta_f64(&f, "beta1")?,
            beta2: meta_f64(&f, "beta2")?,
            eps: meta_f64(&f, "eps")?,
            weight_decay: meta_f64(&f, "weight_decay")?,
        },
    )?;
    let names: Vec<String> = {
        let data = varmap.data().lock().unwrap();
        let mut n: Vec<String> = data.keys().cloned().collect();
        n.sort();
        n
    };
    let var = |name: &str| -> Var { varmap.data().lock().unwrap()[name].clone() };
    for name in &names {
        checked_grad(&f, &grads, name, &var(name))?;
    }
    let norm = clip_grad_norm(&mut grads, &opt.vars(), meta_f64(&f, "clip_max_norm")?)?;
    let expected_norm = f.tensor("grad_norm")?.to_scalar::<f32>()? as f64;
    assert!(
        (norm - expected_norm).abs() < 1e-5 * expected_norm,
        "{norm} vs {expected_norm}"
    );
    opt.step(&grads)?;
    let state = opt.state_dict()?;
    let e = f.usize("embed_dim")?;
    for name in &names {
        let (ours, theirs) = (
            var(name).as_tensor().clone(),
            f.tensor(&format!("updated.{name}"))?.clone(),
        );
        if name.ends_with("attn.in_proj_bias") {
            // The key bias cannot change any softmax (it adds the same score to a whole row):
            // its gradient is rounding noise (~1e-9) on both sides, and Adam's first step
            // turns noise into ±lr. Compare q and v exactly; bound the k block by one step.
            for block in [0, 2] {
                let what = format!("updated.{name}[{block}]");
                assert_close(
                    &what,
                    &ours.narrow(0, block * e, e)?,
                    &theirs.narrow(0, block * e, e)?,
                    2e-6,
                )?;
            }
            let lr = meta_f64(&f, "lr")?;
            let before = f.tensor(&format!("param.{name}"))?.narrow(0, e, e)?;
            let step =
                (ours.narrow(0, e, e)? - (before * (1.0 - lr * meta_f64(&f, "weight_decay")?))?)?;
            let max = step.abs()?.max(0)?.to_scalar::<f32>()? as f64;
            assert!(max <= lr * 1.001, "{name}: key-bias step {max}");
            continue;
        }
        assert_close(&format!("updated.{name}"), &ours, &theirs, 2e-6)?;
        for moment in ["exp_avg", "exp_avg_sq"] {
            let key = format!("{moment}.{name}");
            assert_close(&key, state.get(&key).unwrap(), f.tensor(&key)?, 2e-5)?;
        }
    }
    Ok(())
}

/// Six AdamW steps on the fixture's parameters in `dtype` against PyTorch (f32).
/// `with_attention_kernel`: the whole model on either attention kernel equals PyTorch.
#[test]
fn both_attention_kernels_match_pytorch_on_the_whole_model() -> Result<()> {
    let f = fixture("next_token.safetensors")?;
    let tokens = f.tensor("tokens")?.to_dtype(DType::U32)?;
    let kpm = f.tensor("key_padding_mask")?;
    for kernel in [AttentionKernel::Reference, AttentionKernel::Fused] {
        let (m, _varmap) = model(&f)?;
        let m = m.with_attention_kernel(kernel);
        assert_eq!(m.attention_kernel(), kernel);
        let logits = m.forward(&tokens, Some(kpm))?;
        assert_close(
            &format!("logits {kernel:?}"),
            &logits,
            f.tensor("logits")?,
            2e-5,
        )?;
    }
    Ok(())
}

fn adamw_six_steps(dtype: DType, tol_param: f64, tol_state: f64) -> Result<()> {
    let f = fixture("adamw.safetensors")?;
    let p0 = Var::from_tensor(&f.tensor("init.p0")?.to_dtype(dtype)?)?;
    let p1 = Var::from_tensor(&f.tensor("init.p1")?.to_dtype(dtype)?)?;
    let cfg = AdamWConfig {
        lr: meta_f64(&f, "base_lr")?,
        beta1: meta_f64(&f, "beta1")?,
        beta2: meta_f64(&f, "beta2")?,
        eps: meta_f64(&f, "eps")?,
        weight_decay: meta_f64(&f, "weight_decay")?,
    };
    let mut opt = AdamW::new(
        vec![("p0".into(), p0.clone()), ("p1".into(), p1.clone())],
        cfg,
    )?;
    for t in 0..f.usize("steps")? {
        // A GradStore holding exactly the stored gradients: d(sum(p * g))/dp = g.
        let g0 = f.tensor(&format!("grad.t{t}.p0"))?.to_dtype(dtype)?;
        let g1 = f.tensor(&format!("grad.t{t}.p1"))?.to_dtype(dtype)?;
        let loss = ((p0.as_tensor() * g0)?.sum_all()? + (p1.as_tensor() * g1)?.sum_all()?)?;
        let grads = loss.backward()?;
        opt.set_lr(f.tensor(&format!("lr.t{t}"))?.to_scalar::<f64>()?);
        opt.step(&grads)?;
        for (name, p) in [("p0", &p0), ("p1", &p1)] {
            let key = format!("after.t{t}.{name}");
            let got = p.as_tensor().to_dtype(DType::F32)?;
            assert_close(
                &format!("{dtype:?} {key}"),
                &got,
                f.tensor(&key)?,
                tol_param,
            )?;
        }
    }
    let state = opt.state_dict()?;
    for key in ["exp_avg.p0", "exp_avg.p1", "exp_avg_sq.p0", "exp_avg_sq.p1"] {
        let got = state.get(key).unwrap().to_dtype(DType::F32)?;
        assert_close(&format!("{dtype:?} {key}"), &got, f.tensor(key)?, tol_state)?;
    }
    Ok(())
}

/// f32 and f64 run the optimizer's one-pass CPU loop.
#[test]
fn adamw_six_steps_with_varying_lr_match_pytorch() -> Result<()> {
    adamw_six_steps(DType::F32, 1e-6, 1e-5)?;
    adamw_six_steps(DType::F64, 1e-6, 1e-5)
}

/// f16 takes the tensor-op path (the one other devices take): the same update at f16's
/// precision.
#[test]
fn adamw_tensor_path_matches_pytorch_at_half_precision() -> Result<()> {
    adamw_six_steps(DType::F16, 2e-3, 2e-3)
}

#[test]
fn optimizer_state_round_trips() -> Result<()> {
    let p = Var::from_tensor(&Tensor::new(&[1f32, -2., 3.], &Device::Cpu)?)?;
    let mut a = AdamW::new(vec![("w".into(), p.clone())], AdamWConfig::default())?;
    let grads = (p.as_tensor().sqr()?.sum_all()?).backward()?;
    a.step(&grads)?;
    let saved = a.state_dict()?;
    let q = Var::from_tensor(p.as_tensor())?;
    let mut b = AdamW::new(vec![("w".into(), q.clone())], AdamWConfig::default())?;
    b.load_state_dict(&saved)?;
    let (ga, gb) = (
        (p.as_tensor().sqr()?.sum_all()?).backward()?,
        (q.as_tensor().sqr()?.sum_all()?).backward()?,
    );
    a.step(&ga)?;
    b.step(&gb)?;
    assert_eq!(
        p.as_tensor().to_vec1::<f32>()?,
        q.as_tensor().to_vec1::<f32>()?
    );
    // A state for another parameter set is an error, not a panic.
    let mut c = AdamW::new(vec![("other".into(), q)], AdamWConfig::default())?;
    assert!(c
        .load_state_dict(&saved)
        .unwrap_err()
        .to_string()
        .contains("optimizer state has no step.other"));
    Ok(())
}

#[test]
fn bad_tokens_are_errors() -> Result<()> {
    let f = fixture("next_token.safetensors")?;
    let (m, _) = model(&f)?;
    let dev = Device::Cpu;
    let too_long = Tensor::zeros((1, 9), DType::U32, &dev)?;
    assert!(m
        .forward(&too_long, None)
        .unwrap_err()
        .to_string()
        .contains("longer than the model's context (max_len = 8)"));
    let out_of_vocab = Tensor::new(&[[1u32, 11]], &dev)?;
    assert!(m
        .forward(&out_of_vocab, None)
        .unwrap_err()
        .to_string()
        .contains("token ids must be in [0, 11)"));
    let floats = Tensor::zeros((1, 3), DType::F32, &dev)?;
    assert!(m
        .forward(&floats, None)
        .unwrap_err()
        .to_string()
        .contains("u32 or i64"));
    Ok(())
}

/// A training loop must not keep earlier steps alive: candle leaves a variable's gradient
/// attached to the forward graph, so clipped gradients and AdamW's moments built from it
/// without detaching chained every step's activations onto the next (the medium `train_step`
/// bench grew by ~300 MB of RSS per step).
#[test]
fn clipped_gradients_and_optimizer_state_hold_no_graph() -> Result<()> {
    let f = fixture("next_token.safetensors")?;
    let (m, varmap) = model(&f)?;
    let mut opt = AdamW::from_varmap(&varmap, AdamWConfig::default())?;
    let vars = opt.vars();
    let tokens = f.tensor("tokens")?.to_dtype(DType::U32)?;
    let targets = f.tensor("targets")?.to_dtype(DType::U32)?;
    let mask = f.tensor("loss_mask")?;
    for step in 0..2 {
        let logits = m.forward_train(&tokens, None, step)?;
        let loss = masked_cross_entropy(&logits, &targets, mask)?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, &vars, 0.5)?;
        for v in &vars {
            let g = grads
                .get(v.as_tensor())
                .context("a variable has no gradient")?;
            assert!(
                !g.track_op(),
                "step {step}: a clipped gradient holds its graph"
            );
        }
        opt.step(&grads)?;
        for (name, t) in opt.state_dict()?.tensors() {
            assert!(
                !t.track_op(),
                "step {step}: optimizer state {name} holds a graph"
            );
        }
    }
    Ok(())
}

/// One set of weights evaluated in f32, f16 and bf16 gives the same loss to the dtype's
/// rounding: the loss, the layer norms and the softmax accumulate in f32 for the half types
/// (summed in bf16, a batch's 2 048 log-probabilities of about 4 lost most of their value).
#[test]
fn evaluation_agrees_across_dtypes() -> Result<()> {
    use candle_mha_train::data::{Dataset, Example};
    use candle_mha_train::evaluate;
    let dev = Device::Cpu;
    let (vocab, len) = (64u32, 33usize);
    // Every position counts: pseudo-random tokens.
    let examples = (0..128u32)
        .map(|e| {
            Example::full(
                (0..len as u32)
                    .map(|i| (e * 31 + i * i * 7 + i) % vocab)
                    .collect(),
            )
        })
        .collect();
    let data = Dataset { examples };
    let mut cfg = NextTokenPredictorConfig::new(vocab as usize);
    cfg.max_len = len;
    let varmap = VarMap::new();
    let vb = seeded_var_builder(&varmap, 7, DType::F32, &dev);
    let f32_model = NextTokenPredictor::new(cfg.clone(), vb)?;
    let reference = evaluate(&f32_model, &data, 64, &dev)?.loss;
    for (dtype, tol) in [(DType::F16, 0.01), (DType::BF16, 0.05)] {
        let tensors = varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(dtype)?)))
            .collect::<Result<_>>()?;
        let vb = candle_nn::VarBuilder::from_tensors(tensors, dtype, &dev);
        let model = NextTokenPredictor::new(cfg.clone(), vb)?;
        let loss = evaluate(&model, &data, 64, &dev)?.loss;
        assert!(
            (loss - reference).abs() <= tol,
            "{dtype:?}: loss {loss:.4}, f32 {reference:.4} (tolerance {tol})"
        );
    }
    Ok(())
}

/// `eval_sums` (the head on blocks of rows, activations detached) gives what the logits
/// tensor gives: the masked mean cross-entropy times the counted positions, and the argmax
/// hits. The vocabulary is large enough that the rows span three blocks of `EVAL_LOGITS`, one
/// of which counts no position; the graph of `forward` is not cut (its gradient reaches the
/// embeddings).
#[test]
fn eval_sums_equal_the_logits_in_blocks() -> Result<()> {
    use candle_mha_train::models::EVAL_LOGITS;
    let (n, l, v) = (3usize, 200usize, 60_000usize);
    let cfg = NextTokenPredictorConfig {
        vocab_size: v,
        max_len: l,
        embed_dim: 8,
        num_heads: 2,
        num_layers: 2,
        ff_dim: 16,
        ..NextTokenPredictorConfig::new(0)
    };
    let varmap = VarMap::new();
    let dev = Device::Cpu;
    let m = NextTokenPredictor::new(cfg, seeded_var_builder(&varmap, 3, DType::F32, &dev))?;
    let block = EVAL_LOGITS / v;
    assert!(
        n * l > 2 * block,
        "{block} rows a block: the test needs three blocks"
    );
    let tokens: Vec<u32> = (0..n * l).map(|i| (i * 7919 % v) as u32).collect();
    let targets: Vec<u32> = (0..n * l).map(|i| (i * 104_729 % v) as u32).collect();
    // Counted: the first block's rows but every third, none of the second block's, all of the
    // third's.
    let mask: Vec<u8> = (0..n * l)
        .map(|i| match i / block {
            0 => u8::from(i % 3 != 0),
            1 => 0,
            _ => 1,
        })
        .collect();
    let tokens = Tensor::from_vec(tokens, (n, l), &dev)?;
    let targets = Tensor::from_vec(targets, (n, l), &dev)?;
    let mask = Tensor::from_vec(mask, (n, l), &dev)?;
    let (loss, hits) = m.eval_sums(&tokens, None, &targets, &mask)?;

    let logits = m.forward(&tokens, None)?;
    let count = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
    let mean = masked_cross_entropy(&logits, &targets, &mask)?.to_scalar::<f32>()? as f64;
    let want_hits = logits
        .argmax(candle_mha::candle::D::Minus1)?
        .eq(&targets)?
        .mul(&mask)?
        .to_dtype(DType::F64)?
        .sum_all()?
        .to_scalar::<f64>()?;
    assert!(
        (loss - mean * count).abs() <= 1e-5 * loss.abs(),
        "{loss} vs {}",
        mean * count
    );
    assert_eq!(hits, want_hits);
    let grads = logits.sum_all()?.backward()?;
    let wte = varmap.data().lock().unwrap()["token_embedding.weight"].clone();
    assert!(grads.get(&wte).is_some());
    Ok(())
}
