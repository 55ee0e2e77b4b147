//! Imports a PyTorch-saved `nn.TransformerEncoder` (the whole module, pickled with
//! `torch.save(model)`: a committed fixture made by `scripts/make_checkpoint_fixtures.py`),
//! runs it on PyTorch's input and prints the largest difference from PyTorch's output.
//!
//! ```text
//! cargo run --release --example import_transformer [-- CHECKPOINT EXPECTED]
//! ```
//! Without arguments it reads `tests/fixtures/checkpoints/encoder_bf_module.pt` and
//! `encoder_bf_forward_expected.safetensors` (`input` and `output`; metadata `num_heads` and
//! `batch_first`). The PyTorch side was, in short:
//!
//! ```python
//! layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
//! model = nn.TransformerEncoder(layer, num_layers=2).eval()
//! torch.save(model, "encoder_bf_module.pt")
//! output = model(input)
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::candle::DType;
use candle_mha::checkpoint::{find_transformer_modules, StateDict};
use candle_mha::transformer::EncoderOptions;
use candle_mha::transformer::{LoadTransformer, TransformerEncoder, TransformerLoadOptions};

fn main() -> Result<()> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints");
    let mut args = std::env::args().skip(1);
    let checkpoint = args
        .next()
        .map_or_else(|| fixtures.join("encoder_bf_module.pt"), PathBuf::from);
    let expected = args.next().map_or_else(
        || fixtures.join("encoder_bf_forward_expected.safetensors"),
        PathBuf::from,
    );

    // What the checkpoint holds (as `mha info` prints it).
    let sd = StateDict::load(&checkpoint)?;
    for m in find_transformer_modules(&sd) {
        println!("found {m}");
    }

    // The expected file says what the weights cannot: the head count and the layout.
    let exp = StateDict::load(&expected)?;
    let meta = |k: &str| {
        exp.metadata()
            .get(k)
            .with_context(|| format!("{}: no metadata {k}", expected.display()))
    };
    let nhead: usize = meta("num_heads")?.parse()?;
    let batch_first = meta("batch_first")? == "true";
    let opts = TransformerLoadOptions::new(nhead).with_batch_first(batch_first);
    // The device from `MHA_DEVICE` (default `auto`), freed GPU memory kept for reuse.
    let spec = std::env::var("MHA_DEVICE").unwrap_or_else(|_| "auto".into());
    let (device, notice) = candle_mha::device::select_device(&spec)?;
    candle_mha::runtime::keep_freed_gpu_memory(&device)?;
    eprintln!("{notice}");
    let (encoder, report) =
        TransformerEncoder::load_file(&checkpoint, "", &opts, DType::F32, &device)?;
    print!("{report}");

    let tensor = |k: &str| {
        exp.get(k)
            .with_context(|| format!("{}: no tensor {k}", expected.display()))
    };
    let input = &tensor("input")?.to_device(&device)?;
    let output = encoder.forward(input, &EncoderOptions::new())?;
    let reference = &tensor("output")?.to_device(&device)?;
    let max_diff = (&output - reference)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let scale = reference.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    println!(
        "input {:?} -> output {:?}; max |ours - PyTorch| = {max_diff:.3e} (relative {:.3e})",
        input.dims(),
        output.dims(),
        max_diff / scale
    );
    Ok(())
}
