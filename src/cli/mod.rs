//! The subcommands of the `mha` binary, one per file.

mod checkpoint_dir;
pub mod convert;
mod data_source;
pub mod eval;
pub mod generate;
pub mod info;
pub mod inspect;
pub mod plot;
pub mod prepare;
pub mod train;
pub mod vocab_matrix;

use candle_mha::candle::DType;

/// Parses a dtype name as the CLI accepts it (`f32`, `f64`, `f16`, `bf16`).
pub fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" | "float32" => Ok(DType::F32),
        "f64" | "float64" => Ok(DType::F64),
        "f16" | "float16" | "half" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => Err(format!(
            "unknown dtype \"{other}\": expected f32, f64, f16 or bf16"
        )),
    }
}
