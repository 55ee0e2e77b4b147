//! The Transformer layers (`candle_mha::nn::transformer`) against PyTorch 2.15: outputs and
//! gradients of every parameter and input (fixtures made by
//! `scripts/make_transformer_fixtures.py`), training through them, and their errors.

mod common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::candle_nn::VarMap;
use candle_mha::nn::{
    Activation, DecoderOptions, EncoderOptions, Transformer, TransformerConfig, TransformerDecoder,
    TransformerDecoderLayerConfig, TransformerEncoder, TransformerEncoderLayer,
    TransformerEncoderLayerConfig, TransformerOptions,
};
use candle_mha::seeded_var_builder;

fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
    Ok(candle_mha::rng::normal(
        0.0,
        1.0,
        shape,
        DType::F32,
        &Device::Cpu,
        seed,
    )?)
}

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
        true,
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
    let varmap = VarMap::new();
    let cfg = TransformerDecoderLayerConfig::new(8, 2)
        .with_dim_feedforward(16)
        .with_bias(false);
    let dec = TransformerDecoder::new(
        cfg,
        1,
        false,
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
    assert!(err.contains("attn_mask"), "{err}");
    let dec = TransformerDecoder::new(
        TransformerDecoderLayerConfig::new(8, 2).with_dim_feedforward(16),
        1,
        true,
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
