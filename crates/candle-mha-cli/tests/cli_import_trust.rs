//! `mha import` and `mha export` on hostile or careless input: nothing a user wrote is
//! overwritten, a refused or failed command leaves the file system as it found it, a broken
//! tokenizer is an error (never a panic), and what a nanoGPT checkpoint says is used or
//! refused by name, never replaced by a default.

mod common;

use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_mha::checkpoint::{load_pickle, save_torch, PickleValue};
use common::run_mha;
use common::s;

fn gpt2() -> PathBuf {
    common::fixtures_dir().join("gpt2")
}

/// Every file under `dir` (relative name → bytes), links as their targets' names.
fn snapshot(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let path = e?.path();
            let name = path.strip_prefix(dir)?.display().to_string();
            let md = std::fs::symlink_metadata(&path)?;
            if md.file_type().is_symlink() {
                let target = std::fs::read_link(&path)?;
                out.push((name, target.display().to_string().into_bytes()));
            } else if md.is_dir() {
                out.push((name, Vec::new()));
                todo.push(path);
            } else {
                out.push((name, std::fs::read(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn names(dir: &Path) -> Result<Vec<String>> {
    Ok(snapshot(dir)?.into_iter().map(|(n, _)| n).collect())
}

/// The nanoGPT fixture imported into `tmp/NAME`.
fn imported(tmp: &Path, name: &str) -> Result<PathBuf> {
    let run = tmp.join(name);
    let nano = gpt2().join("nanogpt");
    let (ok, _, err) = run_mha!(
        "import {} --meta {} --out {}",
        s(&nano),
        s(&nano.join("meta.pkl")),
        s(&run)
    )?;
    assert!(ok, "{err}");
    Ok(run)
}

/// Export never writes into a run (itself or its subdirectories), over a user's files or
/// through a link, and leaves only the format's own files (no lock) when it succeeds.
#[cfg(unix)]
#[test]
fn export_writes_only_new_directories() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = imported(tmp.path(), "run")?;
    let before = snapshot(&run)?;
    for out in [run.clone(), run.join("hf"), run.join("best").join("x")] {
        for format in ["hf", "nanogpt"] {
            let (ok, _, err) =
                run_mha!("export {} --format {} --out {}", s(&run), format, s(&out))?;
            assert!(!ok && err.contains("nothing was written"), "{err}");
            assert!(
                err.contains("already holds a run") || err.contains("inside the run directory"),
                "{err}"
            );
        }
    }
    assert_eq!(snapshot(&run)?, before, "the run changed");
    // A directory holding a user's file, and a link to a directory elsewhere.
    let user = tmp.path().join("user");
    std::fs::create_dir(&user)?;
    std::fs::write(user.join("ckpt.pt"), b"mine")?;
    let (ok, _, err) = run_mha!("export {} --format nanogpt --out {}", s(&run), s(&user))?;
    assert!(!ok && err.contains("is not empty (ckpt.pt)"), "{err}");
    assert_eq!(std::fs::read(user.join("ckpt.pt"))?, b"mine");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere)?;
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&elsewhere, &link)?;
    let (ok, _, err) = run_mha!("export {} --format nanogpt --out {}", s(&run), s(&link))?;
    assert!(!ok && err.contains("symbolic link"), "{err}");
    assert!(names(&elsewhere)?.is_empty());
    let (ok, out, _) = run_mha!("export --help")?;
    assert!(
        ok && out.contains("nanogpt") && out.contains("Hugging Face"),
        "{out}"
    );
    // Done: only ckpt.pt, no lock and no staging directory beside it.
    let out = tmp.path().join("nano-out");
    let (ok, _, err) = run_mha!("export {} --format nanogpt --out {}", s(&run), s(&out))?;
    assert!(ok, "{err}");
    assert_eq!(names(&out)?, ["ckpt.pt"]);
    let mut top = names(tmp.path())?;
    top.retain(|n| !n.contains('/'));
    assert_eq!(top, ["elsewhere", "link", "nano-out", "run", "user"]);
    Ok(())
}

/// An export that runs out of room (a file-size limit, as a full disk) leaves nothing.
#[cfg(unix)]
#[test]
fn an_export_that_fails_while_writing_leaves_nothing() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = imported(tmp.path(), "run")?;
    let out = tmp.path().join("exports").join("nano");
    // SIGXFSZ ignored: the write fails with EFBIG instead of killing the process.
    let script = format!(
        "trap '' XFSZ; ulimit -f 8; exec '{}' export '{}' --format nanogpt --out '{}'",
        common::mha_exe()?,
        s(&run),
        s(&out)
    );
    let done = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()?;
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{err}");
    assert!(err.contains("error"), "{err}");
    assert!(
        !tmp.path().join("exports").exists(),
        "{:?}",
        names(tmp.path())?
    );
    Ok(())
}

/// A refused import into a run changes none of its files (its lock included); a failed
/// import, and a failed `train --init-from`, leave no directory behind.
#[test]
fn refused_or_failed_commands_change_nothing() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = imported(tmp.path(), "run")?;
    let before = snapshot(&run)?;
    let (ok, _, err) = run_mha!("import {} --out {}", s(&gpt2().join("hf")), s(&run))?;
    assert!(!ok && err.contains("already holds a run"), "{err}");
    assert_eq!(snapshot(&run)?, before);
    // A checkpoint whose weights the configuration does not describe.
    let bad = tmp.path().join("bad");
    std::fs::create_dir(&bad)?;
    std::fs::copy(
        gpt2().join("hf/model.safetensors"),
        bad.join("model.safetensors"),
    )?;
    let config = std::fs::read_to_string(gpt2().join("hf/config.json"))?;
    std::fs::write(
        bad.join("config.json"),
        config.replace("\"n_layer\": 2", "\"n_layer\": 3"),
    )?;
    let out = tmp.path().join("new").join("run");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&bad), s(&out))?;
    assert!(!ok && err.contains("transformer.h.2.ln_1.weight"), "{err}");
    assert!(!tmp.path().join("new").exists());
    // train --init-from a directory that is no checkpoint: no run directory, lock or data/.
    let text = tmp.path().join("t.txt");
    std::fs::write(
        &text,
        "First Citizen: before we proceed any further\n".repeat(20),
    )?;
    let fresh = tmp.path().join("fresh");
    let (ok, _, err) = run_mha!(
        "train --init-from {} --text {} --out {} --steps 1 --quiet",
        s(&bad),
        s(&text),
        s(&fresh)
    )?;
    assert!(!ok, "{err}");
    assert!(!fresh.exists(), "{:?}", names(&fresh));
    Ok(())
}

/// A BPE whose merge makes a token the vocabulary lacks is an error naming the merge, through
/// every command that takes a tokenizer: never a panic of the tokenizers crate.
#[test]
fn an_inconsistent_tokenizer_is_an_error_not_a_panic() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tok = tmp.path().join("tokenizer.json");
    std::fs::write(
        &tok,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
            "model":{"type":"BPE","dropout":null,"unk_token":null,
                     "continuing_subword_prefix":null,"end_of_word_suffix":null,
                     "fuse_unk":false,"byte_fallback":false,
                     "vocab":{"a":0,"b":1,"c":2},"merges":[["a","b"]]}}"#,
    )?;
    let text = tmp.path().join("t.txt");
    std::fs::write(&text, "abcabc abc\n")?;
    let hf = tmp.path().join("hf");
    std::fs::create_dir(&hf)?;
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(gpt2().join("hf").join(f), hf.join(f))?;
    }
    std::fs::copy(&tok, hf.join("tokenizer.json"))?;
    let out = tmp.path().join("out");
    for (ok, _, err) in [
        run_mha!(
            "import {} --tokenizer {} --out {}",
            s(&gpt2().join("hf")),
            s(&tok),
            s(&out)
        )?,
        run_mha!("import {} --out {}", s(&hf), s(&out))?,
        run_mha!(
            "train --text {} --tokenizer {} --out {} --steps 1",
            s(&text),
            s(&tok),
            s(&out)
        )?,
        run_mha!(
            "prepare --text {} --tokenizer {} --out {}",
            s(&text),
            s(&tok),
            s(&out)
        )?,
    ] {
        assert!(!ok && !err.contains("panicked"), "{err}");
        assert!(err.contains("\"ab\", is not in the vocabulary"), "{err}");
        assert!(!out.exists());
    }
    Ok(())
}

/// The nanoGPT fixture's checkpoint with `edit` applied, written to `tmp/NAME/ckpt.pt`.
fn edited(tmp: &Path, name: &str, edit: impl FnOnce(&mut PickleValue)) -> Result<PathBuf> {
    let mut ckpt = load_pickle(&gpt2().join("nanogpt/ckpt.pt"))?;
    edit(&mut ckpt);
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir)?;
    save_torch(&dir.join("ckpt.pt"), &ckpt)?;
    Ok(dir)
}

/// The entry `key` of a dict, for editing.
fn entry<'a>(v: &'a mut PickleValue, key: &str) -> &'a mut PickleValue {
    let PickleValue::Dict(items) = v else {
        panic!("not a dict")
    };
    if !items.iter().any(|(k, _)| k.as_str() == Some(key)) {
        items.push((PickleValue::Str(key.into()), PickleValue::None));
    }
    &mut items
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some(key))
        .expect("just added")
        .1
}

fn remove(v: &mut PickleValue, key: &str) {
    if let PickleValue::Dict(items) = v {
        items.retain(|(k, _)| k.as_str() != Some(key));
    }
}

fn trainer_state(run: &Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(
        run.join("trainer_state.json"),
    )?)?)
}

/// A `config` without the optimizer settings takes them from `param_groups` (the fixture's
/// AdamW ran with betas (0.9, 0.95) and lr 0.01), not the crate's defaults; `best_val_loss`
/// and every `config` key come back in the export.
#[test]
fn a_nanogpt_checkpoint_is_used_as_it_says() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let src = edited(tmp.path(), "src", |c| {
        let config = entry(c, "config");
        for key in ["learning_rate", "beta1", "beta2", "weight_decay"] {
            remove(config, key);
        }
        *entry(config, "compile") = PickleValue::Bool(false);
        *entry(c, "best_val_loss") = PickleValue::Float(1.93);
    })?;
    let run = tmp.path().join("run");
    let (ok, _, err) = run_mha!(
        "import {} --meta {} --out {}",
        s(&src),
        s(&gpt2().join("nanogpt/meta.pkl")),
        s(&run)
    )?;
    assert!(ok, "{err}");
    assert!(
        err.contains("taken from the optimizer's param_groups"),
        "{err}"
    );
    let cfg = &trainer_state(&run)?["config"];
    assert_eq!(cfg["beta2"], 0.95);
    assert_eq!(cfg["lr"], 0.01);
    assert_eq!(cfg["weight_decay"], 0.1);
    let out = tmp.path().join("out");
    let (ok, _, err) = run_mha!("export {} --format nanogpt --out {}", s(&run), s(&out))?;
    assert!(ok, "{err}");
    let back = load_pickle(&out.join("ckpt.pt"))?;
    assert_eq!(
        back.get("best_val_loss").and_then(PickleValue::as_f64),
        Some(1.93)
    );
    let config = back.get("config").expect("config");
    assert_eq!(
        config.get("dataset").and_then(PickleValue::as_str),
        Some("shakespeare_char")
    );
    assert_eq!(
        config.get("compile").and_then(PickleValue::as_bool),
        Some(false)
    );
    assert_eq!(
        config.get("beta2").and_then(PickleValue::as_f64),
        Some(0.95)
    );
    Ok(())
}

/// Step counts, settings and moments that are not what they must be are refused by name.
#[test]
fn invalid_nanogpt_numbers_are_refused_by_name() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    type Edit = Box<dyn FnOnce(&mut PickleValue)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "neg",
            Box::new(|c| *entry(c, "iter_num") = PickleValue::Int(-5)),
            "iter_num is -5",
        ),
        (
            "frac",
            Box::new(|c| *entry(c, "iter_num") = PickleValue::Float(400.5)),
            "iter_num is 400.5",
        ),
        (
            "str",
            Box::new(|c| *entry(c, "iter_num") = PickleValue::Str("400".into())),
            "iter_num is \"400\"",
        ),
        (
            "nan",
            Box::new(|c| *entry(c, "iter_num") = PickleValue::Float(f64::NAN)),
            "iter_num is NaN",
        ),
        (
            "maxneg",
            Box::new(|c| *entry(entry(c, "config"), "max_iters") = PickleValue::Int(-5)),
            "max_iters is -5",
        ),
        (
            "past",
            Box::new(|c| *entry(entry(c, "config"), "max_iters") = PickleValue::Int(1)),
            "iter_num 2 is past max_iters 1",
        ),
        (
            "lr",
            Box::new(|c| {
                *entry(entry(c, "config"), "learning_rate") = PickleValue::Str("fast".into())
            }),
            "learning_rate is \"fast\"",
        ),
        (
            "moment",
            Box::new(|c| {
                let state = entry(entry(c, "optimizer"), "state");
                let PickleValue::Dict(slots) = state else {
                    panic!("state")
                };
                let sq = entry(&mut slots[0].1, "exp_avg_sq");
                let t = sq.as_tensor().expect("tensor").clone();
                *sq = PickleValue::Tensor((t - 1.0).expect("sub"));
            }),
            "is never negative",
        ),
        (
            "layers",
            Box::new(|c| *entry(entry(c, "model_args"), "n_layer") = PickleValue::Int(3)),
            "model_args describes parameters the weights lack: transformer.h.2.ln_1.weight",
        ),
        (
            "nanweight",
            Box::new(|c| {
                let w = entry(entry(c, "model"), "_orig_mod.transformer.wpe.weight");
                let t = w.as_tensor().expect("tensor").clone();
                *w = PickleValue::Tensor((t * f64::NAN).expect("mul"));
            }),
            "transformer.wpe.weight holds NaN or infinite values; expected finite weights",
        ),
    ];
    for (name, edit, needle) in cases {
        let src = edited(tmp.path(), name, edit)?;
        let out = tmp.path().join(format!("{name}-run"));
        let (ok, _, err) = run_mha!("import {} --out {}", s(&src), s(&out))?;
        assert!(!ok && err.contains(needle), "{name}: {err}");
        assert!(!out.exists(), "{name}");
    }
    Ok(())
}

/// Input the tokenizer cannot encode is refused with a count and the first, in generate,
/// eval, prepare and train; `--skip-unknown` leaves it out deliberately, with a warning. A
/// character vocabulary drops unknown characters; a run whose tokens are ids maps unknown
/// words to id 0: neither happens silently.
#[test]
fn unknown_input_is_refused_or_skipped_aloud() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let chars = imported(tmp.path(), "chars")?;
    let ids = tmp.path().join("ids");
    let (ok, _, err) = run_mha!("import {} --out {}", s(&gpt2().join("hf")), s(&ids))?;
    assert!(ok, "{err}");
    let (ok, _, err) = run_mha!(
        "generate --checkpoint {} --prompt 'First Citizen é!' --max-new-tokens 2",
        s(&chars)
    )?;
    assert!(
        !ok && err.contains("2 characters the tokenizer cannot encode (the first: \"é\")"),
        "{err}"
    );
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt 'First Citizen é!' --max-new-tokens 2 --skip-unknown",
        s(&chars)
    )?;
    assert!(
        ok && err.contains("warning: left out of the prompt 2 characters"),
        "{err}"
    );
    assert!(out.starts_with("First Citizen"), "{out}");
    for prompt in ["'99999 1'", "abc"] {
        let (ok, _, err) = run_mha!("generate --checkpoint {} --prompt {}", s(&ids), prompt)?;
        assert!(
            !ok && err.contains("the tokenizer cannot encode"),
            "{prompt}: {err}"
        );
    }
    let prose = tmp.path().join("prose.txt");
    std::fs::write(
        &prose,
        "Whereas recognition of the inherent dignity\n".repeat(10),
    )?;
    let (ok, _, err) = run_mha!("eval --checkpoint {} --text {}", s(&ids), s(&prose))?;
    assert!(!ok && err.contains("the first: \"Whereas\""), "{err}");
    let (ok, _, err) = run_mha!(
        "eval --checkpoint {} --text {} --skip-unknown",
        s(&chars),
        s(&prose)
    )?;
    assert!(ok && err.contains("warning: left out of"), "{err}");
    let data = tmp.path().join("data");
    let tok = chars.join("tokenizer.json");
    let (ok, _, err) = run_mha!(
        "prepare --text {} --tokenizer {} --out {}",
        s(&prose),
        s(&tok),
        s(&data)
    )?;
    assert!(!ok && err.contains("the tokenizer cannot encode"), "{err}");
    assert!(!data.exists());
    let run = tmp.path().join("ft");
    let (ok, _, err) = run_mha!(
        "train --init-from {} --text {} --out {} --steps 1 --quiet",
        s(&chars),
        s(&prose),
        s(&run)
    )?;
    assert!(!ok && err.contains("the tokenizer cannot encode"), "{err}");
    assert!(!run.exists());
    let (ok, _, err) = run_mha!(
        "train --init-from {} --text {} --out {} --steps 1 --quiet --skip-unknown",
        s(&chars),
        s(&prose),
        s(&run)
    )?;
    assert!(ok && err.contains("warning: left out"), "{err}");
    Ok(())
}

/// A checkpoint directory whose manifest was deleted (here after `config.json` was edited
/// from 2 heads to 4) is not trusted more than one whose manifest is wrong: export, eval and
/// generate refuse it, naming `--unverified`, which reads it anyway.
#[test]
fn a_checkpoint_without_its_manifest_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = imported(tmp.path(), "run")?;
    let config = std::fs::read_to_string(run.join("config.json"))?;
    assert!(config.contains("\"num_heads\": 2"), "{config}");
    std::fs::write(
        run.join("config.json"),
        config.replace("\"num_heads\": 2", "\"num_heads\": 4"),
    )?;
    let (ok, _, err) = run_mha!(
        "export {} --format nanogpt --out {}",
        s(&run),
        s(&tmp.path().join("a"))
    )?;
    assert!(!ok && err.contains("does not match"), "{err}");
    std::fs::remove_file(run.join("checkpoint.json"))?;
    let out = tmp.path().join("out");
    for (ok, _, err) in [
        run_mha!("export {} --format nanogpt --out {}", s(&run), s(&out))?,
        run_mha!("generate --checkpoint {} --prompt First", s(&run))?,
        run_mha!("eval --checkpoint {}", s(&run))?,
    ] {
        assert!(
            !ok && err.contains("has no checkpoint.json") && err.contains("--unverified"),
            "{err}"
        );
    }
    assert!(!out.exists());
    let (ok, _, err) = run_mha!(
        "export {} --format nanogpt --out {} --unverified",
        s(&run),
        s(&out)
    )?;
    assert!(ok, "{err}");
    let back = load_pickle(&out.join("ckpt.pt"))?;
    let n_head = back
        .get("model_args")
        .and_then(|a| a.get("n_head"))
        .and_then(PickleValue::as_i64);
    assert_eq!(n_head, Some(4));
    Ok(())
}
