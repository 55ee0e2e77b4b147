//! `scaled_dot_product_attention` against PyTorch's `F.scaled_dot_product_attention`
//! (`scripts/make_sdpa_fixtures.py`): outputs and the gradients of `sum(out · R)` w.r.t. q, k,
//! v and a float mask, for every mask form, causal, scale and grouped-query case, on the fused
//! CPU op and on the candle-ops path (CUDA's, f16's and bf16's).
//! Tolerances relative to the tensor's largest magnitude: f32 2e-5, f64 1e-10.

use candle_mha_test_support as common;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Tensor, Var};
use candle_mha::{scaled_dot_product_attention, AttentionKernel, SdpaOptions};
use common::{assert_close, Fixture};

type Sdpa = fn(&Tensor, &Tensor, &Tensor, &SdpaOptions) -> candle_mha::candle::Result<Tensor>;

/// The candle-ops path (`AttentionKernel::Reference`) with the call's other options.
fn reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &SdpaOptions,
) -> candle_mha::candle::Result<Tensor> {
    let opts = opts.clone().with_kernel(AttentionKernel::Reference);
    scaled_dot_product_attention(q, k, v, &opts)
}

fn cases() -> Result<Vec<Fixture>> {
    let dir = common::fixtures_dir().join("sdpa");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    paths.sort();
    let fixtures: Vec<Fixture> = paths
        .iter()
        .map(|p| Fixture::load(p))
        .collect::<Result<_>>()?;
    anyhow::ensure!(
        fixtures.len() >= 20,
        "only {} sdpa fixtures",
        fixtures.len()
    );
    Ok(fixtures)
}

fn check_case(f: &Fixture, sdpa: Sdpa) -> Result<()> {
    let tol = match f.str("dtype") {
        "f64" => 1e-10,
        _ => 2e-5,
    };
    let var = |name: &str| -> Result<Var> { Ok(Var::from_tensor(f.tensor(name)?)?) };
    let (q, k, v) = (var("query")?, var("key")?, var("value")?);
    let mask = match f.tensors.get("attn_mask") {
        Some(m) if m.dtype() == DType::U8 => Some(m.clone()),
        Some(m) => Some(Var::from_tensor(m)?.as_tensor().clone()),
        None => None,
    };
    let opts = SdpaOptions {
        attn_mask: mask.clone(),
        is_causal: f.flag("is_causal")?,
        enable_gqa: f.flag("enable_gqa")?,
        scale: match f.str("scale") {
            "none" => None,
            s => Some(s.parse()?),
        },
        ..SdpaOptions::new()
    };
    let out = sdpa(&q, &k, &v, &opts)?;
    let what = |t: &str| format!("{}: {t}", f.name);
    assert_close(&what("out"), &out, f.tensor("out")?, tol)?;
    let grads = (out * f.tensor("grad_out")?)?.sum_all()?.backward()?;
    for (name, t) in [("query", &q), ("key", &k), ("value", &v)] {
        let g = grads
            .get(t)
            .with_context(|| what(&format!("no gradient of {name}")))?;
        assert_close(
            &what(&format!("grad {name}")),
            g,
            f.tensor(&format!("grad.{name}"))?,
            tol,
        )?;
    }
    if let (Some(m), Ok(want)) = (&mask, f.tensor("grad.attn_mask")) {
        let g = grads
            .get(m)
            .with_context(|| what("no gradient of the mask"))?;
        assert_close(&what("grad attn_mask"), g, want, tol)?;
    }
    Ok(())
}

#[test]
fn fused_cpu_op_equals_pytorch() -> Result<()> {
    for f in cases()? {
        // The fused op takes E_v = E; the others go through candle's ops on this path too.
        check_case(&f, scaled_dot_product_attention)?;
    }
    Ok(())
}

#[test]
fn candle_ops_path_equals_pytorch() -> Result<()> {
    for f in cases()? {
        check_case(&f, reference)?;
    }
    Ok(())
}

/// A changed mask must change the answer: the comparison above can fail.
#[test]
fn a_wrong_mask_convention_is_caught() -> Result<()> {
    let f = Fixture::load(&common::fixtures_dir().join("sdpa/bool_ls.safetensors"))?;
    let m = f.tensor("attn_mask")?;
    let inverted = (Tensor::ones_like(m)? - m)?;
    let opts = SdpaOptions::new().with_mask(inverted);
    let out = scaled_dot_product_attention(
        f.tensor("query")?,
        f.tensor("key")?,
        f.tensor("value")?,
        &opts,
    )?;
    assert!(assert_close("out", &out, f.tensor("out")?, 2e-5).is_err());
    Ok(())
}

/// bf16 goes through candle's ops (as on CUDA) and stays within bf16's precision of f32.
#[test]
fn bf16_follows_f32() -> Result<()> {
    let f = Fixture::load(&common::fixtures_dir().join("sdpa/gqa_3.safetensors"))?;
    let opts = SdpaOptions::new().gqa().causal();
    let bf = |n: &str| -> Result<Tensor> { Ok(f.tensor(n)?.to_dtype(DType::BF16)?) };
    let out = scaled_dot_product_attention(&bf("query")?, &bf("key")?, &bf("value")?, &opts)?;
    assert_eq!(out.dtype(), DType::BF16);
    assert_close(
        "bf16 out",
        &out.to_dtype(DType::F32)?,
        f.tensor("out")?,
        3e-2,
    )?;
    Ok(())
}

/// `AttentionKernel::Fused` runs the fused op where it covers the call (the same bits as
/// `Auto`) and is an error naming what it does not cover (bf16) rather than a silent
/// fallback; `Reference` differs from the fused op only by rounding.
#[test]
fn the_kernel_option_chooses_the_path() -> Result<()> {
    let f = Fixture::load(&common::fixtures_dir().join("sdpa/gqa_3.safetensors"))?;
    let (q, k, v) = (f.tensor("query")?, f.tensor("key")?, f.tensor("value")?);
    let opts = SdpaOptions::new().gqa().causal();
    let auto = scaled_dot_product_attention(q, k, v, &opts)?;
    let fused =
        scaled_dot_product_attention(q, k, v, &opts.clone().with_kernel(AttentionKernel::Fused))?;
    assert_eq!(common::max_abs_diff(&auto, &fused)?, 0.0);
    let reference = reference(q, k, v, &opts)?;
    let gap = common::max_abs_diff(&auto, &reference)?;
    assert!(gap > 0.0 && gap < 1e-5, "reference path gap {gap}");
    let bf = |t: &Tensor| t.to_dtype(DType::BF16);
    let e = scaled_dot_product_attention(
        &bf(q)?,
        &bf(k)?,
        &bf(v)?,
        &opts.with_kernel(AttentionKernel::Fused),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("kernel Fused covers the CPU in f32/f64") && e.contains("BF16"),
        "{e}"
    );
    Ok(())
}
