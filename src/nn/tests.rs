//! The fused ops against the same math written with candle's generic ops (forward and every
//! gradient), f32 ≤ 1e-5 and f64 ≤ 1e-12 relative to the largest reference element.

use candle::{DType, Device, Result, Tensor, Var, D};

use super::gelu::gelu_erf_ops;
use super::layer_norm::layer_norm;
use super::{cross_entropy_rows, gelu_erf, linear_gelu, mlp};
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

pub(super) fn check(what: &str, a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    let e = rel_err(a, b)?;
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.1e}");
    Ok(())
}

pub(super) fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        _ => 1e-5,
    }
}

/// `x`, or its first two dimensions swapped (a strided input).
fn maybe_transposed(x: &Var, transpose: bool) -> Result<Tensor> {
    match transpose {
        true => x.as_tensor().transpose(0, 1),
        false => Ok(x.as_tensor().clone()),
    }
}

/// `fused` against `reference` (same graph inputs), then the gradients of `sum(out · r)` for
/// each named variable, `r` drawn from N(0, 1) with `r_seed`.
fn check_op(
    what: &str,
    fused: Tensor,
    reference: Tensor,
    r_seed: u64,
    vars: &[(&str, &Var)],
) -> Result<()> {
    let tol = tol(fused.dtype());
    let r = &normal(
        0.0,
        1.0,
        fused.shape(),
        fused.dtype(),
        fused.device(),
        r_seed,
    )?;
    check(&format!("{what} y"), &fused, &reference, tol)?;
    let gf = (fused * r)?.sum_all()?.backward()?;
    let gr = (reference * r)?.sum_all()?.backward()?;
    for (name, v) in vars {
        let (a, e) = (gf.get(v).expect("fused grad"), gr.get(v).expect("ref grad"));
        check(&format!("{what} {name}"), a, e, tol)?;
    }
    Ok(())
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
        let input = maybe_transposed(&x, transpose)?;
        let fused = layer_norm(&input, &w, &b, 1e-5)?;
        let reference = reference_layer_norm(&input, &w, &b, 1e-5)?;
        let what = format!("case {case} {shape:?} {dtype:?}");
        let grads = [("dx", &x), ("dw", &w), ("db", &b)];
        check_op(&what, fused, reference, seed + 3, &grads)?;
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
        let input = maybe_transposed(&x, transpose)?;
        let fused = gelu_erf(&input)?;
        let reference = gelu_erf_ops(&input)?;
        let what = format!("case {case} {shape:?} {dtype:?}");
        check_op(&what, fused, reference, 300 + case as u64, &[("dx", &x)])?;
    }
    Ok(())
}

/// fc1 + GELU as one op against `gelu_erf_ops(x·Wᵀ + b)` in generic ops, every gradient;
/// twice through one graph (the second use of `x` adds into its gradient), so the op's kept
/// pre-activation must belong to its own call.
#[test]
fn linear_gelu_matches_generic_ops_forward_and_gradients() -> Result<()> {
    let dev = Device::Cpu;
    for (case, &(lead, k, dtype, transpose)) in CASES.iter().enumerate() {
        let seed = 400 + 10 * case as u64;
        let n = 2 * k + 3;
        let shape: Vec<usize> = lead.iter().copied().chain([k]).collect();
        let x = Var::from_tensor(&normal(0.0, 1.0, shape.clone(), dtype, &dev, seed)?)?;
        let w = Var::from_tensor(&normal(0.0, 1.0, (n, k), dtype, &dev, seed + 1)?)?;
        let b = Var::from_tensor(&normal(0.0, 1.0, n, dtype, &dev, seed + 2)?)?;
        let input = maybe_transposed(&x, transpose)?;
        let w2 = (w.as_tensor() * 0.5)?;
        let fused = (linear_gelu(&input, &w, Some(&b))? + linear_gelu(&input, &w2, Some(&b))?)?;
        let reference = |w: &Tensor| -> Result<Tensor> {
            let m: usize = input.dims()[..input.rank() - 1].iter().product();
            let mut out_shape = input.dims().to_vec();
            *out_shape.last_mut().unwrap() = n;
            let pre = input
                .reshape((m, k))?
                .matmul(&w.t()?)?
                .broadcast_add(&b)?
                .reshape(out_shape)?;
            gelu_erf_ops(&pre)
        };
        let reference = (reference(&w)? + reference(&w2)?)?;
        let what = format!("case {case} {shape:?} {dtype:?}");
        let grads = [("dx", &x), ("dw", &w), ("db", &b)];
        check_op(&what, fused, reference, seed + 3, &grads)?;
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

/// `−mean(log_softmax(x)[target])` over the kept rows, with candle's generic ops.
fn reference_cross_entropy(x: &Tensor, targets: &[u32], keep: &[u8]) -> Result<Tensor> {
    let (r, _) = x.dims2()?;
    let ids: Vec<u32> = targets
        .iter()
        .zip(keep)
        .map(|(&t, &k)| if k != 0 { t } else { 0 })
        .collect();
    let ids = Tensor::from_vec(ids, (r, 1), x.device())?;
    let picked = candle_nn::ops::log_softmax(x, D::Minus1)?
        .gather(&ids, 1)?
        .squeeze(1)?;
    let w = Tensor::from_vec(keep.to_vec(), r, x.device())?.to_dtype(x.dtype())?;
    let count = keep.iter().filter(|k| **k != 0).count() as f64;
    (picked * w)?.sum_all()? / -count
}

#[test]
fn cross_entropy_matches_generic_ops_loss_and_gradient() -> Result<()> {
    let dev = Device::Cpu;
    for (case, &(r, v, dtype)) in [
        (7, 5, DType::F32),
        (40, 37, DType::F64),
        (70, 300, DType::F32),
        (3, 1, DType::F64),
    ]
    .iter()
    .enumerate()
    {
        let x = Var::from_tensor(&normal(0.0, 4.0, (r, v), dtype, &dev, 400 + case as u64)?)?;
        // Every third row does not count and holds an out-of-range target (padding).
        let keep: Vec<u8> = (0..r).map(|i| u8::from(i % 3 != 1)).collect();
        let targets: Vec<u32> = (0..r)
            .map(|i| {
                if keep[i] != 0 {
                    ((i * 7) % v) as u32
                } else {
                    9999
                }
            })
            .collect();
        let t = Tensor::from_vec(targets.clone(), r, &dev)?;
        let m = Tensor::from_vec(keep.clone(), r, &dev)?;
        let fused = cross_entropy_rows(&x, &t, &m)?;
        let reference = reference_cross_entropy(&x, &targets, &keep)?;
        let what = format!("case {case} ({r}, {v}) {dtype:?}");
        check(&format!("{what} loss"), &fused, &reference, tol(dtype))?;
        // A loss scaled by 3 checks that the incoming gradient is used.
        let gf = (fused * 3.0)?.backward()?;
        let gr = (reference * 3.0)?.backward()?;
        check(
            &format!("{what} dx"),
            gf.get(&x).expect("fused"),
            gr.get(&x).expect("ref"),
            tol(dtype),
        )?;
    }
    Ok(())
}

#[test]
fn cross_entropy_errors_name_the_problem() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::zeros((2, 4), DType::F32, &dev)?;
    let t = Tensor::new(&[1u32, 4], &dev)?;
    let err = |m: &[u8]| {
        cross_entropy_rows(&x, &t, &Tensor::new(m, &dev).unwrap())
            .unwrap_err()
            .to_string()
    };
    let e = err(&[1, 1]);
    assert!(
        e.contains("targets must be in [0, 4) (the vocabulary), got 4"),
        "{e}"
    );
    assert!(err(&[0, 0]).contains("the loss mask selects no position"));
    // The out-of-range target does not count: no error.
    cross_entropy_rows(&x, &t, &Tensor::new(&[1u8, 0], &dev)?)?;
    Ok(())
}

/// Logits `(N, L, V)` go in without a reshape (no extra autograd node): the same loss and
/// gradient as the `(N·L, V)` form, and rank-1 logits are an error naming the dims.
#[test]
fn cross_entropy_takes_logits_of_any_rank() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::from_tensor(&normal(0.0, 3.0, (3, 5, 11), DType::F64, &dev, 31)?)?;
    let targets: Vec<u32> = (0..15).map(|i| (i * 4) % 11).collect();
    let keep: Vec<u8> = (0..15).map(|i| u8::from(i % 4 != 2)).collect();
    let t = Tensor::from_vec(targets.clone(), 15, &dev)?;
    let m = Tensor::from_vec(keep.clone(), 15, &dev)?;
    let loss = cross_entropy_rows(&x, &t, &m)?;
    // The op's input is `x` itself: the graph is the op and its variable.
    assert_eq!(loss.sorted_nodes().len(), 2);
    let reference = reference_cross_entropy(&x.reshape((15, 11))?, &targets, &keep)?;
    check("3-D loss", &loss, &reference, 1e-12)?;
    let (g, gr) = (loss.backward()?, reference.backward()?);
    let dx = g.get(&x).expect("fused");
    assert_eq!(dx.dims(), [3, 5, 11]);
    check("3-D dx", dx, gr.get(&x).expect("ref"), 1e-12)?;
    let e = cross_entropy_rows(&Tensor::zeros(4, DType::F32, &dev)?, &t, &m).unwrap_err();
    assert!(
        e.to_string()
            .contains("expected logits (…, V) of rank 2 or more, got dims [4]"),
        "{e}"
    );
    Ok(())
}

/// Bit-identical results with 1 and 2 threads (f64, where a changed order of the partial sums
/// shows in the last bits): the reductions over row chunks (layer norm's
/// weight and bias gradients, the cross-entropy sum) must not depend on scheduling, or a
/// resumed training run would drift from an uninterrupted one.
#[test]
fn reductions_do_not_depend_on_the_thread_count() -> Result<()> {
    let dev = Device::Cpu;
    let run = || -> Result<Vec<Vec<f64>>> {
        let x = Var::from_tensor(&normal(0.3, 2.0, (300, 48), DType::F64, &dev, 7)?)?;
        let w = Var::from_tensor(&normal(1.0, 0.5, 48, DType::F64, &dev, 8)?)?;
        let b = Var::from_tensor(&normal(0.0, 0.5, 48, DType::F64, &dev, 9)?)?;
        let y = layer_norm(&x, &w, &b, 1e-5)?;
        let targets = Tensor::from_vec((0..300u32).map(|i| i % 48).collect::<Vec<_>>(), 300, &dev)?;
        let keep = Tensor::ones(300, DType::U8, &dev)?;
        let loss = cross_entropy_rows(&y, &targets, &keep)?;
        let grads = loss.backward()?;
        let mut out = vec![vec![loss.to_scalar::<f64>()?]];
        for v in [&w, &b] {
            out.push(grads.get(v).expect("grad").to_vec1::<f64>()?);
        }
        Ok(out)
    };
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("pool")
    };
    let one = pool(1).install(run)?;
    let two = pool(2).install(run)?;
    assert_eq!(one, two);
    Ok(())
}

/// The embedding sum against candle's lookups and broadcast add: output and both tables'
/// gradients (a loss weighting every element differently, repeated ids and positions), f32
/// and f64, u32 and i64 ids; a frozen table gets no gradient; out-of-range ids are errors.
#[test]
fn embedding_sum_matches_generic_ops() -> Result<()> {
    use super::embedding::{embedding_sum, Embedding};
    use candle::Module;
    let dev = Device::Cpu;
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-12)] {
        let vm = candle_nn::VarMap::new();
        let vb = crate::seeded_var_builder(&vm, 3, dtype, &dev);
        let (tok, pos) = (
            Embedding::new(11, 6, vb.pp("tok"))?,
            Embedding::new(9, 6, vb.pp("pos"))?,
        );
        let ids = Tensor::new(&[[1u32, 4, 4, 10], [0, 1, 7, 1], [10, 10, 2, 3]], &dev)?;
        let positions = Tensor::new(&[2u32, 0, 8, 2], &dev)?;
        let w = normal(0.0, 1.0, (3, 4, 6), dtype, &dev, 5)?;
        let fused = embedding_sum(&tok, &ids, &pos, &positions)?;
        let reference = tok
            .forward(&ids)?
            .broadcast_add(&pos.forward(&positions)?)?;
        check(&format!("{dtype:?} output"), &fused, &reference, tol)?;
        let gf = (&fused * &w)?.sum_all()?.backward()?;
        let gr = (&reference * &w)?.sum_all()?.backward()?;
        for (name, t) in [("tok", tok.weight()), ("pos", pos.weight())] {
            check(
                &format!("{dtype:?} d{name}"),
                gf.get(t).expect("fused grad"),
                gr.get(t).expect("reference grad"),
                tol,
            )?;
        }
        let ids64 = ids.to_dtype(DType::I64)?;
        check(
            "i64 ids",
            &embedding_sum(&tok, &ids64, &pos, &positions)?,
            &reference,
            tol,
        )?;
        // A frozen position table (a plain tensor, not a variable): only the token table gets
        // a gradient.
        let table = normal(0.0, 1.0, (9, 6), dtype, &dev, 6)?;
        let frozen = Embedding::new(
            9,
            6,
            candle_nn::VarBuilder::from_tensors(
                [("weight".to_string(), table)].into_iter().collect(),
                dtype,
                &dev,
            ),
        )?;
        assert!(!frozen.weight().track_op());
        let y = embedding_sum(&tok, &ids, &frozen, &positions)?;
        let g = (&y * &w)?.sum_all()?.backward()?;
        assert!(g.get(tok.weight()).is_some());
        assert!(g.get(frozen.weight()).is_none());
    }
    let vm = candle_nn::VarMap::new();
    let vb = crate::seeded_var_builder(&vm, 3, DType::F32, &dev);
    let (tok, pos) = (
        Embedding::new(5, 2, vb.pp("t"))?,
        Embedding::new(3, 2, vb.pp("p"))?,
    );
    let e = embedding_sum(
        &tok,
        &Tensor::new(&[[0u32, 5]], &dev)?,
        &pos,
        &Tensor::new(&[0u32, 1], &dev)?,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("ids must be in [0, 5), got 5"),
        "{e}"
    );
    let e = embedding_sum(
        &tok,
        &Tensor::new(&[[0u32, 1]], &dev)?,
        &pos,
        &Tensor::new(&[0u32, 3], &dev)?,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("positions must be in [0, 3), got 3"),
        "{e}"
    );
    Ok(())
}

/// The MLP pair (the first layer's activation handed over through the pool, not the graph)
/// against the linear+GELU and a linear as separate ops: output and the gradients of x and
/// all four parameters, every case of `CASES` (f32/f64, transposed inputs), with and without
/// the second bias; the MLP applied twice in one graph (two calls' activations must not
/// mix); the same graph backpropagated twice.
#[test]
fn mlp_matches_separate_layers_forward_and_gradients() -> Result<()> {
    use crate::cpu::linear;
    let dev = Device::Cpu;
    for (case, &(lead, k, dtype, transpose)) in CASES.iter().enumerate() {
        let seed = 700 + 10 * case as u64;
        let (f, n) = (2 * k + 3, k + 2);
        let shape: Vec<usize> = lead.iter().copied().chain([k]).collect();
        let x = Var::from_tensor(&normal(0.0, 1.0, shape.clone(), dtype, &dev, seed)?)?;
        let var = |s: (usize, usize), i| -> Result<Var> {
            Var::from_tensor(&normal(0.0, 0.5, s, dtype, &dev, seed + i)?)
        };
        let (w1, w2) = (var((f, k), 1)?, var((n, f), 2)?);
        let b1 = Var::from_tensor(&normal(0.0, 0.5, f, dtype, &dev, seed + 3)?)?;
        let b2 = Var::from_tensor(&normal(0.0, 0.5, n, dtype, &dev, seed + 4)?)?;
        let input = maybe_transposed(&x, transpose)?;
        let b2v = b2;
        for with_b2 in [true, false] {
            let b2 = with_b2.then_some(b2v.as_tensor());
            let w2h = (w2.as_tensor() * 0.5)?;
            let fused = (mlp(&input, (&w1, Some(&b1)), (&w2, b2))?
                + mlp(&input, (&w1, Some(&b1)), (&w2h, b2))?)?;
            let separate = |w2: &Tensor| linear(&linear_gelu(&input, &w1, Some(&b1))?, w2, b2);
            let reference = (separate(&w2)? + separate(&w2h)?)?;
            let what = format!("case {case} {shape:?} {dtype:?} b2={with_b2}");
            // The same graph backpropagated twice: the pool hand-over works for each pass.
            let r = normal(0.0, 1.0, fused.shape(), dtype, &dev, seed + 5)?;
            let loss = (&fused * &r)?.sum_all()?;
            let (g1, g2) = (loss.backward()?, loss.backward()?);
            for v in [&x, &w1] {
                let (a, b) = (g1.get(v).expect("grad"), g2.get(v).expect("grad"));
                assert_eq!(rel_err(a, b)?, 0.0, "{what}: a second backward differs");
            }
            let mut vars = vec![("dx", &x), ("dw1", &w1), ("db1", &b1), ("dw2", &w2)];
            if with_b2 {
                vars.push(("db2", &b2v));
            }
            check_op(&what, fused, reference, seed + 5, &vars)?;
        }
    }
    Ok(())
}

/// A frozen second layer (`w2`, `b2` plain tensors, as under LoRA): the pair lets the hidden
/// activation go after its forward pass and still gives the separate layers' output and the
/// gradients of x, w1 and b1, twice from one graph; `w2` gets none.
#[test]
fn mlp_with_a_frozen_second_layer_keeps_no_hidden_activation() -> Result<()> {
    use crate::cpu::linear;
    let dev = Device::Cpu;
    for (case, &(lead, k, dtype, transpose)) in CASES.iter().enumerate() {
        let seed = 750 + 10 * case as u64;
        let (f, n) = (2 * k + 3, k + 2);
        let shape: Vec<usize> = lead.iter().copied().chain([k]).collect();
        let x = Var::from_tensor(&normal(0.0, 1.0, shape.clone(), dtype, &dev, seed)?)?;
        let w1 = Var::from_tensor(&normal(0.0, 0.5, (f, k), dtype, &dev, seed + 1)?)?;
        let b1 = Var::from_tensor(&normal(0.0, 0.5, f, dtype, &dev, seed + 3)?)?;
        let w2 = normal(0.0, 0.5, (n, f), dtype, &dev, seed + 2)?;
        let b2 = normal(0.0, 0.5, n, dtype, &dev, seed + 4)?;
        let input = maybe_transposed(&x, transpose)?;
        let fused = mlp(&input, (&w1, Some(&b1)), (&w2, Some(&b2)))?;
        let reference = linear(&linear_gelu(&input, &w1, Some(&b1))?, &w2, Some(&b2))?;
        let what = format!("case {case} {shape:?} {dtype:?} frozen w2");
        let r = normal(0.0, 1.0, fused.shape(), dtype, &dev, seed + 5)?;
        let loss = (&fused * &r)?.sum_all()?;
        let (g1, g2) = (loss.backward()?, loss.backward()?);
        assert!(
            g1.get(&w2).is_none() && g1.get(&b2).is_none(),
            "{what}: w2 grads"
        );
        let a = g2.get(&x).expect("dx");
        assert_eq!(
            rel_err(g1.get(&x).expect("dx"), a)?,
            0.0,
            "{what}: second backward"
        );
        check_op(
            &what,
            fused,
            reference,
            seed + 5,
            &[("dx", &x), ("dw1", &w1), ("db1", &b1)],
        )?;
    }
    Ok(())
}
