//! `mha train --init-from RUN --lora-rank R`: a LoRA run's checkpoints hold the adapter and its
//! optimizer only and reference the base by hash; `--resume`, `best/`, `eval`, `generate`,
//! `export` (merged, and PEFT's files) and `import --base` work on it. Its numbers against
//! PEFT are the train crate's `lora` tests.

mod common;

use std::path::Path;

use anyhow::Result;
use candle_mha::checkpoint::StateDict;
use common::run_mha;
use common::s;

/// The Hugging Face GPT-2 fixture imported into `tmp/base`, and a text to train on.
fn base(tmp: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let (run, text) = (tmp.join("base"), tmp.join("ids.txt"));
    let hf = common::fixtures_dir().join("gpt2/hf");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&hf), s(&run))?;
    assert!(ok, "{err}");
    // The fixture has no tokenizer: its text is ids.
    let ids: Vec<String> = (0..2000)
        .map(|i| ((i * 7 + i / 13) % 61).to_string())
        .collect();
    std::fs::write(&text, ids.join(" "))?;
    Ok((run, text))
}

#[test]
fn a_lora_run_trains_resumes_and_goes_back_as_peft() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (base, text) = base(tmp.path())?;
    let lora = tmp.path().join("lora");
    let (ok, _, err) = run_mha!(
        "train --init-from {} --text {} --out {} --steps 4 --eval-every 2 --quiet --lora-rank 4 --lora-alpha 16 --lora-targets c_attn,c_fc",
        s(&base),
        s(&text),
        s(&lora)
    )?;
    assert!(ok, "{err}");
    // The adapter alone: 2 layers x 2 targets x (A, B), and its moments.
    let sd = StateDict::load(lora.join("model.safetensors"))?;
    assert_eq!(sd.len(), 8);
    assert!(sd.get("blocks.1.mlp.fc1.lora_B.weight").is_some());
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lora.join("lora.json"))?)?;
    assert_eq!(record["spec"]["rank"], 4);
    assert_eq!(
        record["spec"]["targets"],
        serde_json::json!(["c_attn", "c_fc"])
    );
    assert_eq!(
        record["base"]["model_sha256"].as_str().map(str::len),
        Some(64)
    );
    assert!(lora.join("best/lora.json").exists());
    let base_before = std::fs::read(base.join("model.safetensors"))?;

    let (ok, _, err) = run_mha!("train --resume --out {} --steps 6 --quiet", s(&lora))?;
    assert!(ok, "{err}");
    let (ok, out, err) = run_mha!("eval --checkpoint {} --text {}", s(&lora), s(&text))?;
    assert!(ok && out.contains("loss"), "{err}");
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt {} --max-new-tokens 4",
        s(&lora),
        "3 5 7"
    )?;
    assert!(ok && !out.trim().is_empty(), "{err}");
    assert_eq!(
        std::fs::read(base.join("model.safetensors"))?,
        base_before,
        "the base changed"
    );

    // Merged, and as PEFT's files; PEFT's files read back give the same merged model.
    let (merged, peft, back) = (
        tmp.path().join("m"),
        tmp.path().join("p"),
        tmp.path().join("b"),
    );
    let (ok, _, err) = run_mha!("export {} --out {}", s(&lora), s(&merged))?;
    assert!(ok, "{err}");
    let (ok, _, err) = run_mha!("export {} --format peft --out {}", s(&lora), s(&peft))?;
    assert!(ok, "{err}");
    assert!(
        peft.join("adapter_config.json").exists()
            && peft.join("adapter_model.safetensors").exists()
    );
    let (ok, _, err) = run_mha!("import {} --base {} --out {}", s(&peft), s(&base), s(&back))?;
    assert!(ok, "{err}");
    let merged_again = tmp.path().join("m2");
    let (ok, _, err) = run_mha!("export {} --out {}", s(&back), s(&merged_again))?;
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(merged.join("model.safetensors"))?,
        std::fs::read(merged_again.join("model.safetensors"))?
    );
    // The merged model is not the base's: the adapter trained.
    let base_hf = tmp.path().join("bh");
    let (ok, _, err) = run_mha!("export {} --out {}", s(&base), s(&base_hf))?;
    assert!(ok, "{err}");
    assert_ne!(
        std::fs::read(merged.join("model.safetensors"))?,
        std::fs::read(base_hf.join("model.safetensors"))?
    );
    Ok(())
}

#[test]
fn lora_options_are_checked_before_anything_is_written() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (base, text) = base(tmp.path())?;
    let out = tmp.path().join("out");
    let refused = [
        (vec!["--lora-rank", "4"], "--init-from"),
        (
            vec!["--init-from", s(&base), "--lora-rank", "0"],
            "lora-rank",
        ),
        (
            vec![
                "--init-from",
                s(&base),
                "--lora-rank",
                "4",
                "--lora-targets",
                "q_proj",
            ],
            "q_proj",
        ),
        (
            vec!["--init-from", s(&base), "--lora-alpha", "4"],
            "--lora-rank",
        ),
    ];
    for (args, what) in refused {
        let mut argv = vec![
            "train",
            "--text",
            s(&text),
            "--out",
            s(&out),
            "--steps",
            "1",
            "--quiet",
        ];
        argv.extend(args.iter().copied());
        let (ok, _, err) = common::mha(&argv.iter().map(|a| a.to_string()).collect::<Vec<_>>())?;
        assert!(!ok && err.contains(what), "{args:?}: {err}");
        assert!(
            !out.exists(),
            "{args:?}: a refused run left {}",
            out.display()
        );
    }
    // A full run is no LoRA run: nothing to export as PEFT's.
    let (ok, _, err) = run_mha!("export {} --format peft --out {}", s(&base), s(&out))?;
    assert!(!ok && err.contains("not a LoRA run"), "{err}");
    assert!(!out.exists());
    Ok(())
}
