//! LoRA against Hugging Face PEFT (`scripts/make_lora_fixtures.py`): PEFT adapters on a tiny
//! GPT-2 (`c_attn`, `c_proj`, `c_fc`; and `c_attn` alone with `use_rslora`) and a tiny Llama
//! with grouped-query attention (all seven projections), imported onto their base runs: the
//! adapted logits, one training step of the adapter alone, the merged export and the adapter
//! written back.

use candle_mha_test_support as common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::{load_into_varmap, LoadOptions, StateDict};
use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
use candle_mha_train::formats::{export_hugging_face, export_peft, import_peft, read_hugging_face};
use candle_mha_train::models::lora::lora_names;
use candle_mha_train::models::{NextTokenPredictor, NextTokenPredictorConfig};
use candle_mha_train::run::lora::{resume_model, LoraRecord};
use candle_mha_train::Unverified;
use candle_nn::VarMap;

/// Each case and the base fixture its adapter was trained on.
const CASES: [(&str, &str); 3] = [
    ("gpt2", "gpt2/hf"),
    ("gpt2_rslora", "gpt2/hf"),
    ("llama", "llama/llama_gqa3_tied"),
];

fn adapter_dir(case: &str) -> PathBuf {
    common::fixtures_dir().join("lora").join(case)
}

fn expected(case: &str) -> Result<StateDict> {
    Ok(StateDict::load(
        adapter_dir(case).join("expected.safetensors"),
    )?)
}

/// The base imported as a run in `tmp/base`, the case's adapter imported onto it in
/// `tmp/lora`.
fn runs(tmp: &Path, case: &str, base: &str) -> Result<(PathBuf, PathBuf)> {
    let (b, l) = (tmp.join("base"), tmp.join("lora"));
    read_hugging_face(&common::fixtures_dir().join(base), None)?.write_run(&b)?;
    import_peft(&adapter_dir(case), &b, &l, Unverified::Refuse)?;
    Ok((b, l))
}

/// The LoRA run's model, its adapter loaded strictly into the variables.
fn lora_model(run: &Path) -> Result<(NextTokenPredictor, VarMap, LoraRecord)> {
    let cfg = NextTokenPredictorConfig::load(run.join("config.json"))?;
    let (model, varmap) = resume_model(run, &cfg, DType::F32, &Device::Cpu)?;
    let sd = StateDict::load(run.join("model.safetensors"))?;
    let report = load_into_varmap(&varmap, &sd, &LoadOptions::new().with_module("adapter"))?;
    assert!(report.problems().is_empty(), "{report}");
    let record = LoraRecord::load(run, &cfg)?.expect("a LoRA run");
    Ok((model, varmap, record))
}

fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (a.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
    let diff = (&a - &b)?.abs()?.max_all()?.to_scalar::<f64>()?;
    Ok(diff / b.abs()?.max_all()?.to_scalar::<f64>()?.max(1e-12))
}

fn tokens(want: &StateDict) -> Result<Tensor> {
    Ok(want.get("tokens").unwrap().to_dtype(DType::U32)?)
}

#[test]
fn adapted_logits_equal_peft() -> Result<()> {
    for (case, base) in CASES {
        let tmp = tempfile::tempdir()?;
        let (_, run) = runs(tmp.path(), case, base)?;
        let (model, varmap, record) = lora_model(&run)?;
        assert!(model.has_lora(), "{case}");
        let sites = record.spec.sites(model.config())?;
        // Only the adapter is trainable: two tensors a layer, nothing of the base.
        assert_eq!(varmap.all_vars().len(), 2 * sites.len(), "{case}");
        let want = expected(case)?;
        let logits = model.forward(&tokens(&want)?, None)?;
        let d = rel_diff(&logits, want.get("logits").unwrap())?;
        assert!(d < 1e-5, "{case}: logits differ from PEFT's by {d:e}");
        // The merged model computes the same function from plain weights.
        let merged = model.merged()?;
        assert!(!merged.has_lora());
        let d = rel_diff(&merged.forward(&tokens(&want)?, None)?, &logits)?;
        assert!(d < 1e-5, "{case}: merged differs by {d:e}");
    }
    Ok(())
}

/// PEFT + PyTorch's step: AdamW (lr 1e-2, betas (0.9, 0.95), decay 0.1) on the adapter's
/// tensors only, clipped at 1.
#[test]
fn one_training_step_equals_peft() -> Result<()> {
    for (case, base) in CASES {
        let tmp = tempfile::tempdir()?;
        let (_, run) = runs(tmp.path(), case, base)?;
        let (model, varmap, record) = lora_model(&run)?;
        let want = expected(case)?;
        let t = tokens(&want)?;
        let l = t.dim(1)?;
        let (input, targets) = (
            t.narrow(1, 0, l - 1)?.contiguous()?,
            t.narrow(1, 1, l - 1)?.contiguous()?,
        );
        let mask = input.ones_like()?.to_dtype(DType::U8)?;
        let loss = model.train_loss(&input, None, (0, 0), &targets, &mask)?;
        let (got, exp) = (
            loss.to_scalar::<f32>()?,
            want.get("step_loss").unwrap().to_vec1::<f32>()?[0],
        );
        assert!(
            (got - exp).abs() < 1e-5 * exp.abs(),
            "{case}: loss {got} vs {exp}"
        );
        let mut grads = loss.backward()?;
        let mut opt = AdamW::from_varmap(
            &varmap,
            AdamWConfig {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
            },
        )?;
        let norm = clip_grad_norm(&mut grads, &opt.vars(), 1.0)?;
        let exp = want.get("step_grad_norm").unwrap().to_vec1::<f32>()?[0] as f64;
        assert!(
            (norm - exp).abs() < 1e-5 * exp,
            "{case}: grad norm {norm} vs {exp}"
        );
        opt.step(&grads)?;
        let vars = varmap.data().lock().unwrap().clone();
        for site in record.spec.sites(model.config())? {
            let (a, b) = lora_names(&site.module);
            for (ours, which) in [(a, 'A'), (b, 'B')] {
                let peft = format!("base_model.model.{}.lora_{which}.weight", site.hf_module);
                let get = |k: String| {
                    want.get(&k)
                        .unwrap_or_else(|| panic!("{case}: {k} missing"))
                        .clone()
                };
                let (exp_grad, exp) = (get(format!("grad.{peft}")), get(format!("updated.{peft}")));
                let var = vars[&ours].as_tensor();
                let grad = grads
                    .get(var)
                    .unwrap_or_else(|| panic!("{case}: {ours} has no gradient"));
                let d = rel_diff(grad, &exp_grad)?;
                assert!(
                    d < 5e-5, // f32 sums in another order through every layer above
                    "{case}: {ours}'s gradient differs from PyTorch's by {d:e}"
                );
                // Adam's first step is lr·g/(|g| + eps): where a gradient is rounding noise (a
                // GELU feature no token reaches) its sign is too, so those elements are left out.
                let g = exp_grad.abs()?;
                let keep = g
                    .ge(g.max_all()?.to_scalar::<f32>()? * 1e-4)?
                    .to_dtype(DType::F32)?;
                let d = rel_diff(&(var * &keep)?, &(&exp * &keep)?)?;
                assert!(d < 1e-5, "{case}: {ours} differs from PEFT's step by {d:e}");
            }
        }
    }
    Ok(())
}

#[test]
fn merged_export_equals_merge_and_unload() -> Result<()> {
    for (case, base) in CASES {
        let tmp = tempfile::tempdir()?;
        let (_, run) = runs(tmp.path(), case, base)?;
        let out = tmp.path().join("hf");
        export_hugging_face(&run, &out, Unverified::Refuse)?;
        let ours = StateDict::load(out.join("model.safetensors"))?;
        let want = expected(case)?;
        let mut n = 0;
        for (key, exp) in want.tensors() {
            let Some(name) = key.strip_prefix("merged.") else {
                continue;
            };
            let got = ours
                .get(name)
                .unwrap_or_else(|| panic!("{case}: export lacks {name}"));
            let d = rel_diff(got, exp)?;
            assert!(
                d < 1e-6,
                "{case}: {name} differs from merge_and_unload by {d:e}"
            );
            n += 1;
        }
        assert!(n >= 2, "{case}: only {n} merged weights compared");
    }
    Ok(())
}

#[test]
fn a_peft_adapter_comes_back_tensor_for_tensor() -> Result<()> {
    for (case, base) in CASES {
        let tmp = tempfile::tempdir()?;
        let (_, run) = runs(tmp.path(), case, base)?;
        let out = tmp.path().join("peft");
        export_peft(&run, &out, Unverified::Refuse)?;
        let theirs = StateDict::load(adapter_dir(case).join("adapter_model.safetensors"))?;
        let back = StateDict::load(out.join("adapter_model.safetensors"))?;
        assert_eq!(back.len(), theirs.len(), "{case}");
        for (name, t) in theirs.tensors() {
            let got = back
                .get(name)
                .unwrap_or_else(|| panic!("{case}: {name} not written"));
            assert_eq!(got.dims(), t.dims(), "{case}: {name}");
            assert_eq!(rel_diff(got, t)?, 0.0, "{case}: {name}");
        }
        let read = |d: &Path| -> Result<serde_json::Value> {
            Ok(serde_json::from_str(&std::fs::read_to_string(
                d.join("adapter_config.json"),
            )?)?)
        };
        let (ours, theirs) = (read(&out)?, read(&adapter_dir(case))?);
        for key in ["peft_type", "r", "use_rslora", "fan_in_fan_out", "bias"] {
            assert_eq!(ours[key], theirs[key], "{case}: {key}");
        }
        assert_eq!(
            ours["lora_alpha"].as_f64(),
            theirs["lora_alpha"].as_f64(),
            "{case}"
        );
        let set = |v: &serde_json::Value| {
            let mut t: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            t.sort();
            t
        };
        assert_eq!(
            set(&ours["target_modules"]),
            set(&theirs["target_modules"]),
            "{case}"
        );
    }
    Ok(())
}

/// An edit of an adapter's `adapter_config.json`.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

/// A copy of the GPT-2 adapter with `edit` applied to its config.
fn edited_adapter(tmp: &Path, edit: impl Fn(&mut serde_json::Value)) -> Result<PathBuf> {
    let dir = tmp.join("edited");
    std::fs::create_dir_all(&dir)?;
    let src = adapter_dir("gpt2");
    std::fs::copy(
        src.join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("adapter_config.json"))?)?;
    edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string())?;
    Ok(dir)
}

#[test]
fn what_a_lora_run_cannot_hold_is_refused_by_name() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (base, run) = runs(tmp.path(), "gpt2", "gpt2/hf")?;
    let cases: [(&str, Edit); 5] = [
        ("use_dora", Box::new(|c| c["use_dora"] = true.into())),
        ("peft_type", Box::new(|c| c["peft_type"] = "IA3".into())),
        (
            "modules_to_save",
            Box::new(|c| c["modules_to_save"] = serde_json::json!(["lm_head"])),
        ),
        (
            "c_attn",
            Box::new(|c| c["target_modules"] = serde_json::json!(["c_proj", "c_fc"])),
        ),
        ("lora_A", Box::new(|c| c["r"] = 3.into())),
    ];
    for (i, (what, edit)) in cases.into_iter().enumerate() {
        let dir = edited_adapter(&tmp.path().join(i.to_string()), edit)?;
        let out = tmp.path().join(format!("out{i}"));
        let err = import_peft(&dir, &base, &out, Unverified::Refuse).unwrap_err();
        // Settings refused by name are a variant a program can match.
        if i < 3 {
            assert!(
                matches!(
                    candle_mha::error::find(&err),
                    Some(candle_mha::checkpoint::CheckpointError::Unsupported { key, .. }) if key == what
                ),
                "{what}: {err}"
            );
        }
        let err = err.to_string();
        assert!(err.contains(what), "{what}: {err}");
        assert!(
            !out.exists(),
            "{what}: a refused import wrote {}",
            out.display()
        );
    }
    // A LoRA run is not a base; a base whose weights changed is found out by its hash.
    let err = import_peft(
        &adapter_dir("gpt2"),
        &run,
        &tmp.path().join("x"),
        Unverified::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("LoRA run"), "{err}");
    let sd = StateDict::load(base.join("model.safetensors"))?;
    let changed = StateDict::from_tensors(
        sd.tensors()
            .iter()
            .map(|(n, t)| (n.clone(), (t * 1.5).unwrap())),
    );
    changed.save_safetensors(base.join("model.safetensors"))?;
    let cfg = NextTokenPredictorConfig::load(run.join("config.json"))?;
    let err = resume_model(&run, &cfg, DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("SHA-256"), "{err}");
    Ok(())
}
