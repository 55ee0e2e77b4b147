//! [`cast`]: `Tensor::to_dtype` for checkpoint tensors, safe for every dtype a checkpoint
//! can hold.

use candle::{DType, Result, Tensor};

/// `t` in `dtype`. candle 0.11's direct `F8E4M3 → F64` cast never returns (its CPU kernel
/// calls itself), so float8 goes through `f32`, which holds every float8 value exactly.
///
/// # Shapes
/// Any; the shape is kept.
///
/// PyTorch equivalent: `t.to(dtype)`.
pub fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == DType::F8E4M3 && dtype == DType::F64 {
        t.to_dtype(DType::F32)?.to_dtype(DType::F64)
    } else {
        t.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float8_to_f64_returns_the_exact_values() -> Result<()> {
        let x = Tensor::new(&[1.0f32, -2.5, 0.1, 448.0], &candle::Device::Cpu)?;
        let f8 = x.to_dtype(DType::F8E4M3)?;
        let got = cast(&f8, DType::F64)?.to_vec1::<f64>()?;
        // 0.1 rounds to 0.1015625 in float8_e4m3fn (3 mantissa bits).
        assert_eq!(got, [1.0, -2.5, 0.1015625, 448.0]);
        assert_eq!(cast(&x, DType::F64)?.dtype(), DType::F64);
        Ok(())
    }
}
