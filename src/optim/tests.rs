use candle::{DType, Device, Var};

use super::*;

#[test]
fn bad_hyper_parameters_are_errors_with_pytorchs_messages() -> Result<()> {
    let var = Var::zeros(3, DType::F32, &Device::Cpu)?;
    let params = || vec![("w".to_string(), var.clone())];
    for (config, message) in [
        (
            AdamWConfig {
                lr: -1.0,
                ..Default::default()
            },
            "Invalid learning rate: -1",
        ),
        (
            AdamWConfig {
                lr: f64::NAN,
                ..Default::default()
            },
            "Invalid learning rate: NaN",
        ),
        (
            AdamWConfig {
                lr: f64::INFINITY,
                ..Default::default()
            },
            "Invalid learning rate: inf",
        ),
        (
            AdamWConfig {
                eps: -1e-8,
                ..Default::default()
            },
            "Invalid epsilon value",
        ),
        (
            AdamWConfig {
                beta1: 1.0,
                ..Default::default()
            },
            "Invalid beta parameter at index 0: 1",
        ),
        (
            AdamWConfig {
                beta2: -0.1,
                ..Default::default()
            },
            "Invalid beta parameter at index 1",
        ),
        (
            AdamWConfig {
                weight_decay: -0.5,
                ..Default::default()
            },
            "Invalid weight_decay value: -0.5",
        ),
    ] {
        let e = AdamW::new(params(), config).err().expect("an error");
        assert!(e.to_string().contains(message), "{e}");
    }
    // A learning rate set later is checked at the step, before anything changes.
    let mut opt = AdamW::new(params(), AdamWConfig::default())?;
    opt.set_lr(f64::NAN);
    let loss = (var.as_tensor() - 1.0)?.sqr()?.sum_all()?;
    let mut grads = loss.backward()?;
    let e = opt.step(&grads).unwrap_err();
    assert!(e.to_string().contains("Invalid learning rate: NaN"), "{e}");
    assert_eq!(var.to_vec1::<f32>()?, [0.0; 3]);

    let e = clip_grad_norm(&mut grads, std::slice::from_ref(&var), -1.0).unwrap_err();
    assert!(e.to_string().contains("max_norm must be >= 0"), "{e}");
    let norm = clip_grad_norm(&mut grads, std::slice::from_ref(&var), f64::INFINITY)?;
    assert!((norm - 12f64.sqrt()).abs() < 1e-6, "{norm}");
    Ok(())
}

/// The values of every tensor of a state, by name.
fn values(sd: &StateDict) -> Result<Vec<(String, Vec<f64>)>> {
    sd.tensors()
        .iter()
        .map(|(name, t)| {
            Ok((
                name.clone(),
                t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?,
            ))
        })
        .collect()
}

/// Equal bit for bit; with MKL (the `mkl` feature) within a few ulps, since candle's tensor
/// path then takes MKL's vector math (square root, division), which rounds differently.
fn assert_same(a: &[f64], b: &[f64], dtype: DType, what: &str) {
    let tol = match (cfg!(feature = "mkl"), dtype) {
        (false, _) => 0.0,
        (true, DType::F32) => 1e-6,
        (true, _) => 1e-14,
    };
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() <= tol * x.abs().max(1.0),
            "{what}: {x} vs {y}"
        );
    }
}

#[test]
fn in_place_steps_equal_the_tensor_path_and_leave_saved_states_alone() -> Result<()> {
    let dev = Device::Cpu;
    let init: Vec<f64> = (0..12).map(|i| (i as f64 * 0.37).sin()).collect();
    for dtype in [DType::F32, DType::F64] {
        let var = || -> Result<Var> {
            Var::from_tensor(&Tensor::from_vec(init.clone(), (3, 4), &dev)?.to_dtype(dtype)?)
        };
        let grads = |w: &Var| (w.as_tensor() * 1.7)?.sin()?.sum_all()?.backward();
        let (a, b, c) = (var()?, var()?, var()?);
        let opt = |w: &Var| AdamW::new(vec![("w".to_string(), w.clone())], Default::default());
        let (mut in_place, mut tensors, mut loaded) = (opt(&a)?, opt(&b)?, opt(&c)?);
        let mut saved = None;
        for step in 0..4 {
            if step == 2 {
                let sd = in_place.state_dict()?;
                let before = values(&sd)?;
                loaded.load_state_dict(&sd)?;
                c.set(a.as_tensor())?;
                saved = Some((sd, before));
            }
            in_place.step(&grads(&a)?)?;
            tensors.step_with(&grads(&b)?, false)?;
            if step >= 2 {
                loaded.step(&grads(&c)?)?;
            }
            let what = format!("{dtype:?} step {step}");
            let flat = |v: &Var| v.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>();
            assert_same(&flat(&a)?, &flat(&b)?, dtype, &what);
            let states = values(&in_place.state_dict()?)?
                .into_iter()
                .zip(values(&tensors.state_dict()?)?);
            for ((name, x), (other, y)) in states {
                assert_eq!(name, other);
                assert_same(&x, &y, dtype, &format!("{what} {name}"));
            }
        }
        // The optimizer that resumed from the saved state went the same way, and neither
        // step changed that state.
        assert_eq!(
            values(&loaded.state_dict()?)?,
            values(&in_place.state_dict()?)?
        );
        let (sd, before) = saved.expect("saved at step 2");
        assert_eq!(values(&sd)?, before, "{dtype:?}");
        assert_ne!(values(&in_place.state_dict()?)?, before);
    }
    Ok(())
}

/// A fresh optimizer saves only its step counts, as PyTorch's `state` is empty before the
/// first step; that state, and the older form with zero moments, resume as a fresh one.
#[test]
fn a_fresh_state_holds_no_moments_and_resumes_as_fresh() -> Result<()> {
    let dev = Device::Cpu;
    let w0 = Tensor::new(&[0.3f32, -1.2, 2.0], &dev)?;
    let run = |state: Option<&StateDict>| -> Result<(Vec<f32>, StateDict)> {
        let w = Var::from_tensor(&w0)?;
        let mut opt = AdamW::new(vec![("w".to_string(), w.clone())], Default::default())?;
        if let Some(sd) = state {
            opt.load_state_dict(sd)?;
        }
        for _ in 0..2 {
            opt.step(&(w.as_tensor() * 1.7)?.sin()?.sum_all()?.backward()?)?;
        }
        Ok((w.to_vec1()?, opt.state_dict()?))
    };
    let fresh = AdamW::new(
        vec![("w".to_string(), Var::from_tensor(&w0)?)],
        Default::default(),
    )?
    .state_dict()?;
    assert_eq!(values(&fresh)?, [("step.w".to_string(), vec![0.0])]);
    let zeros = StateDict::from_tensors(vec![
        ("exp_avg.w".to_string(), w0.zeros_like()?),
        ("exp_avg_sq.w".to_string(), w0.zeros_like()?),
        ("step.w".to_string(), Tensor::new(0f64, &dev)?),
    ]);
    let (expected, stepped) = run(None)?;
    assert_eq!(stepped.tensors().len(), 3);
    for state in [&fresh, &zeros] {
        let (got, after) = run(Some(state))?;
        assert_eq!(got, expected);
        assert_eq!(values(&after)?, values(&stepped)?);
    }

    // A parameter stepped without its moments, or a step count that is no count, is an
    // error that names the key and leaves the optimizer as it was.
    let mut opt = AdamW::new(
        vec![("w".to_string(), Var::from_tensor(&w0)?)],
        Default::default(),
    )?;
    opt.load_state_dict(&stepped)?;
    for (sd, message) in [
        (
            StateDict::from_tensors(vec![("step.w".to_string(), Tensor::new(3f64, &dev)?)]),
            "optimizer state has no exp_avg.w",
        ),
        (
            StateDict::from_tensors(vec![("step.w".to_string(), Tensor::new(-1f64, &dev)?)]),
            "step.w is -1, expected a whole number of steps",
        ),
        (
            StateDict::from_tensors(vec![("step.w".to_string(), Tensor::new(f64::NAN, &dev)?)]),
            "step.w is NaN",
        ),
    ] {
        let e = opt.load_state_dict(&sd).unwrap_err().to_string();
        assert!(e.contains(message), "{e}");
        assert_eq!(values(&opt.state_dict()?)?, values(&stepped)?);
    }
    Ok(())
}

/// Tensors sharing a storage take the tensor path (nested write locks on one storage would
/// wait forever), as do strided ones; distinct contiguous ones are updated in place.
#[test]
fn the_in_place_step_declines_shared_and_strided_tensors() -> Result<()> {
    let dev = Device::Cpu;
    let u = Update {
        decay: 1.0,
        beta1: 0.9,
        beta2: 0.999,
        step_size: 1e-3,
        bias2_sqrt: 1.0,
        eps: 1e-8,
    };
    let t = |x: f32| Tensor::full(x, (2, 3), &dev);
    let (p, g, m, v) = (t(1.0)?, t(0.5)?, t(0.0)?, t(0.0)?);
    assert!(!adamw_update_in_place(&u, &p, &g, &m, &m)?);
    assert!(!adamw_update_in_place(&u, &p, &p, &m, &v)?);
    assert!(!adamw_update_in_place(
        &u,
        &p.t()?,
        &g.t()?,
        &m.t()?,
        &v.t()?
    )?);
    assert_eq!(p.flatten_all()?.to_vec1::<f32>()?, [1.0; 6]);
    assert!(adamw_update_in_place(&u, &p, &g, &m, &v)?);
    assert!(p.flatten_all()?.to_vec1::<f32>()?.iter().all(|&x| x < 1.0));
    assert_eq!(m.flatten_all()?.to_vec1::<f32>()?, [0.05; 6]);
    Ok(())
}
