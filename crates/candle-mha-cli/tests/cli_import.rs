//! `mha import`: a Hugging Face GPT-2 directory and nanoGPT's `ckpt.pt` become run directories
//! that `generate`, `info` and `train --resume` take; what cannot be honoured is refused by
//! name. The numbers themselves are checked against PyTorch in the train crate's `gpt2` tests.

mod common;

use std::path::Path;

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::checkpoint::StateDict;
use common::run_mha;
use common::s;

fn gpt2() -> std::path::PathBuf {
    common::fixtures_dir().join("gpt2")
}

/// `mha import` of the nanoGPT fixture with its character vocabulary into `run`.
fn import_nanogpt(run: &Path) -> Result<(bool, String, String)> {
    let nano = gpt2().join("nanogpt");
    run_mha!(
        "import {} --meta {} --out {}",
        s(&nano),
        s(&nano.join("meta.pkl")),
        s(run)
    )
}

/// `mha generate` on the imported Hugging Face model continues the prompt with the tokens
/// `GPT2LMHeadModel.generate(do_sample=False)` gave (the model has no tokenizer: ids).
#[test]
fn an_imported_hugging_face_model_generates_pytorchs_greedy_tokens() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let (ok, out, err) = run_mha!("import {} --out {}", s(&gpt2().join("hf")), s(&run))?;
    assert!(ok && out.contains("tied head"), "{err}");
    assert!(
        err.contains("8 Conv1D weights transposed") && err.contains("token ids"),
        "{err}"
    );
    let want = StateDict::load(gpt2().join("hf_expected.safetensors"))?;
    let greedy: Vec<u32> = want
        .get("greedy")
        .unwrap()
        .to_dtype(DType::U32)?
        .squeeze(0)?
        .to_vec1()?;
    let words: Vec<String> = greedy.iter().map(u32::to_string).collect();
    let prompt = words[..4].join(" ");
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt {} --max-new-tokens {}",
        s(&run),
        &prompt,
        &(greedy.len() - 4).to_string()
    )?;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), words.join(" "));
    // A run is there now: a second import into it is refused.
    let (ok, _, err) = run_mha!("import {} --out {}", s(&gpt2().join("hf")), s(&run))?;
    assert!(!ok && err.contains("already holds a run"), "{err}");
    Ok(())
}

/// nanoGPT's checkpoint with its character vocabulary: generation in text, and `--resume`
/// continues its run (step 2, its optimizer) on text encoded with its own tokenizer.
#[test]
fn an_imported_nanogpt_run_resumes_on_text() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let (ok, out, err) = import_nanogpt(&run)?;
    assert!(
        ok && out.contains("step 2, with its optimizer state"),
        "{err}"
    );
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt 'First Citizen' --max-new-tokens 5",
        s(&run)
    )?;
    assert!(ok && out.starts_with("First Citizen"), "{err}");
    // Without data, a resume asks for it; with text it encodes it with the run's tokenizer.
    let (ok, _, err) = run_mha!("train --out {} --resume --steps 4", s(&run))?;
    assert!(!ok && err.contains("give its data"), "{err}");
    let text = tmp.path().join("citizens.txt");
    std::fs::write(
        &text,
        "First Citizen: we are accounted poor citizens\n".repeat(50),
    )?;
    let (ok, _, err) = run_mha!(
        "train --out {} --resume --text {} --steps 4 --quiet",
        s(&run),
        s(&text)
    )?;
    assert!(ok && err.contains("resuming at step 2 of 4"), "{err}");
    let state = std::fs::read_to_string(run.join("trainer_state.json"))?;
    assert!(
        state.contains("\"step\": 4") && state.contains("\"decay_matrices_only\": true"),
        "{state}"
    );
    Ok(())
}

/// What a checkpoint asks that this model cannot do, and indexes that point outside the
/// directory, are refused by name.
#[test]
fn what_cannot_be_honoured_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = std::fs::read_to_string(gpt2().join("hf/config.json"))?;
    for (from, to, needle) in [
        (
            "\"scale_attn_by_inverse_layer_idx\": false",
            "\"scale_attn_by_inverse_layer_idx\": true",
            "scale_attn_by_inverse_layer_idx",
        ),
        ("\"gelu_new\"", "\"relu\"", "activation_function \"relu\""),
        (
            "\"model_type\": \"gpt2\"",
            "\"model_type\": \"gemma\"",
            "model_type \"gemma\" is not supported",
        ),
        // More blocks than the weights hold: refused before a model that size is built.
        (
            "\"n_layer\": 2",
            "\"n_layer\": 4000",
            "describes parameters the weights lack: transformer.h.2.ln_1.weight",
        ),
    ] {
        let dir = tmp.path().join(format!("hf-{}", needle.len()));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(
            gpt2().join("hf/model.safetensors"),
            dir.join("model.safetensors"),
        )?;
        assert!(config.contains(from), "{from}");
        std::fs::write(dir.join("config.json"), config.replace(from, to))?;
        let (ok, _, err) = run_mha!("import {} --out {}", s(&dir), s(&tmp.path().join("out")))?;
        assert!(!ok && err.contains(needle), "{needle}: {err}");
    }
    let sharded = tmp.path().join("sharded");
    std::fs::create_dir_all(&sharded)?;
    std::fs::write(sharded.join("config.json"), &config)?;
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        r#"{"weight_map": {"transformer.wte.weight": "../outside.safetensors"}}"#,
    )?;
    let (ok, _, err) = run_mha!(
        "import {} --out {}",
        s(&sharded),
        s(&tmp.path().join("out"))
    )?;
    assert!(!ok && err.contains("not a file of the directory"), "{err}");
    Ok(())
}

/// Import then export gives back the Hugging Face file bit for bit, with a tied head and with
/// an untied one (`lm_head.weight` in the file); a model Hugging Face's GPT-2 cannot hold
/// (nanoGPT's `bias=False`, `mha train`'s head with a bias) is refused before anything is
/// written.
#[test]
fn export_gives_back_the_hugging_face_weights() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    for name in ["hf", "hf-untied"] {
        let (run, out) = (
            tmp.path().join(name),
            tmp.path().join(format!("{name}-out")),
        );
        let (ok, _, err) = run_mha!("import {} --out {}", s(&gpt2().join(name)), s(&run))?;
        assert!(ok, "{err}");
        let (ok, _, err) = run_mha!("export {} --out {}", s(&run), s(&out))?;
        assert!(ok, "{err}");
        let original = StateDict::load(gpt2().join(name).join("model.safetensors"))?;
        let exported = StateDict::load(out.join("model.safetensors"))?;
        assert_eq!(exported.len(), original.len(), "{name}");
        for (n, t) in original.tensors() {
            let e = exported
                .get(n)
                .unwrap_or_else(|| panic!("{name}: {n} not exported"));
            let same = e.flatten_all()?.to_vec1::<f32>()? == t.flatten_all()?.to_vec1::<f32>()?;
            assert!(same && e.dims() == t.dims(), "{name}: {n} changed");
        }
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json"))?)?;
        assert_eq!(config["activation_function"], "gelu_new");
        assert_eq!(config["tie_word_embeddings"], name == "hf", "{name}");
    }

    let nano = tmp.path().join("nano");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&gpt2().join("nanogpt")), s(&nano))?;
    assert!(ok, "{err}");
    // nanoGPT's bias=False: exported with zero biases, imported back it continues a prompt
    // with the same tokens.
    let nano_hf = tmp.path().join("nano-hf");
    let (ok, _, err) = run_mha!("export {} --out {}", s(&nano), s(&nano_hf))?;
    assert!(ok, "{err}");
    let exported = StateDict::load(nano_hf.join("model.safetensors"))?;
    let bias = exported
        .get("transformer.h.1.mlp.c_fc.bias")
        .expect("zero biases written");
    assert_eq!(bias.dims(), [64]);
    assert!(bias.to_vec1::<f32>()?.iter().all(|b| *b == 0.0));
    let back = tmp.path().join("nano-back");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&nano_hf), s(&back))?;
    assert!(ok, "{err}");
    let greedy = |run: &Path| -> Result<String> {
        let (ok, out, err) = run_mha!(
            "generate --checkpoint {} --prompt '3 1 4' --max-new-tokens 12",
            s(run)
        )?;
        assert!(ok, "{err}");
        Ok(out)
    };
    assert_eq!(greedy(&nano)?, greedy(&back)?);
    // `mha train`'s own model: an untied head without a bias, as GPT-2's lm_head.
    let own = tmp.path().join("own");
    let (ok, _, err) = run_mha!(
        "train --out {} --steps 1 --embed-dim 8 --num-heads 2 --num-layers 1 --quiet",
        s(&own)
    )?;
    assert!(ok, "{err}");
    let own_hf = tmp.path().join("own-hf");
    let (ok, _, err) = run_mha!("export {} --out {}", s(&own), s(&own_hf))?;
    assert!(ok, "{err}");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(own_hf.join("config.json"))?)?;
    assert_eq!(cfg["tie_word_embeddings"], false);
    let weights = StateDict::load(own_hf.join("model.safetensors"))?;
    assert!(weights.get("lm_head.weight").is_some() && weights.get("lm_head.bias").is_none());
    // A run made before that default (no `head_bias` in its config.json, a `head.bias`):
    // refused, with nothing written.
    let old = tmp.path().join("old");
    std::fs::create_dir_all(&old)?;
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(own.join("config.json"))?)?;
    cfg.as_object_mut().unwrap().remove("head_bias");
    std::fs::write(old.join("config.json"), serde_json::to_vec(&cfg)?)?;
    let model = StateDict::load(own.join("model.safetensors"))?;
    let v = model.get("head.weight").unwrap().dims()[0];
    let bias = candle_mha::candle::Tensor::zeros(v, DType::F32, &candle_mha::candle::Device::Cpu)?;
    let with_bias = model
        .tensors()
        .iter()
        .cloned()
        .chain([("head.bias".to_string(), bias)]);
    StateDict::from_tensors(with_bias).save_safetensors(old.join("model.safetensors"))?;
    for f in ["vocab.json", "trainer_state.json", "optimizer.safetensors"] {
        std::fs::copy(own.join(f), old.join(f))?;
    }
    let refused = tmp.path().join("refused");
    let (ok, _, err) = run_mha!("export {} --unverified --out {}", s(&old), s(&refused))?;
    assert!(!ok && err.contains("has a bias"), "{err}");
    assert!(!refused.exists());
    Ok(())
}

/// `--init-from` starts a new run from an imported checkpoint: its model and tokenizer, a
/// fresh optimizer at step 0, the text encoded with its tokenizer; at 0 steps the weights are
/// the checkpoint's, byte for byte.
#[test]
fn a_new_run_starts_from_an_imported_checkpoint() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let (ok, _, err) = import_nanogpt(&run)?;
    assert!(ok, "{err}");
    let text = tmp.path().join("citizens.txt");
    std::fs::write(
        &text,
        "First Citizen: we are accounted poor citizens\n".repeat(50),
    )?;
    for steps in ["0", "3"] {
        let ft = tmp.path().join(format!("ft{steps}"));
        let (ok, _, err) = run_mha!(
            "train --init-from {} --text {} --out {} --steps {} --quiet",
            s(&run),
            s(&text),
            s(&ft),
            steps
        )?;
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read_to_string(ft.join("config.json"))?,
            std::fs::read_to_string(run.join("config.json"))?
        );
        let same = std::fs::read(ft.join("model.safetensors"))?
            == std::fs::read(run.join("model.safetensors"))?;
        assert_eq!(same, steps == "0", "after {steps} steps");
    }
    let (ok, _, err) = run_mha!(
        "train --init-from {} --embed-dim 8 --out {}",
        s(&run),
        s(&tmp.path().join("x"))
    )?;
    assert!(!ok && err.contains("--embed-dim"), "{err}");
    Ok(())
}

/// nanoGPT's checkpoint imported then exported holds the same model and optimizer state,
/// tensor for tensor. (That PyTorch reads it, `torch.load(weights_only=True)`, and nanoGPT's
/// own code resumes it to its own next step is `scripts/check_gpt2_export.py`'s check: CI has
/// no torch.)
#[test]
fn nanogpt_export_gives_back_its_checkpoint() -> Result<()> {
    use candle_mha::checkpoint::{load_pickle, PickleValue};
    let tmp = tempfile::tempdir()?;
    let (run, out) = (tmp.path().join("run"), tmp.path().join("out"));
    let original = gpt2().join("nanogpt/ckpt.pt");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&original), s(&run))?;
    assert!(ok, "{err}");
    let (ok, _, err) = run_mha!("export {} --format nanogpt --out {}", s(&run), s(&out))?;
    assert!(ok, "{err}");
    let (a, b) = (load_pickle(&original)?, load_pickle(&out.join("ckpt.pt"))?);
    let values = |t: &PickleValue| -> Vec<f32> {
        t.as_tensor()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let model_b = b.get("model").unwrap();
    for (k, t) in a.get("model").unwrap().as_dict().unwrap() {
        let name = k.as_str().unwrap().trim_start_matches("_orig_mod.");
        if name == "_metadata" {
            continue; // state_dict()'s module versions, not a tensor
        }
        let e = model_b
            .get(name)
            .unwrap_or_else(|| panic!("{name} not exported"));
        assert_eq!(values(e), values(t), "{name}");
    }
    let (sa, sb) = (
        a.get("optimizer").unwrap().get("state").unwrap(),
        b.get("optimizer").unwrap().get("state").unwrap(),
    );
    assert_eq!(sa.as_dict().unwrap().len(), sb.as_dict().unwrap().len());
    for (id, slot) in sa.as_dict().unwrap() {
        let other = sb.get_index(id.as_i64().unwrap()).unwrap();
        for key in ["exp_avg", "exp_avg_sq"] {
            assert_eq!(
                values(slot.get(key).unwrap()),
                values(other.get(key).unwrap()),
                "{id:?} {key}"
            );
        }
        assert_eq!(
            slot.get("step").and_then(PickleValue::as_f64),
            other.get("step").and_then(PickleValue::as_f64)
        );
    }
    assert_eq!(b.get("iter_num").and_then(PickleValue::as_i64), Some(2));
    assert_eq!(
        b.get("model_args")
            .unwrap()
            .get("bias")
            .and_then(PickleValue::as_bool),
        Some(false)
    );
    Ok(())
}

/// An imported nanoGPT run resumes on nanoGPT's own data directory (`train.bin`, `val.bin`,
/// `meta.pkl`), and `eval --data` reads it.
#[test]
fn nanogpt_data_directories_are_data() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let nano = gpt2().join("nanogpt");
    let (ok, _, err) = import_nanogpt(&run)?;
    assert!(ok, "{err}");
    let data = nano.join("data");
    let (ok, _, err) = run_mha!(
        "train --out {} --resume --data {} --steps 4 --quiet",
        s(&run),
        s(&data)
    )?;
    assert!(ok && err.contains("resuming at step 2 of 4"), "{err}");
    let (ok, out, err) = run_mha!("eval --checkpoint {} --data {}", s(&run), s(&data))?;
    assert!(
        ok && out.contains("validation part, 184 tokens"),
        "{out}{err}"
    );
    Ok(())
}

/// A `ckpt.pt` written by nanoGPT's own `train.py` (`scripts/make_nanogpt_own_fixture.sh`):
/// imported with its `meta.pkl`, `mha generate` prints the greedy text nanoGPT's
/// `GPT.generate(top_k=1)` printed.
#[test]
fn a_checkpoint_of_nanogpts_own_train_py_generates_its_greedy_text() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let own = gpt2().join("nanogpt-own");
    let (ok, _, err) = run_mha!(
        "import {} --meta {} --out {}",
        s(&own.join("ckpt.pt")),
        s(&own.join("meta.pkl")),
        s(&run)
    )?;
    assert!(ok, "{err}");
    let want = std::fs::read_to_string(own.join("greedy.txt"))?;
    let prompt = "The licensee";
    let new = want.chars().count() - prompt.chars().count();
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt {} --max-new-tokens {}",
        s(&run),
        prompt,
        &new.to_string()
    )?;
    assert!(ok, "{err}");
    assert_eq!(out.trim_end_matches('\n'), want);
    Ok(())
}
