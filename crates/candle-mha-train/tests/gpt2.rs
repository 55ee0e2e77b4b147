//! GPT-2-family checkpoints against PyTorch (`scripts/make_gpt2_fixtures.py`): a Hugging Face
//! `GPT2LMHeadModel` (tanh GELU, biases, `Conv1D`, tied head; and the same untied, its
//! `lm_head` without bias) and nanoGPT's `GPT`
//! (`bias=False`, exact GELU, tied head) load into a `NextTokenPredictor` with PyTorch's
//! logits, greedy generation and training step.

use candle_mha_test_support as common;

use std::path::PathBuf;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha::checkpoint::{load_into_varmap, LoadOptions, StateDict};
use candle_mha::optim::{clip_grad_norm, AdamW, AdamWConfig};
use candle_mha::seeded_var_builder;
use candle_mha_train::formats::gpt2_names::{self as gpt2, Gpt2Format};
use candle_mha_train::formats::{self as import, hf_gpt2};
use candle_mha_train::models::{
    generate, GenerateConfig, NextTokenPredictor, NextTokenPredictorConfig,
};
use candle_nn::VarMap;

fn fixtures() -> PathBuf {
    common::fixtures_dir().join("gpt2")
}

/// A model of `cfg` holding `sd` (our names), loaded strictly.
fn build(cfg: &NextTokenPredictorConfig, sd: &StateDict) -> Result<(NextTokenPredictor, VarMap)> {
    let varmap = VarMap::new();
    let model = NextTokenPredictor::new(
        cfg.clone(),
        seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu),
    )?;
    let report = load_into_varmap(
        &varmap,
        sd,
        &LoadOptions::new().with_module("NextTokenPredictor"),
    )?;
    assert!(report.problems().is_empty(), "{report}");
    Ok((model, varmap))
}

/// The Hugging Face fixtures: tied head, untied head.
const HF: [&str; 2] = ["hf", "hf-untied"];

/// A Hugging Face fixture's configuration, its file's tensors and those tensors in our names.
fn hf_files(name: &str) -> Result<(NextTokenPredictorConfig, StateDict, StateDict)> {
    let dir = fixtures().join(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let cfg = hf_gpt2::config_from_hf(&json)?;
    let sd = StateDict::load(dir.join("model.safetensors"))?;
    let (ours, report) = gpt2::from_gpt2(&sd, Gpt2Format::HuggingFace, &cfg)?;
    assert_eq!(report.transposed, 4 * cfg.num_layers, "{report}");
    Ok((cfg, sd, ours))
}

fn hf_model(name: &str) -> Result<(NextTokenPredictor, VarMap, NextTokenPredictorConfig)> {
    let (cfg, _, ours) = hf_files(name)?;
    let (model, varmap) = build(&cfg, &ours)?;
    Ok((model, varmap, cfg))
}

fn expected(name: &str) -> Result<StateDict> {
    Ok(StateDict::load(fixtures().join(name))?)
}

fn ids(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::U32)?)
}

/// Largest |a - b| over the largest |b|.
fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (a.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
    let diff = (&a - &b)?.abs()?.max_all()?.to_scalar::<f64>()?;
    let scale = b.abs()?.max_all()?.to_scalar::<f64>()?.max(1e-12);
    Ok(diff / scale)
}

#[test]
fn hugging_face_logits_equal_pytorch() -> Result<()> {
    for name in HF {
        let (model, _, cfg) = hf_model(name)?;
        assert!(cfg.bias && !cfg.head_has_bias(), "{name}");
        assert_eq!(cfg.tie_embeddings, name == "hf", "{name}");
        let want = expected(&format!("{name}_expected.safetensors"))?;
        let tokens = ids(want.get("tokens").unwrap())?;
        let logits = model.forward(&tokens, None)?;
        let d = rel_diff(&logits, want.get("logits").unwrap())?;
        assert!(d < 1e-5, "{name}: relative difference {d:e}");
    }
    Ok(())
}

#[test]
fn hugging_face_greedy_generation_equals_generate() -> Result<()> {
    for name in HF {
        let (model, _, _) = hf_model(name)?;
        let want = expected(&format!("{name}_expected.safetensors"))?;
        let greedy: Vec<u32> = ids(want.get("greedy").unwrap())?.squeeze(0)?.to_vec1()?;
        let (prompt, continuation) = greedy.split_at(4);
        let cfg = GenerateConfig {
            max_new_tokens: continuation.len(),
            ..Default::default()
        };
        assert_eq!(generate(&model, prompt, &cfg)?, continuation, "{name}");
        let no_cache = GenerateConfig {
            kv_cache: false,
            ..cfg
        };
        assert_eq!(generate(&model, prompt, &no_cache)?, continuation, "{name}");
    }
    Ok(())
}

/// One step of nanoGPT's optimizer: cross-entropy, clipping at 1, AdamW (lr 1e-2, betas
/// (0.9, 0.95), decay 0.1 on the matrices only); the tied weight's gradient is the sum of the
/// embedding's and the head's.
fn step_matches(
    model: &NextTokenPredictor,
    varmap: &VarMap,
    want: &StateDict,
    format: Gpt2Format,
    resume: Option<&StateDict>,
) -> Result<()> {
    let tokens = ids(want.get("tokens").unwrap())?;
    let l = tokens.dim(1)?;
    let input = tokens.narrow(1, 0, l - 1)?.contiguous()?;
    let targets = tokens.narrow(1, 1, l - 1)?.contiguous()?;
    let mask = input.ones_like()?.to_dtype(DType::U8)?;
    let loss = model.train_loss(&input, None, (0, 0), &targets, &mask)?;
    let want_loss = want.get("step_loss").unwrap().to_vec1::<f32>()?[0];
    let got_loss = loss.to_scalar::<f32>()?;
    assert!(
        (got_loss - want_loss).abs() < 1e-5 * want_loss.abs(),
        "loss {got_loss} vs {want_loss}"
    );
    let mut grads = loss.backward()?;
    let opt = AdamW::from_varmap(
        varmap,
        AdamWConfig {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
    )?
    .without_decay_for(|_, v| v.rank() < 2);
    let mut opt = opt;
    if let Some(state) = resume {
        opt.load_state_dict(state)?;
    }
    let norm = clip_grad_norm(&mut grads, &opt.vars(), 1.0)?;
    let want_norm = want.get("step_grad_norm").unwrap().to_vec1::<f32>()?[0] as f64;
    assert!(
        (norm - want_norm).abs() < 1e-5 * want_norm,
        "norm {norm} vs {want_norm}"
    );
    opt.step(&grads)?;
    let ours = StateDict::from_tensors(
        varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone())),
    );
    let theirs = gpt2::to_gpt2(&ours, format, model.config())?;
    for (name, t) in theirs.tensors() {
        if name == "lm_head.weight" && model.config().tie_embeddings {
            continue; // tied: PyTorch's named_parameters lists it once, as wte
        }
        let key = format!("updated.{name}");
        let want_p = want.get(&key).unwrap_or_else(|| panic!("{key} missing"));
        // The key bias shifts every score of a query's row alike: softmax cancels it, its
        // gradient is rounding noise on both sides, and Adam's normalised step turns that noise
        // into steps of up to lr. Its query and value thirds are compared.
        let (t, want_p) = match name.ends_with("c_attn.bias") {
            true => {
                let e = t.dim(0)? / 3;
                let qv = |x: &Tensor| -> Result<Tensor> {
                    Ok(Tensor::cat(
                        &[x.narrow(0, 0, e)?, x.narrow(0, 2 * e, e)?],
                        0,
                    )?)
                };
                (qv(t)?, qv(want_p)?)
            }
            false => (t.clone(), want_p.clone()),
        };
        let d = rel_diff(&t, &want_p)?;
        assert!(d < 1e-5, "{name}: relative difference {d:e}");
    }
    Ok(())
}

/// PyTorch's first step from a fresh optimizer, and from the state that `mha import` writes
/// into the run (step counts only: no optimizer has stepped, so no moments are held).
#[test]
fn hugging_face_training_step_equals_pytorch() -> Result<()> {
    for name in HF {
        let want = expected(&format!("{name}_expected.safetensors"))?;
        let (model, varmap, _) = hf_model(name)?;
        step_matches(&model, &varmap, &want, Gpt2Format::HuggingFace, None)?;

        let tmp = tempfile::tempdir()?;
        import::read_hugging_face(&fixtures().join(name), None)?.write_run(tmp.path())?;
        let state = StateDict::load(tmp.path().join("optimizer.safetensors"))?;
        assert!(!state.is_empty(), "{name}");
        for (key, t) in state.tensors() {
            assert!(key.starts_with("step."), "{name}: {key} in a fresh state");
            assert_eq!(t.to_scalar::<f64>()?, 0.0, "{name}: {key}");
        }
        let (model, varmap, _) = hf_model(name)?;
        step_matches(
            &model,
            &varmap,
            &want,
            Gpt2Format::HuggingFace,
            Some(&state),
        )?;
    }
    Ok(())
}

/// Export gives back the file's tensors, bit for bit (the head included, tied or not).
#[test]
fn hugging_face_round_trip_is_exact() -> Result<()> {
    for name in HF {
        let (cfg, sd, ours) = hf_files(name)?;
        let back = gpt2::to_gpt2(&ours, Gpt2Format::HuggingFace, &cfg)?;
        for (n, t) in sd.tensors() {
            let b = back
                .get(n)
                .unwrap_or_else(|| panic!("{name}: {n} not exported"));
            assert_eq!(b.dims(), t.dims(), "{name}: {n}");
            let same = b.flatten_all()?.to_vec1::<f32>()? == t.flatten_all()?.to_vec1::<f32>()?;
            assert!(same, "{name}: {n} changed");
        }
        // Tied: lm_head.weight is added (PyTorch's state_dict holds both names); untied, the
        // file holds it already.
        let added = usize::from(cfg.tie_embeddings);
        assert_eq!(back.len(), sd.len() + added, "{name}");
        assert_eq!(
            sd.get("lm_head.weight").is_some(),
            !cfg.tie_embeddings,
            "{name}"
        );
        let cfg_back = hf_gpt2::config_from_hf(&hf_gpt2::config_to_hf(&cfg))?;
        assert_eq!(cfg_back, cfg, "{name}");
    }
    Ok(())
}

/// nanoGPT's `ckpt.pt` (bias=False, exact GELU, `_orig_mod.` keys): PyTorch's logits, and the
/// next training step resumed from its optimizer state (moments, step counts, groups) equals
/// the one nanoGPT takes.
#[test]
fn nanogpt_checkpoint_resumes_as_pytorch() -> Result<()> {
    let dir = fixtures().join("nanogpt");
    let imported = import::read_nanogpt(&dir.join("ckpt.pt"), Some(&dir.join("meta.pkl")), None)?;
    let cfg = &imported.config;
    assert!(!cfg.bias && cfg.tie_embeddings && cfg.gelu == candle_mha_train::models::Gelu::Exact);
    assert_eq!(imported.step, 2);
    assert!(imported.train.decay_matrices_only);
    assert_eq!((imported.train.lr, imported.train.beta2), (1e-2, 0.95));
    assert_eq!(imported.codec.vocab_size(), cfg.vocab_size);
    assert_eq!(
        imported
            .codec
            .decode(&imported.codec.encode_prompt("First")?)?,
        "First"
    );
    let (model, varmap) = build(cfg, &imported.weights)?;
    let want = expected("nanogpt_expected.safetensors")?;
    let tokens = ids(want.get("tokens").unwrap())?;
    let input = tokens.narrow(1, 0, tokens.dim(1)? - 1)?.contiguous()?;
    let d = rel_diff(&model.forward(&input, None)?, want.get("logits").unwrap())?;
    assert!(d < 1e-5, "relative difference {d:e}");
    step_matches(
        &model,
        &varmap,
        &want,
        Gpt2Format::NanoGpt,
        imported.optimizer.as_ref(),
    )
}

/// nanoGPT's data directory (`train.bin`, `val.bin`, `meta.pkl`, as its `prepare.py` writes
/// them) opens as one stream split between the two files, decoding to the text it encodes.
#[test]
fn nanogpt_data_directory_is_one_stream() -> Result<()> {
    use candle_mha_train::data::TokenData;
    let dir = fixtures().join("nanogpt/data");
    let data = TokenData::open(&dir)?;
    let train = std::fs::metadata(dir.join("train.bin"))?.len() / 2;
    let val = std::fs::metadata(dir.join("val.bin"))?.len() / 2;
    assert_eq!((data.len(), data.meta().train_tokens), (train + val, train));
    let codec = data.codec()?;
    let text = "First Citizen: we are accounted poor citizens\n".repeat(40);
    assert_eq!(codec.decode(&data.tokens(0..data.len())?)?, text);
    // A window across the two files.
    let across = data.tokens(train - 3..train + 3)?;
    assert_eq!(
        codec.decode(&across)?,
        text[train as usize - 3..train as usize + 3]
    );
    // An id outside meta.pkl's vocabulary is named in the file that holds it (val.bin at
    // offset 2), not in a tokens.bin nanoGPT's data does not have.
    let tmp = tempfile::tempdir()?;
    for f in ["train.bin", "val.bin", "meta.pkl"] {
        std::fs::copy(dir.join(f), tmp.path().join(f))?;
    }
    let mut val_bytes = std::fs::read(dir.join("val.bin"))?;
    val_bytes[4..6].copy_from_slice(&999u16.to_le_bytes());
    std::fs::write(tmp.path().join("val.bin"), val_bytes)?;
    let e = TokenData::open(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("val.bin: id 999 at offset 2") && !e.contains("tokens.bin"),
        "{e}"
    );
    Ok(())
}

/// A sharded checkpoint (`model.safetensors.index.json` and its shards, or the older
/// `pytorch_model.bin.index.json` and `torch.save` shards) of a bare `GPT2Model`'s names (no
/// `transformer.`) imports to the same logits.
#[test]
fn sharded_checkpoints_without_the_prefix_import() -> Result<()> {
    use candle_mha::checkpoint::{save_torch, PickleValue};
    let sd = StateDict::load(fixtures().join("hf/model.safetensors"))?;
    let want = expected("hf_expected.safetensors")?;
    for (index, ext) in [
        ("model.safetensors.index.json", "safetensors"),
        ("pytorch_model.bin.index.json", "bin"),
    ] {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path();
        std::fs::copy(fixtures().join("hf/config.json"), dir.join("config.json"))?;
        let mut shards: [Vec<(String, Tensor)>; 2] = [Vec::new(), Vec::new()];
        let mut map = serde_json::Map::new();
        let file = |i: usize| format!("shard-0000{}-of-00002.{ext}", i + 1);
        for (i, (name, t)) in sd.tensors().iter().enumerate() {
            let bare = name.trim_start_matches("transformer.").to_string();
            map.insert(bare.clone(), file(i % 2).into());
            shards[i % 2].push((bare, t.clone()));
        }
        for (i, shard) in shards.into_iter().enumerate() {
            let path = dir.join(file(i));
            match ext {
                "bin" => save_torch(
                    &path,
                    &PickleValue::Dict(
                        shard
                            .into_iter()
                            .map(|(n, t)| (PickleValue::Str(n), PickleValue::Tensor(t)))
                            .collect(),
                    ),
                )?,
                _ => StateDict::from_tensors(shard).save_safetensors(path)?,
            }
        }
        std::fs::write(
            dir.join(index),
            serde_json::json!({ "metadata": {}, "weight_map": map }).to_string(),
        )?;
        let imported = import::read_hugging_face(dir, None)?;
        let (model, _) = build(&imported.config, &imported.weights)?;
        let logits = model.forward(&ids(want.get("tokens").unwrap())?, None)?;
        let d = rel_diff(&logits, want.get("logits").unwrap())?;
        assert!(d < 1e-5, "{index}: relative difference {d:e}");
    }
    Ok(())
}

/// GPT-2's slow-tokenizer files (`vocab.json`, `merges.txt`, `added_tokens.json`) give the ids
/// transformers gives (`GPT2Tokenizer.from_pretrained` of the directory), special and added
/// tokens, bytes outside ASCII and runs of spaces included; decoding skips only the special
/// token. A Hugging Face directory with these files and no `tokenizer.json` is read with them.
#[test]
fn slow_tokenizer_files_encode_as_transformers() -> Result<()> {
    use candle_mha_train::data::TextTokenizer;
    let dir = fixtures().join("slow-tokenizer");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)?;
    let text = want["text"].as_str().unwrap();
    let ids: Vec<u32> = serde_json::from_value(want["ids"].clone())?;
    let tok = TextTokenizer::gpt2_files(
        &dir.join("vocab.json"),
        &dir.join("merges.txt"),
        &[("<|sep|>".to_string(), 500)],
    )?;
    assert_eq!(tok.encode(text)?, ids);
    assert_eq!(tok.vocab_size(), 501);
    assert_eq!(tok.eos_id(), Some(0));
    assert_eq!(tok.decode(&ids)?, text.replace("<|endoftext|>", ""));

    // The import finds them (501 ids, more than the fixture model's 61: refused by name).
    let tmp = tempfile::tempdir()?;
    for f in ["vocab.json", "merges.txt", "added_tokens.json"] {
        std::fs::copy(dir.join(f), tmp.path().join(f))?;
    }
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("hf").join(f), tmp.path().join(f))?;
    }
    let err = import::read_hugging_face(tmp.path(), None)
        .err()
        .expect("a tokenizer larger than the model")
        .to_string();
    assert!(err.contains("501 ids, more than the model's 61"), "{err}");
    // A malformed merges file is refused with its line.
    std::fs::write(
        tmp.path().join("merges.txt"),
        "#version: 0.2\nĠ t\nnospace\n",
    )?;
    let err = import::read_hugging_face(tmp.path(), None)
        .err()
        .expect("a bad merges.txt")
        .to_string();
    assert!(
        err.contains("merges.txt:3") && err.contains("nospace"),
        "{err}"
    );
    Ok(())
}
