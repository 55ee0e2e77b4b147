//! Every PyTorch fixture (`scripts/make_fixtures.py`): outputs, weights and gradients of
//! `sum(output · R)` w.r.t. every parameter and the inputs equal PyTorch's.
//! Tolerances: f32 ≤ 2e-5, f64 ≤ 1e-10 (relative to the tensor's largest magnitude).

use candle_mha_test_support as common;

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Tensor, Var};
use candle_mha::{AttentionOptions, MultiheadAttention, MultiheadAttentionConfig};
use candle_nn::VarBuilder;
use common::{assert_close, fixture_paths, Fixture};

fn config(f: &Fixture) -> Result<MultiheadAttentionConfig> {
    Ok(
        MultiheadAttentionConfig::new(f.usize("embed_dim")?, f.usize("num_heads")?)
            .with_kdim(f.usize("kdim")?)
            .with_vdim(f.usize("vdim")?)
            .with_bias(f.flag("bias")?)
            .with_add_bias_kv(f.flag("add_bias_kv")?)
            .with_add_zero_attn(f.flag("add_zero_attn")?)
            .with_batch_first(f.flag("batch_first")?),
    )
}

fn options(f: &Fixture, dtype: DType) -> Result<AttentionOptions> {
    let mut opts = AttentionOptions::new()
        .with_need_weights(f.flag("need_weights")?)
        .with_average_attn_weights(f.flag("average_attn_weights")?)
        .with_is_causal(f.flag("is_causal")?);
    let cast = |t: &Tensor| -> Result<Tensor> {
        Ok(if t.dtype() == DType::U8 {
            t.clone()
        } else {
            t.to_dtype(dtype)?
        })
    };
    if let Some(m) = f.tensors.get("key_padding_mask") {
        opts = opts.with_key_padding_mask(cast(m)?);
    }
    if let Some(m) = f.tensors.get("attn_mask") {
        opts = opts.with_attn_mask(cast(m)?);
    }
    Ok(opts)
}

/// The module built from the fixture's state_dict at its prefix, with every parameter a
/// `Var` (so gradients can be read), in `dtype`.
fn module(f: &Fixture, dtype: DType) -> Result<(MultiheadAttention, HashMap<String, Var>)> {
    let vars: HashMap<String, Var> = f
        .params()
        .into_iter()
        .map(|(k, t)| Ok((k, Var::from_tensor(&t.to_dtype(dtype)?)?)))
        .collect::<Result<_>>()?;
    let tensors = vars
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let vb = VarBuilder::from_tensors(tensors, dtype, &Device::Cpu);
    let prefix = f.str("prefix");
    let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
    Ok((MultiheadAttention::new(config(f)?, vb)?, vars))
}

/// Runs one fixture in `dtype` and compares everything with tolerance `tol`.
fn check(f: &Fixture, dtype: DType, tol: f64) -> Result<f64> {
    let mut worst = 0f64;
    let (mha, vars) = module(f, dtype)?;
    let query = Var::from_tensor(&f.tensor("query")?.to_dtype(dtype)?)?;
    let self_attn = f.flag("self_attn")?;
    let key_is_value = f.flag("key_is_value")?;
    let key = match self_attn {
        true => query.clone(),
        false => Var::from_tensor(&f.tensor("key")?.to_dtype(dtype)?)?,
    };
    let value = match self_attn || key_is_value {
        true => key.clone(),
        false => Var::from_tensor(&f.tensor("value")?.to_dtype(dtype)?)?,
    };
    let opts = options(f, dtype)?;
    let out = mha.forward(&query, &key, &value, &opts)?;
    worst = worst.max(assert_close(
        "output",
        &out.output,
        f.tensor("output")?,
        tol,
    )?);
    match (&out.weights, f.tensors.get("weights")) {
        (Some(w), Some(expected)) => worst = worst.max(assert_close("weights", w, expected, tol)?),
        (None, None) => {}
        (w, e) => anyhow::bail!("weights: got {:?}, expected {:?}", w.is_some(), e.is_some()),
    }

    // need_weights decides only whether weights are returned: the output is bit-identical.
    let flipped = opts.clone().with_need_weights(!opts.need_weights);
    let other = mha.forward(&query, &key, &value, &flipped)?;
    anyhow::ensure!(
        other.weights.is_some() == flipped.need_weights,
        "weights presence"
    );
    let diff = (&other.output - &out.output)?
        .abs()?
        .flatten_all()?
        .max(0)?;
    anyhow::ensure!(
        diff.to_dtype(DType::F64)?.to_scalar::<f64>()? == 0.0,
        "need_weights changed the output"
    );

    let r = f.tensor("R")?.to_dtype(dtype)?;
    let grads = (out.output * r)?.sum_all()?.backward()?;
    let mut inputs = vec![("query", &query)];
    if !self_attn {
        inputs.push(("key", &key));
        if !key_is_value {
            inputs.push(("value", &value));
        }
    }
    for (name, var) in inputs {
        let g = grads
            .get(var)
            .with_context(|| format!("no gradient for {name}"))?;
        let expected = f.tensor(&format!("grad.{name}"))?;
        worst = worst.max(assert_close(&format!("grad.{name}"), g, expected, tol)?);
    }
    let mut n_param_grads = 0;
    for (name, expected) in f
        .tensors
        .iter()
        .filter_map(|(k, t)| k.strip_prefix("grad.param.").map(|k| (k, t)))
    {
        let var = vars
            .get(name)
            .with_context(|| format!("no parameter {name}"))?;
        let g = grads
            .get(var)
            .with_context(|| format!("no gradient for {name}"))?;
        worst = worst.max(assert_close(
            &format!("grad.param.{name}"),
            g,
            expected,
            tol,
        )?);
        n_param_grads += 1;
    }
    anyhow::ensure!(
        n_param_grads == mha.named_parameters().len(),
        "{n_param_grads} parameter gradients checked, the module has {}",
        mha.named_parameters().len()
    );
    Ok(worst)
}

/// Runs `check` on every fixture, reporting all failures at once.
fn check_all(dtype_for: impl Fn(&Fixture) -> Option<(DType, f64)>) -> Result<()> {
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut worst = (0f64, String::new());
    for path in fixture_paths() {
        let f = Fixture::load(&path)?;
        let Some((dtype, tol)) = dtype_for(&f) else {
            continue;
        };
        checked += 1;
        match check(&f, dtype, tol) {
            Ok(err) if err >= worst.0 => worst = (err, format!("{} ({dtype:?})", f.name)),
            Ok(_) => {}
            Err(e) => failures.push(format!("{} ({dtype:?}): {e:#}", f.name)),
        }
    }
    assert!(checked >= 10, "only {checked} fixtures found");
    println!(
        "{checked} fixtures; worst relative error {:.2e} in {}",
        worst.0, worst.1
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} fixtures failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn fixtures_match_pytorch_in_their_dtype() -> Result<()> {
    check_all(|f| match f.dtype().ok()? {
        DType::F64 => Some((DType::F64, 1e-10)),
        d => Some((d, 2e-5)),
    })
}

/// The half types run the same cases: products in the half type, softmax in f32.
#[test]
fn fixtures_match_pytorch_in_f16() -> Result<()> {
    check_all(|f| (f.dtype().ok()? == DType::F32).then_some((DType::F16, 1e-2)))
}

#[test]
fn fixtures_match_pytorch_in_bf16() -> Result<()> {
    check_all(|f| (f.dtype().ok()? == DType::F32).then_some((DType::BF16, 8e-2)))
}

#[test]
fn fixture_set_covers_the_options() -> Result<()> {
    let all: Vec<Fixture> = fixture_paths()
        .iter()
        .map(|p| Fixture::load(p))
        .collect::<Result<_>>()?;
    let any = |key: &str| all.iter().any(|f| f.flag(key).unwrap_or(false));
    let none = |key: &str| all.iter().any(|f| !f.flag(key).unwrap_or(true));
    for key in [
        "batch_first",
        "add_bias_kv",
        "add_zero_attn",
        "is_causal",
        "fully_masked",
        "need_weights",
        "average_attn_weights",
        "self_attn",
        "key_is_value",
    ] {
        assert!(
            any(key) && none(key),
            "fixtures must cover {key} on and off"
        );
    }
    assert!(
        all.iter().any(|f| !f.str("prefix").is_empty()),
        "nested prefix case"
    );
    assert!(all.iter().any(|f| f.str("dtype") == "f64"), "f64 cases");
    assert!(all.iter().any(|f| f.query_rank() == 2), "unbatched cases");
    Ok(())
}

trait Rank {
    fn query_rank(&self) -> usize;
}
impl Rank for Fixture {
    fn query_rank(&self) -> usize {
        self.tensor("query").map(|t| t.rank()).unwrap_or(0)
    }
}
