//! Llama-family models through the command line: `mha import` of directories transformers
//! saved (`scripts/make_llama_fixtures.py`), then `generate` (transformers' greedy text and
//! tokens, stopping at `generation_config.json`'s end ids), `eval`, `inspect`, `info`,
//! `train --init-from` / `--resume`, `export --format hf` (the weights back byte for byte);
//! `train --arch llama` from scratch; what the model cannot honour refused with nothing
//! written. The numbers themselves are checked against transformers in the train crate's
//! `llama` tests.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_mha::candle::DType;
use candle_mha::checkpoint::StateDict;
use common::run_mha;
use common::s;

fn fixture(case: &str) -> PathBuf {
    common::fixtures_dir().join("llama").join(case)
}

fn json(path: &Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(&std::fs::read(path)?)?)
}

/// Text in, text out: transformers' greedy continuation of the prompt with its byte-level BPE
/// tokenizer, stopping where `generation_config.json`'s second end id is reached (with and
/// without the cache).
#[test]
fn an_imported_llama_continues_a_prompt_as_transformers_does() -> Result<()> {
    for (case, class) in [
        ("llama_text", "LlamaForCausalLM"),
        ("qwen2_text", "Qwen2ForCausalLM"),
    ] {
        continues_as_transformers(case, class)?;
    }
    Ok(())
}

fn continues_as_transformers(case: &str, class: &str) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let (ok, out, err) = run_mha!("import {} --out {}", s(&fixture(case)), s(&run))?;
    assert!(ok, "{err}");
    let heads = format!("{class}, 6 query / 2 key-value heads of 8");
    assert!(out.contains(&heads) && out.contains("tied head"), "{out}");
    let want = json(&fixture(case).join("expected.json"))?;
    let prompt = want["prompt"].as_str().unwrap();
    let continuation = want["continuation"].as_str().unwrap();
    let new = want["new_ids"].as_array().unwrap().len();
    // 16 tokens asked for, fewer made: the end id stopped it, as in transformers.
    assert!(new < 16, "{want}");
    for cache in [true, false] {
        let (ok, out, err) = match cache {
            true => run_mha!(
                "generate --checkpoint {} --prompt {} --max-new-tokens 16",
                s(&run),
                prompt
            )?,
            false => run_mha!(
                "generate --checkpoint {} --prompt {} --max-new-tokens 16 --no-kv-cache",
                s(&run),
                prompt
            )?,
        };
        assert!(ok, "{err}");
        assert_eq!(
            out,
            format!("{prompt}{continuation}\n"),
            "{case}: cache {cache}"
        );
    }
    // inspect shows every query head; eval and info read the run.
    let (ok, out, err) = run_mha!("inspect --checkpoint {} --input {}", s(&run), prompt)?;
    assert!(ok && out.contains("mean over 6 heads"), "{out}{err}");
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "This License applies to any program or other work.\n".repeat(8),
    )?;
    let (ok, out, err) = run_mha!("eval --checkpoint {} --text {}", s(&run), s(&text))?;
    assert!(ok && out.contains("perplexity"), "{out}{err}");
    let (ok, out, err) = run_mha!("info {}", s(&run))?;
    assert!(
        ok && out.contains("model.layers.1.self_attn.k_proj.weight"),
        "{out}{err}"
    );
    Ok(())
}

/// Token ids: the greedy tokens of each fixture with `generate(do_sample=False)`; the export
/// gives `model.safetensors` back byte for byte (its source dtypes: bf16 shards come back as
/// one bf16 file with the same tensors) and the same `config.json` and
/// `generation_config.json`.
#[test]
fn import_generate_export_round_trip() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    for case in [
        "llama_gqa3_tied",
        "qwen2",
        "mistral",
        "llama_gqa7_llama3",
        "llama_sharded_bf16",
    ] {
        let run = tmp.path().join(case);
        let (ok, _, err) = run_mha!("import {} --out {}", s(&fixture(case)), s(&run))?;
        assert!(ok, "{case}: {err}");
        let want = StateDict::load(fixture(case).join("expected.safetensors"))?;
        let ids = |name: &str| -> Result<Vec<String>> {
            let t = want
                .get(name)
                .unwrap()
                .to_dtype(DType::U32)?
                .flatten_all()?;
            Ok(t.to_vec1::<u32>()?.iter().map(u32::to_string).collect())
        };
        let (prompt, greedy) = (ids("prompt")?, ids("greedy")?);
        let (ok, out, err) = run_mha!(
            "generate --checkpoint {} --prompt {} --max-new-tokens {}",
            s(&run),
            &prompt.join(" "),
            &greedy.len().to_string()
        )?;
        assert!(ok, "{case}: {err}");
        assert_eq!(out.trim(), [prompt, greedy].concat().join(" "), "{case}");
        let out_dir = tmp.path().join(format!("{case}-hf"));
        let (ok, out, err) = run_mha!("export {} --out {}", s(&run), s(&out_dir))?;
        assert!(
            ok && out.contains("ForCausalLM.from_pretrained"),
            "{case}: {out}{err}"
        );
        let single = fixture(case).join("model.safetensors");
        let exported = std::fs::read(out_dir.join("model.safetensors"))?;
        if single.exists() {
            assert!(
                std::fs::read(&single)? == exported,
                "{case}: model.safetensors differs"
            );
        } else {
            let back = StateDict::load(out_dir.join("model.safetensors"))?;
            let index = json(&fixture(case).join("model.safetensors.index.json"))?;
            let names = index["weight_map"].as_object().unwrap();
            assert_eq!(back.len(), names.len(), "{case}");
            for (_, t) in back.tensors() {
                assert_eq!(t.dtype(), DType::BF16, "{case}");
            }
        }
        for file in ["config.json", "generation_config.json"] {
            assert_eq!(
                json(&out_dir.join(file))?,
                json(&fixture(case).join(file))?,
                "{case} {file}"
            );
        }
    }
    Ok(())
}

/// Fine-tuning an imported model: `train --init-from` on text of its ids, `--resume`, and the
/// export of the fine-tuned run read back by the importer.
#[test]
fn an_imported_llama_trains_further_and_goes_back() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (base, tuned) = (tmp.path().join("base"), tmp.path().join("tuned"));
    let (ok, _, err) = run_mha!("import {} --out {}", s(&fixture("llama_text")), s(&base))?;
    assert!(ok, "{err}");
    let text = PathBuf::from(common::gpl_text());
    let (ok, _, err) = run_mha!(
        "train --init-from {} --text {} --out {} --steps 2 --batch-size 2 --max-len 32",
        s(&base),
        s(&text),
        s(&tuned)
    )?;
    assert!(ok, "{err}");
    let (ok, _, err) = run_mha!("train --out {} --resume --steps 3", s(&tuned))?;
    assert!(ok, "{err}");
    let state = json(&tuned.join("trainer_state.json"))?;
    assert_eq!(state["step"], 3, "{state}");
    let hf = tmp.path().join("tuned-hf");
    let (ok, _, err) = run_mha!("export {} --out {}", s(&tuned), s(&hf))?;
    assert!(ok, "{err}");
    // Trained: other weights than the source's, under the same names and shapes.
    let (a, b) = (
        StateDict::load(fixture("llama_text").join("model.safetensors"))?,
        StateDict::load(hf.join("model.safetensors"))?,
    );
    assert_eq!(a.len(), b.len());
    let q = "model.layers.0.self_attn.q_proj.weight";
    let diff = common::max_abs_diff(a.get(q).unwrap(), b.get(q).unwrap())?;
    assert!(diff > 0.0, "the fine-tuned q_proj is the source's");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&hf), s(&tmp.path().join("again")))?;
    assert!(ok, "{err}");
    Ok(())
}

/// `mha train --arch llama` trains a new Llama-style model on text; it exports as a
/// LlamaForCausalLM with its grouped heads.
#[test]
fn train_arch_llama_from_scratch() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let text = PathBuf::from(common::gpl_text());
    let (ok, out, err) = run_mha!(
        "train --arch llama --num-kv-heads 2 --num-heads 4 --embed-dim 32 --num-layers 2 --text {} --out {} --steps 3 --batch-size 2 --max-len 32 --bpe-vocab 300",
        s(&text),
        s(&run)
    )?;
    assert!(ok, "{out}{err}");
    let hf = tmp.path().join("hf");
    let (ok, out, err) = run_mha!("export {} --out {}", s(&run), s(&hf))?;
    assert!(
        ok && out.contains("LlamaForCausalLM.from_pretrained"),
        "{out}{err}"
    );
    let cfg = json(&hf.join("config.json"))?;
    assert_eq!(cfg["model_type"], "llama");
    assert_eq!(cfg["num_key_value_heads"], 2);
    assert_eq!(cfg["num_attention_heads"], 4);
    assert!(hf.join("tokenizer.json").exists());
    // Options a Llama run cannot hold are refused before anything is made.
    let other = tmp.path().join("other");
    let (ok, _, err) = run_mha!(
        "train --arch llama --num-kv-heads 3 --num-heads 4 --embed-dim 32 --text {} --out {} --steps 1",
        s(&text),
        s(&other)
    )?;
    assert!(
        !ok && err.contains("--num-kv-heads 3: expected a divisor of --num-heads 4"),
        "{err}"
    );
    assert!(!other.exists());
    Ok(())
}

/// What the model cannot honour is refused by name, and no run directory is left.
#[test]
fn an_unsupported_llama_is_refused_by_name() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let src = tmp.path().join("mistral-window");
    std::fs::create_dir_all(&src)?;
    for e in std::fs::read_dir(fixture("mistral"))? {
        let p = e?.path();
        std::fs::copy(&p, src.join(p.file_name().unwrap()))?;
    }
    let mut cfg = json(&src.join("config.json"))?;
    cfg["sliding_window"] = 16.into();
    std::fs::write(src.join("config.json"), serde_json::to_vec(&cfg)?)?;
    let run = tmp.path().join("run");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&src), s(&run))?;
    assert!(
        !ok && err.contains("sliding_window 16 is shorter than the context"),
        "{err}"
    );
    assert!(!run.exists());
    Ok(())
}
