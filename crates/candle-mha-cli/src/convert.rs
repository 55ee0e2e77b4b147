//! `mha convert IN OUT`: a PyTorch checkpoint to safetensors, checked after writing.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_mha::candle::{DType, Tensor};
use candle_mha::checkpoint::{cast, find_attention_modules, StateDict};

/// Arguments of `mha convert`.
#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// The checkpoint to read (.pt, .pth, .bin or .safetensors).
    pub input: PathBuf,
    /// The safetensors file to write (atomically).
    pub output: PathBuf,
    /// Cast every floating tensor to this dtype (default: keep).
    #[arg(long, value_parser = super::choices::DtypeParser)]
    pub dtype: Option<DType>,
    /// Keep only the tensors under this prefix, with the prefix removed (e.g. to extract
    /// `layers.0.self_attn` as a bare nn.MultiheadAttention state_dict).
    #[arg(long, default_value = "")]
    pub prefix: String,
}

/// Converts, writes, reads the file back and compares every tensor.
pub fn run(args: &ConvertArgs) -> Result<()> {
    let input = StateDict::load(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let selected = if args.prefix.is_empty() {
        input
    } else {
        input.under(&args.prefix)
    };
    if !selected.skipped().is_empty() {
        // The written file would lack them, and PyTorch's strict load would fail on it.
        let list: Vec<String> = selected
            .skipped()
            .iter()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect();
        bail!(
            "{} tensor(s) of {} cannot be read, so the converted file would lack them (pick a \
             --prefix without them, or cast them in PyTorch):\n  {}",
            list.len(),
            args.input.display(),
            list.join("\n  ")
        )
    }
    if selected.is_empty() {
        bail!(
            "no tensor under prefix \"{}\" in {}",
            args.prefix,
            args.input.display()
        )
    }
    let floats_cast = |sd: &StateDict, dtype: DType| -> Result<StateDict> {
        let tensors = sd
            .tensors()
            .iter()
            .map(|(n, t)| {
                Ok((
                    n.clone(),
                    if t.dtype().is_float() {
                        cast(t, dtype)?
                    } else {
                        t.clone()
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StateDict::from_tensors(tensors))
    };
    let converted = match args.dtype {
        Some(dtype) => floats_cast(&selected, dtype)?,
        None => StateDict::from_tensors(selected.tensors().to_vec()),
    };
    converted.save_safetensors(&args.output)?;

    // Validate: the written file must hold exactly the converted tensors.
    let back = StateDict::load(&args.output)?;
    if back.len() != converted.len() {
        bail!(
            "wrote {} tensors but read back {}",
            converted.len(),
            back.len()
        )
    }
    for (name, t) in converted.tensors() {
        let b = back
            .get(name)
            .with_context(|| format!("{name} missing after writing"))?;
        let as_f64 = |x: &Tensor| cast(&x.flatten_all()?, DType::F64)?.to_vec1::<f64>();
        let same = b.dims() == t.dims()
            && b.dtype() == t.dtype()
            && as_f64(b)?
                .iter()
                .zip(as_f64(t)?)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        if !same {
            bail!("{name} differs after writing")
        }
    }
    let params: usize = converted
        .tensors()
        .iter()
        .map(|(_, t)| t.elem_count())
        .sum();
    println!(
        "{} -> {}: {} tensors, {params} parameters, verified",
        args.input.display(),
        args.output.display(),
        converted.len()
    );
    for a in find_attention_modules(&converted) {
        println!("  attention module {a}");
    }
    Ok(())
}
