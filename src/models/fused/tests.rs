//! The fused ops against the same math written with candle's generic ops (forward and every
//! gradient), f32 ≤ 1e-5 and f64 ≤ 1e-12 relative to the largest reference element.

use candle::{DType, Device, Result, Tensor, Var, D};

use super::{gelu_erf, layer_norm};
use crate::rng::normal;

fn rel_err(a: &Tensor, b: &Tensor) -> Result<f64> {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let scale = b.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    let worst = a.iter().zip(&b).fold(0f64, |m, (x, y)| {
        if x.is_finite() {
            m.max((x - y).abs())
        } else {
            f64::INFINITY
        }
    });
    Ok(worst / scale)
}

fn check(what: &str, a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    let e = rel_err(a, b)?;
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.1e}");
    Ok(())
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        _ => 1e-5,
    }
}

fn reference_layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    centered
        .broadcast_div(&(var + eps)?.sqrt()?)?
        .broadcast_mul(w)?
        .broadcast_add(b)
}

/// `0.5·x·(1 + erf(x/√2))` from candle's `erf`, whose backward uses exact constants.
fn reference_gelu(x: &Tensor) -> Result<Tensor> {
    (((x * std::f64::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)? * x)? * 0.5
}

/// (leading dims, D, dtype, transpose the first two dims of x before the op).
const CASES: [(&[usize], usize, DType, bool); 6] = [
    (&[3, 5], 7, DType::F32, false),
    (&[2, 33], 64, DType::F64, false),
    (&[1], 256, DType::F32, false),
    (&[4, 1, 3], 17, DType::F64, false),
    (&[5, 3], 40, DType::F32, true),
    (&[6, 2], 9, DType::F64, true),
];

#[test]
fn layer_norm_matches_generic_ops_forward_and_gradients() -> Result<()> {
    let dev = Device::Cpu;
    for (case, &(lead, d, dtype, transpose)) in CASES.iter().enumerate() {
        let seed = 100 + case as u64;
        let shape: Vec<usize> = lead.iter().copied().chain([d]).collect();
        let x = Var::from_tensor(&normal(0.5, 2.0, shape.clone(), dtype, &dev, seed)?)?;
        let w = Var::from_tensor(&normal(1.0, 0.5, d, dtype, &dev, seed + 1)?)?;
        let b = Var::from_tensor(&normal(0.0, 0.5, d, dtype, &dev, seed + 2)?)?;
        let input = match transpose {
            true => x.as_tensor().transpose(0, 1)?,
            false => x.as_tensor().clone(),
        };
        let r = normal(0.0, 1.0, input.shape(), dtype, &dev, seed + 3)?;
        let fused = layer_norm(&input, &w, &b, 1e-5)?;
        let reference = reference_layer_norm(&input, &w, &b, 1e-5)?;
        let what = format!("case {case} {shape:?} {dtype:?}");
        check(&format!("{what} y"), &fused, &reference, tol(dtype))?;
        let gf = (fused * &r)?.sum_all()?.backward()?;
        let gr = (reference * &r)?.sum_all()?.backward()?;
        for (name, v) in [("dx", &x), ("dw", &w), ("db", &b)] {
            let (a, e) = (gf.get(v).expect("fused grad"), gr.get(v).expect("ref grad"));
            check(&format!("{what} {name}"), a, e, tol(dtype))?;
        }
    }
    Ok(())
}

#[test]
fn gelu_matches_generic_ops_forward_and_gradient() -> Result<()> {
    let dev = Device::Cpu;
    for (case, &(lead, d, dtype, transpose)) in CASES.iter().enumerate() {
        let shape: Vec<usize> = lead.iter().copied().chain([d]).collect();
        // Wide enough to reach erf's saturated tails.
        let x = Var::from_tensor(&normal(
            0.0,
            3.0,
            shape.clone(),
            dtype,
            &dev,
            200 + case as u64,
        )?)?;
        let input = match transpose {
            true => x.as_tensor().transpose(0, 1)?,
            false => x.as_tensor().clone(),
        };
        let r = normal(0.0, 1.0, input.shape(), dtype, &dev, 300 + case as u64)?;
        let fused = gelu_erf(&input)?;
        let reference = reference_gelu(&input)?;
        let what = format!("case {case} {shape:?} {dtype:?}");
        check(&format!("{what} y"), &fused, &reference, tol(dtype))?;
        let gf = (fused * &r)?.sum_all()?.backward()?;
        let gr = (reference * &r)?.sum_all()?.backward()?;
        let (a, e) = (
            gf.get(&x).expect("fused grad"),
            gr.get(&x).expect("ref grad"),
        );
        check(&format!("{what} dx"), a, e, tol(dtype))?;
    }
    Ok(())
}

#[test]
fn layer_norm_shape_errors_name_the_shapes() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::zeros((2, 5), DType::F32, &dev)?;
    let w = Tensor::ones(4, DType::F32, &dev)?;
    let b = Tensor::zeros(4, DType::F32, &dev)?;
    let err = layer_norm(&x, &w, &b, 1e-5).unwrap_err().to_string();
    assert!(err.contains("x [2, 5] must end in D = 4"), "{err}");
    Ok(())
}
