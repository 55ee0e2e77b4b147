//! The Transformer layers check their masks before the attention does: an error names the
//! layer the user called, its option and `batch_first`, with a hint when the shapes fit the
//! other `batch_first`.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::candle_nn::VarMap;
use candle_mha::seeded_var_builder;
use candle_mha::transformer::{
    EncoderOptions, FinalNorm, Transformer, TransformerConfig, TransformerEncoder,
    TransformerEncoderLayerConfig, TransformerOptions,
};
use common::randn;

/// A mask built for the other `batch_first` is reported by the layer the user called, under
/// its own option's name, with the hint; PyTorch would only fail inside the attention.
#[test]
fn masks_are_checked_by_the_layer_called_and_name_batch_first() -> Result<()> {
    let varmap = VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
    let cfg = TransformerEncoderLayerConfig::new(8, 2).with_dim_feedforward(16);
    let encoder = TransformerEncoder::new(cfg, 2, FinalNorm::None, vb.pp("enc"))?;
    // (S, N, E) = (3, 7, 8) read with batch_first = false; the masks fit (N, S, E).
    let src = randn(&[3, 7, 8], 1)?;
    let square = Tensor::zeros((7, 7), DType::U8, &Device::Cpu)?;
    let e = encoder
        .forward(&src, &EncoderOptions::new().with_mask(square))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "TransformerEncoder: EncoderOptions::mask has shape [7, 7], expected (L, S) = (3, 3)"
        ) && e.contains("fit batch_first = true"),
        "{e}"
    );
    let padding = Tensor::zeros((3, 7), DType::U8, &Device::Cpu)?;
    let opts = EncoderOptions::new().with_src_key_padding_mask(padding.clone());
    let e = encoder.layers()[0]
        .forward(&src, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("TransformerEncoderLayer: EncoderOptions::src_key_padding_mask has shape [3, 7], expected (N, S) = (7, 3)"),
        "{e}"
    );
    // The whole model names TransformerOptions' fields, for the decoder's masks too.
    let model = Transformer::new(
        TransformerConfig::new(8, 2)
            .with_num_encoder_layers(1)
            .with_num_decoder_layers(1)
            .with_dim_feedforward(16),
        vb.pp("model"),
    )?;
    let tgt = randn(&[4, 7, 8], 2)?;
    let opts = TransformerOptions::new().with_tgt_key_padding_mask(Tensor::zeros(
        (4, 7),
        DType::U8,
        &Device::Cpu,
    )?);
    let e = model.forward(&src, &tgt, &opts).unwrap_err().to_string();
    assert!(
        e.starts_with("Transformer: TransformerOptions::tgt_key_padding_mask has shape [4, 7]")
            && e.contains("fit batch_first = true"),
        "{e}"
    );
    // Masks of the right shapes pass.
    let ok = EncoderOptions::new().with_src_key_padding_mask(padding.t()?.contiguous()?);
    assert_eq!(encoder.forward(&src, &ok)?.dims(), [3, 7, 8]);
    Ok(())
}
