//! Whole PyTorch Transformer models (`nn.TransformerEncoder`, `nn.Transformer`, single layers)
//! loaded from PyTorch-made checkpoints (`scripts/make_checkpoint_fixtures.py`) reproduce
//! PyTorch's outputs; sizes are inferred, bad checkpoints and options give clear errors.

use candle_mha_test_support as common;

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::{find_transformer_modules, StateDict};
use candle_mha::transformer::{
    Activation, DecoderOptions, EncoderOptions, LoadTransformer, Transformer, TransformerDecoder,
    TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer, TransformerLoadOptions,
    TransformerOptions,
};
use common::{assert_close, Fixture};

/// PyTorch's f32 slow path vs ours: both f32, different summation orders.
const TOL: f64 = 1e-5;

fn ckpt(name: &str) -> PathBuf {
    common::fixtures_dir().join("checkpoints").join(name)
}

fn opts(exp: &Fixture) -> Result<TransformerLoadOptions> {
    Ok(TransformerLoadOptions::new(exp.usize("num_heads")?)
        .with_batch_first(exp.flag("batch_first")?))
}

#[test]
fn encoder_stack_from_safetensors_and_pickles() -> Result<()> {
    for (files, expected) in [
        (
            &["encoder_seq.safetensors", "encoder_seq.pt"][..],
            "encoder_seq_forward_expected.safetensors",
        ),
        (
            &[
                "encoder_bf.safetensors",
                "encoder_bf.pt",
                "encoder_bf_module.pt",
                "encoder_bf_nested_state_dict.pt",
                "encoder_bf_legacy.pt",
            ][..],
            "encoder_bf_forward_expected.safetensors",
        ),
    ] {
        let exp = Fixture::load(&ckpt(expected))?;
        for file in files {
            let (enc, report) = TransformerEncoder::load_file(
                ckpt(file),
                "",
                &opts(&exp)?,
                DType::F32,
                &Device::Cpu,
            )?;
            assert!(report.is_clean(), "{report}");
            assert_eq!(report.loaded.len(), 24, "{report}");
            assert_eq!(report.module, "TransformerEncoder");
            assert!(report.source.ends_with(file), "{}", report.source);
            assert_eq!((enc.layers().len(), enc.has_final_norm()), (2, false));
            let out = enc.forward(exp.tensor("input")?, &EncoderOptions::new())?;
            assert_close(file, &out, exp.tensor("output")?, TOL)?;
        }
    }
    Ok(())
}

#[test]
fn encoder_with_key_padding_and_in_f64() -> Result<()> {
    let exp = Fixture::load(&ckpt("encoder_bf_forward_expected.safetensors"))?;
    let (enc, _) = TransformerEncoder::load_file(
        ckpt("encoder_bf.safetensors"),
        "",
        &opts(&exp)?,
        DType::F32,
        &Device::Cpu,
    )?;
    let x = exp.tensor("input")?;
    let pad = exp.tensor("src_key_padding_mask")?.clone();
    let out = enc.forward(x, &EncoderOptions::new().with_src_key_padding_mask(pad))?;
    assert_close("padded", &out, exp.tensor("output_padded")?, TOL)?;
    // f64 weights cast from f32: the same function, computed more exactly.
    let (enc, report) = TransformerEncoder::load_file(
        ckpt("encoder_bf.safetensors"),
        "",
        &opts(&exp)?,
        DType::F64,
        &Device::Cpu,
    )?;
    assert_eq!(report.casts.len(), 24, "{report}");
    let out = enc.forward(&x.to_dtype(DType::F64)?, &EncoderOptions::new())?;
    assert_eq!(out.dtype(), DType::F64);
    assert_close("f64", &out, exp.tensor("output")?, TOL)?;
    Ok(())
}

#[test]
fn pre_norm_gelu_encoder_without_bias_with_final_norm() -> Result<()> {
    let exp = Fixture::load(&ckpt("encoder_nf_gelu_forward_expected.safetensors"))?;
    let sd = StateDict::load(ckpt("encoder_nf_gelu.safetensors"))?;
    let o = TransformerLoadOptions::new(exp.usize("nhead")?)
        .with_batch_first(true)
        .with_norm_first(true)
        .with_activation(Activation::Gelu);
    let (enc, report) = TransformerEncoder::load(&sd, "", &o, DType::F32, &Device::Cpu)?;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.loaded.len(), 13, "{report}");
    assert!(enc.has_final_norm());
    let out = enc.forward(exp.tensor("input")?, &EncoderOptions::new())?;
    assert_close("nf_gelu", &out, exp.tensor("output")?, TOL)?;
    // The options matter: post-norm ReLU weights give other numbers.
    let (wrong, _) = TransformerEncoder::load(
        &sd,
        "",
        &TransformerLoadOptions::new(2).with_batch_first(true),
        DType::F32,
        &Device::Cpu,
    )?;
    let out = wrong.forward(exp.tensor("input")?, &EncoderOptions::new())?;
    assert!(assert_close("defaults", &out, exp.tensor("output")?, TOL).is_err());
    Ok(())
}

#[test]
fn whole_pickled_transformer_reproduces_pytorch() -> Result<()> {
    let exp = Fixture::load(&ckpt("transformer_forward_expected.safetensors"))?;
    let o = TransformerLoadOptions::new(exp.usize("nhead")?);
    let (src, tgt) = (exp.tensor("src")?, exp.tensor("tgt")?);
    for file in ["transformer_module.pt", "transformer.safetensors"] {
        let (tr, report) = Transformer::load_file(ckpt(file), "", &o, DType::F32, &Device::Cpu)?;
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.loaded.len(), 34, "{report}");
        let out = tr.forward(src, tgt, &TransformerOptions::new())?;
        assert_close(file, &out, exp.tensor("output")?, TOL)?;
        let causal = TransformerOptions::new().with_tgt_mask(exp.tensor("tgt_mask")?.clone());
        let out = tr.forward(src, tgt, &causal)?;
        assert_close(file, &out, exp.tensor("output_causal")?, TOL)?;
        let out = tr.forward(
            src,
            tgt,
            &TransformerOptions::new().with_tgt_is_causal(true),
        )?;
        assert_close(file, &out, exp.tensor("output_causal")?, TOL)?;
    }
    Ok(())
}

#[test]
fn parts_of_a_transformer_at_their_prefixes() -> Result<()> {
    let exp = Fixture::load(&ckpt("transformer_forward_expected.safetensors"))?;
    let sd = StateDict::load(ckpt("transformer_module.pt"))?;
    let o = TransformerLoadOptions::new(2);
    let dev = &Device::Cpu;
    let (enc, report) = TransformerEncoder::load(&sd, "encoder", &o, DType::F32, dev)?;
    assert!(report.is_clean() && report.prefix == "encoder.", "{report}");
    let memory = enc.forward(exp.tensor("src")?, &EncoderOptions::new())?;
    assert_close("memory", &memory, exp.tensor("memory")?, TOL)?;
    let (dec, report) = TransformerDecoder::load(&sd, "decoder.", &o, DType::F32, dev)?;
    assert!(report.is_clean(), "{report}");
    let out = dec.forward(exp.tensor("tgt")?, &memory, &DecoderOptions::new())?;
    assert_close("decoder", &out, exp.tensor("output")?, TOL)?;
    // The encoder's layers one by one give the stack's output (it has no final norm here).
    let exp = Fixture::load(&ckpt("encoder_seq_forward_expected.safetensors"))?;
    let sd = StateDict::load(ckpt("encoder_seq.pt"))?;
    let mut x = exp.tensor("input")?.clone();
    for i in 0..2 {
        let (layer, report) = TransformerEncoderLayer::load(
            &sd,
            &format!("layers.{i}"),
            &TransformerLoadOptions::new(4),
            DType::F32,
            dev,
        )?;
        assert!(report.is_clean() && report.loaded.len() == 12, "{report}");
        x = layer.forward(&x, &EncoderOptions::new())?;
    }
    assert_close("layer by layer", &x, exp.tensor("output")?, TOL)?;
    Ok(())
}

/// `encoder_seq`'s state_dict without `layers.0.norm2.weight`, with an extra tensor.
fn damaged() -> Result<StateDict> {
    let sd = StateDict::load(ckpt("encoder_seq.safetensors"))?;
    let extra = (
        "layers.1.extra".to_string(),
        Tensor::zeros(3, DType::F32, &Device::Cpu)?,
    );
    Ok(StateDict::from_tensors(
        sd.tensors()
            .iter()
            .filter(|(n, _)| n != "layers.0.norm2.weight")
            .cloned()
            .chain([extra]),
    ))
}

#[test]
fn missing_norm2_weight_is_named_and_non_strict_reports_it() -> Result<()> {
    let sd = damaged()?;
    let o = TransformerLoadOptions::new(4);
    let e = TransformerEncoder::load(&sd, "", &o, DType::F32, &Device::Cpu)
        .expect_err("strict loading must fail")
        .to_string();
    assert!(
        e.contains("Missing key(s) in state_dict: \"layers.0.norm2.weight\""),
        "{e}"
    );
    assert!(
        e.contains("Unexpected key(s) in state_dict: \"layers.1.extra\""),
        "{e}"
    );
    assert!(e.contains("TransformerEncoder"), "{e}");
    let (enc, report) =
        TransformerEncoder::load(&sd, "", &o.with_strict(false), DType::F32, &Device::Cpu)?;
    assert_eq!(report.missing, ["layers.0.norm2.weight"]);
    assert_eq!(report.unexpected, ["layers.1.extra"]);
    assert_eq!(report.loaded.len(), 23);
    assert_eq!(enc.layers().len(), 2);
    Ok(())
}

#[test]
fn bad_nhead_and_prefix_are_clear_errors() -> Result<()> {
    let sd = StateDict::load(ckpt("encoder_seq.safetensors"))?;
    let dev = &Device::Cpu;
    let e = TransformerEncoder::load(&sd, "", &TransformerLoadOptions::new(3), DType::F32, dev)
        .expect_err("nhead 3 must not divide d_model 16")
        .to_string();
    assert!(e.contains("nhead = 3") && e.contains("d_model = 16"), "{e}");
    assert!(e.contains("[1, 2, 4, 8, 16]"), "{e}");
    let e = TransformerEncoder::load(&sd, "", &TransformerLoadOptions::new(0), DType::F32, dev)
        .expect_err("nhead 0")
        .to_string();
    assert!(e.contains("nhead = 0"), "{e}");
    let e = Transformer::load(&sd, "", &TransformerLoadOptions::new(4), DType::F32, dev)
        .expect_err("an encoder is not a whole Transformer")
        .to_string();
    assert!(
        e.contains("no Transformer at prefix \"\"") && e.contains("(root): TransformerEncoder"),
        "{e}"
    );
    let e = TransformerEncoder::load(
        &sd,
        "model",
        &TransformerLoadOptions::new(4),
        DType::F32,
        dev,
    )
    .expect_err("nothing at model.")
    .to_string();
    assert!(e.contains("\"model.layers.N.\""), "{e}");
    Ok(())
}

#[test]
fn discovery() -> Result<()> {
    let sd = StateDict::load(ckpt("transformer_module.pt"))?;
    let found: Vec<String> = find_transformer_modules(&sd)
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(found.len(), 5, "{found:?}");
    assert!(found[0].starts_with("(root): Transformer num_encoder_layers=1 num_decoder_layers=1 d_model=8 dim_feedforward=16 bias=true"), "{found:?}");
    let sd = StateDict::load(ckpt("encoder_nf_gelu.safetensors"))?;
    let found: Vec<String> = find_transformer_modules(&sd)
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("(root): TransformerEncoder num_layers=2 final_norm=true d_model=8 dim_feedforward=12 bias=false"), "{found:?}");
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("layers.1: TransformerEncoderLayer d_model=8")),
        "{found:?}"
    );
    Ok(())
}

#[test]
fn imported_encoder_trains() -> Result<()> {
    use candle_mha::candle::Var;
    use candle_nn::Optimizer;
    let exp = Fixture::load(&ckpt("encoder_nf_gelu_forward_expected.safetensors"))?;
    let o = TransformerLoadOptions::new(2)
        .with_batch_first(true)
        .with_norm_first(true)
        .with_activation(Activation::Gelu);
    let (enc, _) = TransformerEncoder::load_file(
        ckpt("encoder_nf_gelu.safetensors"),
        "",
        &o,
        DType::F32,
        &Device::Cpu,
    )?;
    // The loaded parameters are the module's variables: Var::from_tensor shares them.
    let params = enc.named_parameters();
    assert_eq!(params.len(), 13);
    let vars = params
        .iter()
        .map(|(_, t)| Var::from_tensor(t))
        .collect::<candle_mha::candle::Result<Vec<_>>>()?;
    let x = exp.tensor("input")?;
    let loss = |e: &candle_mha::transformer::TransformerEncoder| -> Result<Tensor> {
        Ok(e.forward(x, &EncoderOptions::new())?.sqr()?.mean_all()?)
    };
    let before = loss(&enc)?;
    let grads = before.backward()?;
    for (name, t) in &params {
        let g = grads
            .get(t)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = g.sqr()?.sum_all()?.to_scalar::<f32>()?;
        assert!(norm > 0.0, "zero gradient for {name}");
    }
    let mut sgd = candle_nn::SGD::new(vars, 0.05)?;
    sgd.step(&grads)?;
    let after = loss(&enc)?.to_scalar::<f32>()?;
    assert!(after < before.to_scalar::<f32>()?, "{after}");
    Ok(())
}

#[test]
fn decoder_layer_loads_and_an_encoder_layer_is_not_one() -> Result<()> {
    let o = TransformerLoadOptions::new(2);
    let path = ckpt("transformer_module.pt");
    let (_, report) = TransformerDecoderLayer::load_file(
        &path,
        "decoder.layers.0",
        &o,
        DType::F32,
        &Device::Cpu,
    )?;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.loaded.len(), 18, "{report}");
    let e =
        TransformerDecoderLayer::load_file(&path, "encoder.layers.0", &o, DType::F32, &Device::Cpu)
            .expect_err("an encoder layer has no multihead_attn")
            .to_string();
    assert!(
        e.contains("\"multihead_attn.in_proj_weight\"") && e.contains("\"norm3.weight\""),
        "{e}"
    );
    // The error starts with what is wrong and names the loader the keys fit.
    assert!(
        e.starts_with("Error(s) in loading state_dict for TransformerDecoderLayer: 6 missing key(s); nothing was loaded (strict). The keys fit another module: load them with TransformerEncoderLayer::load."),
        "{e}"
    );
    let e = candle_mha::transformer::TransformerEncoderLayer::load_file(
        &path,
        "decoder.layers.0",
        &o,
        DType::F32,
        &Device::Cpu,
    )
    .expect_err("a decoder layer is not an encoder layer")
    .to_string();
    assert!(
        e.starts_with("Error(s) in loading state_dict for TransformerEncoderLayer: ")
            && e.contains(" unexpected key(s); nothing was loaded (strict). The keys fit another module: load them with TransformerDecoderLayer::load."),
        "{e}"
    );
    Ok(())
}
