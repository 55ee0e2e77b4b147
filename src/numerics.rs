//! Numerical choices shared by the layers and the attention (below both): which dtype a
//! normalisation or reduction computes in.

use candle::DType;

/// The dtype softmax, layer norm and cross-entropy compute in: f32 for the half types
/// (f16/bf16 sums lose too much), the input dtype otherwise.
pub(crate) fn softmax_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}
