//! Llama-family models against transformers (`scripts/make_llama_fixtures.py`: tiny
//! `LlamaForCausalLM`, `Qwen2ForCausalLM` and `MistralForCausalLM` directories written by
//! `save_pretrained`, random weights): logits, greedy generation with and without the cache,
//! the loss, every gradient and one AdamW step; the export back to Hugging Face byte for byte;
//! what the model cannot honour refused by name.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle::{DType, Device, Tensor};
use candle_mha::checkpoint::{load_into_varmap_owned, LoadOptions};
use candle_mha::optim::{AdamW, AdamWConfig};
use candle_mha::zeroed_var_builder;
use candle_mha_test_support::{assert_close, Fixture};
use candle_mha_train::formats::{read_hf_dir, write_hf_dir, HfWeights};
use candle_mha_train::models::llama::{parameter_shapes, Llama};
use candle_nn::VarMap;

const CASES: [&str; 7] = [
    "llama_gqa1",
    "llama_gqa3_tied",
    "llama_gqa7_llama3",
    "llama_head_dim_linear",
    "llama_sharded_bf16",
    "qwen2",
    "mistral",
];

fn dir(case: &str) -> PathBuf {
    candle_mha_test_support::fixtures_dir()
        .join("llama")
        .join(case)
}

fn load(case: &str) -> Result<(Llama, VarMap, Fixture, HfWeights)> {
    let d = dir(case);
    let hf = read_hf_dir(&d)?;
    let varmap = VarMap::new();
    let vb = zeroed_var_builder(&varmap, DType::F32, &Device::Cpu);
    let model = Llama::new(hf.config.clone(), vb)?;
    let weights = candle_mha::checkpoint::StateDict::from_tensors(hf.weights.tensors().to_vec());
    load_into_varmap_owned(&varmap, weights, &LoadOptions::new().with_module("Llama"))?;
    let expected = Fixture::load(&d.join("expected.safetensors"))?;
    Ok((model, varmap, expected, hf))
}

fn ids(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::U32)?)
}

#[test]
fn logits_equal_transformers() -> Result<()> {
    for case in CASES {
        let (model, _, f, _) = load(case)?;
        let logits = model.forward(&ids(f.tensor("input_ids")?)?)?;
        assert_close(
            &format!("{case} logits"),
            &logits,
            f.tensor("logits")?,
            1e-5,
        )?;
        // The cache gives the same logits, position by position after a prefill.
        let tokens = ids(f.tensor("input_ids")?)?;
        let mut cache = model.new_cache();
        let a = model.forward_cached(&tokens.narrow(1, 0, 5)?, &mut cache)?;
        let b = model.forward_cached(&tokens.narrow(1, 5, 4)?, &mut cache)?;
        let c = model.forward_cached(&tokens.narrow(1, 9, 3)?, &mut cache)?;
        let all = Tensor::cat(&[a, b, c], 1)?;
        assert_close(
            &format!("{case} cached logits"),
            &all,
            f.tensor("logits")?,
            1e-5,
        )?;
    }
    Ok(())
}

#[test]
fn greedy_generation_equals_transformers() -> Result<()> {
    for case in CASES {
        let (model, _, f, hf) = load(case)?;
        let prompt: Vec<u32> = ids(f.tensor("prompt")?)?.flatten_all()?.to_vec1()?;
        for (use_cache, key) in [(true, "greedy"), (false, "greedy_nocache")] {
            let want: Vec<u32> = ids(f.tensor(key)?)?.flatten_all()?.to_vec1()?;
            let got =
                model.generate_greedy(&prompt, 10, &hf.eos_token_ids, use_cache, &Device::Cpu)?;
            assert_eq!(got, want, "{case} {key}");
        }
    }
    Ok(())
}

#[test]
fn training_step_equals_pytorch() -> Result<()> {
    for case in CASES {
        let (model, varmap, f, hf) = load(case)?;
        let loss = model.loss(&ids(f.tensor("input_ids")?)?)?;
        assert_close(&format!("{case} loss"), &loss, f.tensor("loss")?, 1e-5)?;
        let grads = loss.backward()?;
        let vars = varmap.data().lock().unwrap().clone();
        for (name, _) in parameter_shapes(&hf.config) {
            let var = vars
                .get(&name)
                .with_context(|| format!("{case}: no variable {name}"))?;
            let g = grads
                .get(var)
                .with_context(|| format!("{case}: no gradient of {name}"))?;
            assert_close(
                &format!("{case} grad {name}"),
                g,
                f.tensor(&format!("grad.{name}"))?,
                1e-4,
            )?;
        }
        let params = parameter_shapes(&hf.config)
            .into_iter()
            .map(|(n, _)| (n.clone(), vars[&n].clone()))
            .collect();
        let cfg = AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let mut opt = AdamW::new(params, cfg)?;
        opt.step(&grads)?;
        // Elements with a near-zero gradient move by about lr·g/(|g| + eps): their step
        // carries the gradients' 1e-5 relative difference into a 1e-4 one.
        for (name, _) in parameter_shapes(&hf.config) {
            let want = f.tensor(&format!("step.{name}"))?;
            assert_close(&format!("{case} step {name}"), &vars[&name], want, 2e-4)?;
        }
    }
    Ok(())
}

/// The exported directory's weights, under their names, in the model's order.
fn model_weights(
    varmap: &VarMap,
    cfg: &candle_mha_train::models::llama::LlamaConfig,
) -> Vec<(String, Tensor)> {
    let vars = varmap.data().lock().unwrap();
    parameter_shapes(cfg)
        .into_iter()
        .map(|(n, _)| (n.clone(), vars[&n].as_tensor().clone()))
        .collect()
}

#[test]
fn export_gives_the_files_back() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    for case in CASES {
        let (_, varmap, _, hf) = load(case)?;
        let out = tmp.path().join(case);
        let weights = model_weights(&varmap, &hf.config);
        write_hf_dir(
            &out,
            &hf.config,
            Some(&hf.config_json),
            hf.generation_config.as_ref(),
            &weights,
            &hf.dtypes,
        )?;
        let single = dir(case).join("model.safetensors");
        if single.exists() {
            let (a, b) = (
                std::fs::read(&single)?,
                std::fs::read(out.join("model.safetensors"))?,
            );
            assert!(
                a == b,
                "{case}: model.safetensors differs from the original ({} vs {} bytes)",
                a.len(),
                b.len()
            );
        }
        // Read back: the same model, the same dtypes.
        let back = read_hf_dir(&out)?;
        assert_eq!(back.config, hf.config, "{case}");
        assert_eq!(back.dtypes, hf.dtypes, "{case}");
        assert_eq!(back.eos_token_ids, hf.eos_token_ids, "{case}");
        for ((n, a), (m, b)) in hf.weights.tensors().iter().zip(back.weights.tensors()) {
            assert_eq!(n, m);
            assert_eq!(
                candle_mha_test_support::max_abs_diff(a, b)?,
                0.0,
                "{case} {n}"
            );
        }
    }
    Ok(())
}

/// A fixture directory copied with `config.json` edited by `edit`.
fn edited(tmp: &Path, case: &str, edit: impl Fn(&mut serde_json::Value)) -> Result<PathBuf> {
    let out = tmp.join(format!("{case}-edited"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    for e in std::fs::read_dir(dir(case))? {
        let p = e?.path();
        std::fs::copy(&p, out.join(p.file_name().unwrap()))?;
    }
    let mut j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json"))?)?;
    edit(&mut j);
    std::fs::write(out.join("config.json"), serde_json::to_vec(&j)?)?;
    Ok(out)
}

#[test]
fn what_the_model_cannot_honour_is_refused_by_name() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 10] = [
        (
            "mistral",
            |j| j["sliding_window"] = 8.into(),
            "sliding_window 8 is shorter than the context",
        ),
        ("llama_gqa1", |j| j["mlp_bias"] = true.into(), "mlp_bias"),
        (
            "llama_gqa1",
            |j| j["hidden_act"] = "gelu".into(),
            "hidden_act \"gelu\"",
        ),
        (
            "llama_gqa1",
            |j| j["rope_parameters"]["rope_type"] = "yarn".into(),
            "rope_type \"yarn\"",
        ),
        (
            "llama_gqa1",
            |j| j["num_local_experts"] = 8.into(),
            "mixture of experts",
        ),
        (
            "llama_gqa1",
            |j| j["model_type"] = "gemma".into(),
            "model_type \"gemma\"",
        ),
        (
            "llama_gqa1",
            |j| j["num_key_value_heads"] = 3.into(),
            "not a multiple of num_key_value_heads 3",
        ),
        (
            "llama_gqa1",
            |j| j["num_hidden_layers"] = 3.into(),
            "weights the files lack: model.layers.2",
        ),
        (
            "llama_gqa1",
            |j| j["tie_word_embeddings"] = true.into(),
            "yet the files hold lm_head.weight",
        ),
        (
            "qwen2",
            |j| {
                j.as_object_mut().unwrap().remove("layer_types");
                j["use_sliding_window"] = true.into();
                j["max_window_layers"] = 1.into();
                j["sliding_window"] = 8.into();
            },
            "sliding_window 8 is shorter",
        ),
    ];
    for (case, edit, want) in cases {
        let d = edited(tmp.path(), case, edit)?;
        let e = read_hf_dir(&d).expect_err(want).to_string();
        assert!(e.contains(want), "{case}: {e:?} should contain {want:?}");
    }
    // A Qwen2 window at least the context, none, or on no layer (`max_window_layers` 28 of
    // 2 layers) is no window: accepted, as transformers computes full attention.
    for (w, from) in [
        (serde_json::Value::from(4096), 1),
        (serde_json::Value::Null, 1),
        (8.into(), 28),
    ] {
        let d = edited(tmp.path(), "qwen2", |j| {
            j.as_object_mut().unwrap().remove("layer_types");
            j["use_sliding_window"] = true.into();
            j["max_window_layers"] = from.into();
            j["sliding_window"] = w.clone();
        })?;
        read_hf_dir(&d)?;
    }
    // A layer of sliding attention with a short window, by `layer_types`.
    let d = edited(tmp.path(), "qwen2", |j| {
        j["layer_types"][1] = "sliding_attention".into();
        j["sliding_window"] = 8.into();
    })?;
    let e = read_hf_dir(&d).unwrap_err().to_string();
    assert!(e.contains("sliding_window 8"), "{e}");
    Ok(())
}

/// The cache holds the key/value heads only: a 6:2 model's is a third of 6 heads'.
#[test]
fn the_cache_holds_only_key_value_heads() -> Result<()> {
    let (model, _, f, hf) = load("llama_gqa3_tied")?;
    let mut cache = model.new_cache();
    model.forward_cached(&ids(f.tensor("input_ids")?)?, &mut cache)?;
    let c = &hf.config;
    let full_heads = 2 * c.num_layers * 2 * 12 * c.num_heads * c.head_dim * 4;
    assert_eq!(cache.len(), 12);
    assert_eq!(cache.bytes() * c.num_heads / c.num_kv_heads, full_heads);
    assert_eq!(
        cache.layer(0).unwrap().0.dims(),
        &[2, c.num_kv_heads, 12, c.head_dim]
    );
    Ok(())
}
