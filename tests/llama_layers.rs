//! `RmsNorm`, `RotaryEmbedding` and `SwiGlu` against `torch.nn.RMSNorm` and transformers'
//! `LlamaRMSNorm`, `LlamaRotaryEmbedding` + `apply_rotary_pos_emb` and `LlamaMLP`
//! (`scripts/make_sdpa_fixtures.py`), forward and gradients.

use candle_mha_test_support as common;

use anyhow::{Context, Result};
use candle_mha::candle::{DType, Device, Module, Tensor, Var};
use candle_mha::candle_nn::VarBuilder;
use candle_mha::nn::{RmsNorm, RmsNormKind, RopeScaling, RotaryEmbedding, SwiGlu};
use common::{assert_close, Fixture};
use std::collections::HashMap;

fn fixture(name: &str) -> Result<Fixture> {
    Fixture::load(&common::fixtures_dir().join("layers").join(name))
}

#[test]
fn rms_norm_equals_torch_and_llama() -> Result<()> {
    let f = fixture("rms_norm.safetensors")?;
    let w = Var::from_tensor(f.tensor("weight")?)?;
    let x = Var::from_tensor(f.tensor("x")?)?;
    for (kind, eps, k) in [
        ("torch", 1e-6, RmsNormKind::Torch),
        (
            "torch_default_eps",
            RmsNorm::torch_default_eps(DType::F32),
            RmsNormKind::Torch,
        ),
        ("llama", 1e-5, RmsNormKind::Llama),
    ] {
        let norm = RmsNorm::from_weight(w.as_tensor().clone(), eps, k)?;
        let y = norm.forward(&x)?;
        assert_close(
            &format!("{kind} y"),
            &y,
            f.tensor(&format!("{kind}.y"))?,
            1e-6,
        )?;
        let grads = (y * f.tensor(&format!("{kind}.grad_out"))?)?
            .sum_all()?
            .backward()?;
        let gx = grads.get(&x).context("no grad of x")?;
        let gw = grads.get(&w).context("no grad of the weight")?;
        assert_close(
            &format!("{kind} dx"),
            gx,
            f.tensor(&format!("{kind}.grad.x"))?,
            1e-5,
        )?;
        assert_close(
            &format!("{kind} dw"),
            gw,
            f.tensor(&format!("{kind}.grad.weight"))?,
            1e-5,
        )?;
        // bf16 input: exactly PyTorch's bf16 result (same casts in the same places).
        let xb = x.to_dtype(DType::BF16)?;
        let (yb, want) = match k {
            RmsNormKind::Llama => {
                let wb = w.to_dtype(DType::BF16)?;
                let both = RmsNorm::from_weight(wb, eps, k)?.forward(&xb)?;
                let want = f.tensor("llama.y_bf16_bf16w")?;
                assert_eq!(both.dtype(), DType::BF16);
                assert_close(
                    "llama bf16 weight",
                    &both.to_dtype(DType::F32)?,
                    &want.to_dtype(DType::F32)?,
                    1e-2,
                )?;
                (norm.forward(&xb)?, f.tensor("llama.y_bf16")?.clone())
            }
            RmsNormKind::Torch => {
                let wb = w.to_dtype(DType::BF16)?;
                let n = RmsNorm::from_weight(wb, eps, k)?;
                (
                    n.forward(&xb)?,
                    f.tensor(&format!("{kind}.y_bf16"))?.clone(),
                )
            }
        };
        assert_eq!(yb.dtype(), want.dtype(), "{kind}: output dtype");
        assert_close(
            &format!("{kind} bf16"),
            &yb.to_dtype(DType::F32)?,
            &want.to_dtype(DType::F32)?,
            1e-2,
        )?;
    }
    Ok(())
}

#[test]
fn rotary_embedding_equals_transformers() -> Result<()> {
    let f = fixture("rope.safetensors")?;
    let offset = f.usize("offset")?;
    for (name, theta, scaling) in [
        ("default", 1e4, RopeScaling::None),
        ("theta", 5e5, RopeScaling::None),
        ("linear", 1e4, RopeScaling::Linear { factor: 4.0 }),
        (
            "llama3",
            5e5,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
        ),
    ] {
        let rope = RotaryEmbedding::new(32, theta, scaling)?;
        let t = |n: &str| f.tensor(&format!("{name}.{n}"));
        let inv = Tensor::new(rope.inv_freq(), &Device::Cpu)?;
        assert_close(&format!("{name} inv_freq"), &inv, t("inv_freq")?, 1e-6)?;
        let (cos, sin) = rope.cos_sin(offset, 7, DType::F32, &Device::Cpu)?;
        assert_close(&format!("{name} cos"), &cos, t("cos")?, 1e-5)?;
        assert_close(&format!("{name} sin"), &sin, t("sin")?, 1e-5)?;
        let q = Var::from_tensor(t("q")?)?;
        let qe = rope.apply(&q, offset)?;
        assert_close(&format!("{name} q"), &qe, t("q_embed")?, 1e-5)?;
        let ke = rope.apply(t("k")?, offset)?;
        assert_close(&format!("{name} k"), &ke, t("k_embed")?, 1e-5)?;
        let grads = (qe * t("grad_out")?)?.sum_all()?.backward()?;
        assert_close(
            &format!("{name} dq"),
            grads.get(&q).context("no dq")?,
            t("grad.q")?,
            1e-5,
        )?;
    }
    let e = RotaryEmbedding::new(31, 1e4, RopeScaling::None).unwrap_err();
    assert!(e.to_string().contains("head_dim must be even"), "{e}");
    Ok(())
}

#[test]
fn swiglu_equals_llama_mlp() -> Result<()> {
    let f = fixture("swiglu.safetensors")?;
    let vars: HashMap<String, Var> = f
        .params()
        .into_iter()
        .map(|(k, t)| Ok((k, Var::from_tensor(&t)?)))
        .collect::<Result<_>>()?;
    let tensors = vars
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mlp = SwiGlu::new(16, f.usize("hidden")?, vb)?;
    let x = Var::from_tensor(f.tensor("x")?)?;
    let y = mlp.forward(&x)?;
    assert_close("y", &y, f.tensor("y")?, 1e-5)?;
    let grads = (y * f.tensor("grad_out")?)?.sum_all()?.backward()?;
    assert_close(
        "dx",
        grads.get(&x).context("no dx")?,
        f.tensor("grad.x")?,
        1e-5,
    )?;
    for (name, v) in &vars {
        let g = grads.get(v).with_context(|| format!("no grad of {name}"))?;
        assert_close(name, g, f.tensor(&format!("grad.{name}"))?, 1e-5)?;
    }
    Ok(())
}
