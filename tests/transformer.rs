//! The Transformer layers (`candle_mha::transformer`) against PyTorch 2.15: outputs and
//! gradients of every parameter and input (fixtures made by
//! `scripts/make_transformer_fixtures.py`), training through them, and their errors.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::candle_nn::VarMap;
use candle_mha::seeded_var_builder;
use candle_mha::transformer::{
    Activation, DecoderOptions, EncoderOptions, FinalNorm, Transformer, TransformerConfig,
    TransformerDecoder, TransformerDecoderLayerConfig, TransformerEncoder, TransformerEncoderLayer,
    TransformerEncoderLayerConfig, TransformerOptions,
};
use common::randn;

/// In training mode with dropout, one backward reaches every parameter of the whole model.
#[test]
fn training_gives_every_parameter_a_gradient() -> Result<()> {
    for norm_first in [false, true] {
        let varmap = VarMap::new();
        let cfg = TransformerConfig::new(8, 2)
            .with_num_encoder_layers(2)
            .with_num_decoder_layers(2)
            .with_dim_feedforward(16)
            .with_dropout(0.2)
            .with_activation(Activation::Gelu)
            .with_norm_first(norm_first);
        let model = Transformer::new(
            cfg,
            seeded_var_builder(&varmap, 3, DType::F32, &Device::Cpu),
        )?;
        let (src, tgt) = (randn(&[5, 2, 8], 1)?, randn(&[4, 2, 8], 2)?);
        let opts = TransformerOptions::new()
            .with_train(true)
            .with_tgt_is_causal(true);
        let out = model.forward(&src, &tgt, &opts)?;
        assert_eq!(out.dims(), [4, 2, 8]);
        let r = randn(&[4, 2, 8], 9)?;
        let grads = (out * r)?.sum_all()?.backward()?;
        let params = model.named_parameters();
        assert_eq!(params.len(), varmap.all_vars().len());
        for (name, p) in params {
            let g = grads
                .get(&p)
                .unwrap_or_else(|| panic!("{name}: no gradient"));
            let norm = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
            assert!(norm > 0.0, "{name}: zero gradient");
        }
        // Train mode draws new masks each call, eval mode is deterministic.
        let a = model.forward(&src, &tgt, &opts)?;
        let b = model.forward(&src, &tgt, &opts)?;
        assert!(common::max_abs_diff(&a, &b)? > 0.0);
        let eval = TransformerOptions::new();
        let (a, b) = (
            model.forward(&src, &tgt, &eval)?,
            model.forward(&src, &tgt, &eval)?,
        );
        assert_eq!(common::max_abs_diff(&a, &b)?, 0.0);
        // A given seed fixes the masks.
        let seeded = opts.clone().with_dropout_seed(11);
        let (a, b) = (
            model.forward(&src, &tgt, &seeded)?,
            model.forward(&src, &tgt, &seeded)?,
        );
        assert_eq!(common::max_abs_diff(&a, &b)?, 0.0);
    }
    Ok(())
}

/// Parameter names and their order are PyTorch's `named_parameters()`, with and without bias.
#[test]
fn names_are_pytorchs() -> Result<()> {
    let varmap = VarMap::new();
    let cfg = TransformerEncoderLayerConfig::new(8, 2).with_dim_feedforward(16);
    let enc = TransformerEncoder::new(
        cfg,
        2,
        FinalNorm::LayerNorm,
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    let names: Vec<String> = enc.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 12 + 2);
    assert_eq!(
        &names[..12],
        [
            "layers.0.self_attn.in_proj_weight",
            "layers.0.self_attn.in_proj_bias",
            "layers.0.self_attn.out_proj.weight",
            "layers.0.self_attn.out_proj.bias",
            "layers.0.linear1.weight",
            "layers.0.linear1.bias",
            "layers.0.linear2.weight",
            "layers.0.linear2.bias",
            "layers.0.norm1.weight",
            "layers.0.norm1.bias",
            "layers.0.norm2.weight",
            "layers.0.norm2.bias",
        ]
    );
    assert_eq!(&names[24..], ["norm.weight", "norm.bias"]);
    // The config is plain data: it goes through JSON and back, the activation by its name.
    let cfg = enc.layers()[0]
        .config()
        .clone()
        .with_activation(Activation::Gelu);
    let json = serde_json::to_string(&cfg)?;
    assert!(json.contains(r#""activation":"gelu""#), "{json}");
    assert_eq!(
        serde_json::from_str::<TransformerEncoderLayerConfig>(&json)?,
        cfg
    );
    let varmap = VarMap::new();
    let cfg = TransformerDecoderLayerConfig::new(8, 2)
        .with_dim_feedforward(16)
        .with_bias(false);
    let dec = TransformerDecoder::new(
        cfg,
        1,
        FinalNorm::None,
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    let names: Vec<String> = dec.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "layers.0.self_attn.in_proj_weight",
            "layers.0.self_attn.out_proj.weight",
            "layers.0.multihead_attn.in_proj_weight",
            "layers.0.multihead_attn.out_proj.weight",
            "layers.0.linear1.weight",
            "layers.0.linear2.weight",
            "layers.0.norm1.weight",
            "layers.0.norm2.weight",
            "layers.0.norm3.weight",
        ]
    );
    Ok(())
}

/// Bad arguments fail with a message naming them.
#[test]
fn bad_input_is_named() -> Result<()> {
    let varmap = VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
    let err = TransformerEncoderLayer::new(TransformerEncoderLayerConfig::new(10, 3), vb.clone())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nhead (3)") && err.contains("d_model (10)"),
        "{err}"
    );
    let layer = TransformerEncoderLayer::new(
        TransformerEncoderLayerConfig::new(8, 2).with_dim_feedforward(16),
        vb.pp("enc"),
    )?;
    let err = layer
        .forward(&randn(&[4, 2, 6], 0)?, &EncoderOptions::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("src") && err.contains("[4, 2, 6]") && err.contains("d_model = 8"),
        "{err}"
    );
    let err = layer
        .forward(
            &randn(&[4, 2, 8], 0)?,
            &EncoderOptions::new().with_mask(Tensor::zeros((3, 3), DType::U8, &Device::Cpu)?),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("EncoderOptions::mask has shape [3, 3]") && err.contains("(4, 4)"),
        "{err}"
    );
    let dec = TransformerDecoder::new(
        TransformerDecoderLayerConfig::new(8, 2).with_dim_feedforward(16),
        1,
        FinalNorm::LayerNorm,
        vb.pp("dec"),
    )?;
    let err = dec
        .forward(
            &randn(&[4, 2, 8], 0)?,
            &randn(&[5, 2, 7], 0)?,
            &DecoderOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory") && err.contains("[5, 2, 7]"), "{err}");
    let model = Transformer::new(
        TransformerConfig::new(8, 2)
            .with_num_encoder_layers(1)
            .with_num_decoder_layers(1)
            .with_dim_feedforward(16),
        vb.pp("t"),
    )?;
    let err = model
        .forward(
            &randn(&[5, 2, 8], 0)?,
            &randn(&[4, 3, 8], 0)?,
            &TransformerOptions::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("batch sizes"), "{err}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// PyTorch parity.

use candle_mha::candle::Var;
use candle_mha::candle_nn::VarBuilder;
use candle_mha::transformer::TransformerDecoderLayer;
use common::{assert_close, Fixture};
use std::collections::HashMap;

fn transformer_fixtures() -> Vec<std::path::PathBuf> {
    let dir = common::fixtures_dir().join("transformer");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/transformer exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    paths
}

/// The module of a fixture, whatever its kind, behind one forward.
enum Module {
    EncoderLayer(Box<TransformerEncoderLayer>),
    Encoder(TransformerEncoder),
    DecoderLayer(Box<TransformerDecoderLayer>),
    Decoder(TransformerDecoder),
    Transformer(Transformer),
}

fn layer_config(f: &Fixture) -> Result<TransformerEncoderLayerConfig> {
    Ok(
        TransformerEncoderLayerConfig::new(f.usize("d_model")?, f.usize("nhead")?)
            .with_dim_feedforward(f.usize("dim_feedforward")?)
            .with_activation(match f.str("activation") {
                "gelu" => Activation::Gelu,
                _ => Activation::Relu,
            })
            .with_batch_first(f.flag("batch_first")?)
            .with_norm_first(f.flag("norm_first")?)
            .with_bias(f.flag("bias")?),
    )
}

fn decoder_config(c: TransformerEncoderLayerConfig) -> TransformerDecoderLayerConfig {
    TransformerDecoderLayerConfig::new(c.d_model, c.nhead)
        .with_dim_feedforward(c.dim_feedforward)
        .with_activation(c.activation)
        .with_batch_first(c.batch_first)
        .with_norm_first(c.norm_first)
        .with_bias(c.bias)
}

fn build(f: &Fixture, vb: VarBuilder) -> Result<Module> {
    let cfg = layer_config(f)?;
    let final_norm = match f.flag("final_norm")? {
        true => FinalNorm::LayerNorm,
        false => FinalNorm::None,
    };
    let n = f.usize("num_layers")?;
    Ok(match f.str("kind") {
        "encoder_layer" => Module::EncoderLayer(Box::new(TransformerEncoderLayer::new(cfg, vb)?)),
        "encoder" => Module::Encoder(TransformerEncoder::new(cfg, n, final_norm, vb)?),
        "decoder_layer" => Module::DecoderLayer(Box::new(TransformerDecoderLayer::new(
            decoder_config(cfg),
            vb,
        )?)),
        "decoder" => Module::Decoder(TransformerDecoder::new(
            decoder_config(cfg),
            n,
            final_norm,
            vb,
        )?),
        "transformer" => {
            let tc = TransformerConfig::new(cfg.d_model, cfg.nhead)
                .with_num_encoder_layers(n)
                .with_num_decoder_layers(n)
                .with_dim_feedforward(cfg.dim_feedforward)
                .with_activation(cfg.activation)
                .with_batch_first(cfg.batch_first)
                .with_norm_first(cfg.norm_first)
                .with_bias(cfg.bias);
            Module::Transformer(Transformer::new(tc, vb)?)
        }
        other => anyhow::bail!("{}: unknown kind {other}", f.name),
    })
}

fn forward(
    f: &Fixture,
    m: &Module,
    inputs: &HashMap<String, Tensor>,
    dev: &Device,
) -> Result<Tensor> {
    let mask = |k: &str| -> Result<Option<Tensor>> {
        Ok(f.tensors.get(k).map(|t| t.to_device(dev)).transpose()?)
    };
    let input = |k: &str| inputs[k].clone();
    let mut enc = EncoderOptions::new().with_is_causal(f.flag("is_causal")?);
    enc.mask = mask("mask")?.or(mask("src_mask")?);
    enc.src_key_padding_mask = mask("src_key_padding_mask")?;
    let mut dec = DecoderOptions::new()
        .with_tgt_is_causal(f.flag("tgt_is_causal")?)
        .with_memory_is_causal(f.flag("memory_is_causal")?);
    dec.tgt_mask = mask("tgt_mask")?;
    dec.memory_mask = mask("memory_mask")?;
    dec.tgt_key_padding_mask = mask("tgt_key_padding_mask")?;
    dec.memory_key_padding_mask = mask("memory_key_padding_mask")?;
    Ok(match m {
        Module::EncoderLayer(l) => l.forward(&input("src"), &enc)?,
        Module::Encoder(e) => e.forward(&input("src"), &enc)?,
        Module::DecoderLayer(l) => l.forward(&input("tgt"), &input("memory"), &dec)?,
        Module::Decoder(d) => d.forward(&input("tgt"), &input("memory"), &dec)?,
        Module::Transformer(t) => {
            let mut o = TransformerOptions::new()
                .with_tgt_is_causal(dec.tgt_is_causal)
                .with_memory_is_causal(dec.memory_is_causal);
            o.src_mask = mask("src_mask")?;
            o.src_key_padding_mask = mask("src_key_padding_mask")?;
            o.tgt_mask = dec.tgt_mask.clone();
            o.memory_mask = dec.memory_mask.clone();
            o.tgt_key_padding_mask = dec.tgt_key_padding_mask.clone();
            o.memory_key_padding_mask = dec.memory_key_padding_mask.clone();
            t.forward(&input("src"), &input("tgt"), &o)?
        }
    })
}

fn named_parameters(m: &Module) -> Vec<(String, Tensor)> {
    match m {
        Module::EncoderLayer(l) => l.named_parameters(),
        Module::Encoder(e) => e.named_parameters(),
        Module::DecoderLayer(l) => l.named_parameters(),
        Module::Decoder(d) => d.named_parameters(),
        Module::Transformer(t) => t.named_parameters(),
    }
}

/// Every fixture: the state_dict loaded at the prefix `model` through
/// `VarBuilder::from_tensors` gives PyTorch's output and the gradients of `sum(out · R)` for
/// every parameter and input (f32 ≤ 1e-5 relative, f64 ≤ 1e-10).
#[test]
fn matches_pytorch() -> Result<()> {
    matches_pytorch_on(&Device::Cpu, 1e-5)
}

/// The same fixtures on CUDA (a `--features cuda` build on a GPU machine; skipped otherwise),
/// against PyTorch's CPU numbers: f32 ≤ 1e-4 (cuBLAS sums in another order), f64 ≤ 1e-10.
#[test]
fn matches_pytorch_on_cuda() -> Result<()> {
    match common::gpu() {
        Some(gpu) => matches_pytorch_on(&gpu, 1e-4),
        None => Ok(()),
    }
}

fn matches_pytorch_on(dev: &Device, f32_tol: f64) -> Result<()> {
    let paths = transformer_fixtures();
    assert!(paths.len() >= 17, "fixtures missing: {paths:?}");
    for path in paths {
        let f = Fixture::load(&path)?;
        let dtype = f.dtype()?;
        let tol = if dtype == DType::F64 { 1e-10 } else { f32_tol };
        // Parameters as variables, so that the backward pass reaches them.
        let params: HashMap<String, Tensor> = f
            .params()
            .into_iter()
            .map(|(k, t)| Ok((k, Var::from_tensor(&t.to_device(dev)?)?.as_tensor().clone())))
            .collect::<Result<_>>()?;
        let vb = VarBuilder::from_tensors(params.clone(), dtype, dev).pp("model");
        let m = build(&f, vb)?;
        // Everything in the file is used, nothing more.
        let mut used: Vec<String> = named_parameters(&m)
            .into_iter()
            .map(|(n, _)| format!("model.{n}"))
            .collect();
        let mut given: Vec<String> = params.keys().cloned().collect();
        used.sort();
        given.sort();
        assert_eq!(used, given, "{}", f.name);
        let inputs: HashMap<String, Tensor> = ["src", "tgt", "memory"]
            .into_iter()
            .filter_map(|k| f.tensors.get(k).map(|t| (k, t)))
            .map(|(k, t)| {
                let v = Var::from_tensor(&t.to_device(dev)?)?;
                Ok((k.to_string(), v.as_tensor().clone()))
            })
            .collect::<Result<_>>()?;
        let out = forward(&f, &m, &inputs, dev)?;
        let what = |s: &str| format!("{}: {s}", f.name);
        let err = assert_close(&what("out"), &out, f.tensor("out")?, tol)?;
        eprintln!("{}: out relative error {err:.1e}", f.name);
        if let Some(fast) = f.tensors.get("out_fast") {
            // PyTorch's fast path equals its slow path (and this) away from the padding.
            let keep = (1.0 - f.tensor("src_key_padding_mask")?.to_dtype(dtype)?)?.unsqueeze(2)?;
            let ours = out.to_device(&Device::Cpu)?.broadcast_mul(&keep)?;
            assert_close(&what("out_fast"), &ours, &fast.broadcast_mul(&keep)?, tol)?;
        }
        let grads = (&out * f.tensor("R")?.to_device(dev)?)?
            .sum_all()?
            .backward()?;
        for (name, t) in &inputs {
            let g = grads.get(t).expect("input gradient");
            assert_close(
                &what(&format!("grad.{name}")),
                g,
                f.tensor(&format!("grad.{name}"))?,
                tol,
            )?;
        }
        for (name, p) in &params {
            let g = grads.get(p).expect("parameter gradient");
            let key = format!("grad.param.{name}");
            assert_close(&what(&key), g, f.tensor(&key)?, tol)?;
        }
    }
    Ok(())
}

/// `is_causal` with no mask builds the causal mask itself (PyTorch needs it given): the causal
/// fixtures give PyTorch's output with their mask left out.
#[test]
fn is_causal_without_mask_is_the_causal_mask() -> Result<()> {
    let mut checked = 0;
    for path in transformer_fixtures() {
        let mut f = Fixture::load(&path)?;
        let causal_key = match f.str("kind") {
            "encoder_layer" | "encoder" if f.flag("is_causal")? => ["mask", "src_mask"]
                .into_iter()
                .find(|k| f.tensors.contains_key(*k)),
            "decoder_layer" | "decoder" | "transformer" if f.flag("tgt_is_causal")? => {
                Some("tgt_mask")
            }
            "decoder_layer" if f.flag("memory_is_causal")? => Some("memory_mask"),
            _ => None,
        };
        let Some(key) = causal_key else { continue };
        f.tensors.remove(key);
        let dtype = f.dtype()?;
        let vb = VarBuilder::from_tensors(f.params(), dtype, &Device::Cpu).pp("model");
        let m = build(&f, vb)?;
        let inputs: HashMap<String, Tensor> = ["src", "tgt", "memory"]
            .into_iter()
            .filter_map(|k| f.tensors.get(k).map(|t| (k.to_string(), t.clone())))
            .collect();
        let out = forward(&f, &m, &inputs, &Device::Cpu)?;
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-5 };
        assert_close(
            &format!("{}: out without {key}", f.name),
            &out,
            f.tensor("out")?,
            tol,
        )?;
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} causal fixtures");
    Ok(())
}

/// Fresh layers get PyTorch's initialisation: linear layers U(±1/√fan_in), layer norms ones and
/// zeros, attention as `MultiheadAttention`; `Transformer` redraws every matrix xavier-uniform.
#[test]
fn initialisation_is_pytorchs() -> Result<()> {
    fn bounds(t: &Tensor) -> Result<(f32, f32)> {
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        Ok((max, mean))
    }
    let (e, ff) = (16usize, 64usize);
    let varmap = VarMap::new();
    let layer = TransformerEncoderLayer::new(
        TransformerEncoderLayerConfig::new(e, 2).with_dim_feedforward(ff),
        seeded_var_builder(&varmap, 5, DType::F32, &Device::Cpu),
    )?;
    let params: HashMap<String, Tensor> = layer.named_parameters().into_iter().collect();
    for (name, fan_in) in [
        ("linear1.weight", e),
        ("linear1.bias", e),
        ("linear2.weight", ff),
        ("linear2.bias", ff),
    ] {
        let bound = 1.0 / (fan_in as f32).sqrt();
        let (max, _) = bounds(&params[name])?;
        assert!(
            max <= bound && max > 0.8 * bound,
            "{name}: max {max}, bound {bound}"
        );
    }
    for (name, value) in [
        ("norm1.weight", 1.0),
        ("norm2.weight", 1.0),
        ("norm1.bias", 0.0),
        ("norm2.bias", 0.0),
    ] {
        let v = params[name].to_vec1::<f32>()?;
        assert!(v.iter().all(|x| *x == value), "{name}: {v:?}");
    }
    let varmap = VarMap::new();
    let model = Transformer::new(
        TransformerConfig::new(e, 2)
            .with_num_encoder_layers(1)
            .with_num_decoder_layers(1)
            .with_dim_feedforward(ff),
        seeded_var_builder(&varmap, 5, DType::F32, &Device::Cpu),
    )?;
    assert_eq!(model.named_parameters().len(), varmap.all_vars().len());
    for (name, t) in model.named_parameters() {
        if t.rank() < 2 {
            continue;
        }
        let (out, inp) = t.dims2()?;
        let bound = (6.0 / (out + inp) as f32).sqrt();
        let (max, _) = bounds(&t)?;
        assert!(
            max <= bound && max > 0.8 * bound,
            "{name}: max {max}, xavier bound {bound}"
        );
    }
    Ok(())
}

/// A state_dict missing a tensor fails naming it.
#[test]
fn missing_tensor_is_named() -> Result<()> {
    let path = common::fixtures_dir().join("transformer/encoder_post_kpm.safetensors");
    let f = Fixture::load(&path)?;
    let mut params = f.params();
    params.remove("model.layers.1.norm2.weight");
    let vb = VarBuilder::from_tensors(params, DType::F32, &Device::Cpu).pp("model");
    let err = build(&f, vb).err().expect("missing tensor").to_string();
    assert!(err.contains("layers.1.norm2.weight"), "{err}");
    Ok(())
}
