//! `mha prepare`, `mha train --text/--data`, `mha eval --text/--data --baseline` on real
//! English text (tests/fixtures/text/gpl-3.0.txt), and their errors.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use common::s;
use common::{mha, run_mha};

fn english() -> PathBuf {
    common::fixtures_dir().join("text/gpl-3.0.txt")
}

/// Entropy (nats) of the unigram distribution of the u16 ids in `tokens.bin`, counted here.
fn unigram_entropy(tokens_bin: &Path) -> Result<f64> {
    let raw = std::fs::read(tokens_bin)?;
    let mut counts: HashMap<u16, f64> = HashMap::new();
    for b in raw.chunks_exact(2) {
        *counts.entry(u16::from_le_bytes([b[0], b[1]])).or_default() += 1.0;
    }
    let n: f64 = counts.values().sum();
    Ok(counts.values().map(|c| -(c / n) * (c / n).ln()).sum())
}

/// The number after `key ` in `text` (e.g. "loss 3.21").
fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_small_model_trained_on_english_beats_the_unigram_entropy() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let run = dir.path().join("run");
    let (ok, out, err) = run_mha!("train --text {} --out {} --vocab-size 300 --steps 200 --batch-size 16 --embed-dim 32 --num-heads 2 --num-layers 1 --max-len 32 --eval-every 50 --warmup 20 --lr 3e-3 --quiet", s(&english()), s(&run))?;
    assert!(ok, "{out}\n{err}");
    let entropy = unigram_entropy(&run.join("data").join("tokens.bin"))?;
    let best = out
        .lines()
        .find(|l| l.starts_with("best checkpoint:"))
        .unwrap_or_else(|| panic!("no best line in {out}"));
    let val = number_after(best, "validation loss");
    println!("unigram entropy {entropy:.3} nats, best validation loss {val:.3}");
    assert!(
        val < entropy,
        "{val} is not below the unigram entropy {entropy}"
    );
    assert!(out.contains("bits/byte"), "{out}");
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "config.json",
        "trainer_state.json",
    ] {
        assert!(run.join("best").join(f).exists(), "best/{f}");
    }
    assert!(run.join("metrics.jsonl").exists());

    // The best checkpoint evaluates to the loss the run reported, and beside the baselines.
    let (ok, out, err) = run_mha!(
        "eval --checkpoint {} --baseline bigram",
        s(&run.join("best"))
    )?;
    assert!(ok, "{out}\n{err}");
    let loss = number_after(&out, "sequences): loss");
    assert!((loss - val).abs() < 1e-3, "{loss} vs {val}: {out}");
    assert!(out.contains("bigram baseline"), "{out}");
    let unigram = number_after(
        out.lines().find(|l| l.starts_with("unigram")).unwrap(),
        "loss",
    );
    assert!(loss < unigram, "{out}");

    // Any text, streamed; generation from the best checkpoint.
    let (ok, out, err) = run_mha!("eval --checkpoint {} --text {}", s(&run), s(&english()))?;
    assert!(ok && out.contains("bits/byte"), "{out}\n{err}");
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt 'The licensee' --max-new-tokens 8",
        s(&run.join("best"))
    )?;
    assert!(ok && out.starts_with("The licensee"), "{out}\n{err}");
    Ok(())
}

/// `mha prepare` of the English fixture into `out` with a BPE of `vocab_size` ids.
fn prepare_english(out: &Path, vocab_size: &str) -> Result<(bool, String, String)> {
    run_mha!(
        "prepare --text {} --out {} --vocab-size {}",
        s(&english()),
        s(out),
        vocab_size
    )
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn bad_data_and_settings_are_errors_and_leave_the_run_alone() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (ok, out, err) = prepare_english(&data, "300")?;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("tokens (U16, 300 ids)"), "{out}");
    let run = dir.path().join("run");
    let small = common::words(
        "--steps 4 --embed-dim 16 --num-heads 2 --num-layers 1 --max-len 16 --batch-size 4 --quiet",
    );
    let train = |extra: &[&str]| -> Result<(bool, String, String)> {
        let mut args = vec!["train", "--data", s(&data), "--out", s(&run)];
        args.extend_from_slice(&small);
        args.extend_from_slice(extra);
        mha(&args)
    };
    let (ok, out, err) = train(&[])?;
    assert!(ok, "{out}\n{err}");
    let model = std::fs::read(run.join("model.safetensors"))?;

    let expect_error = |args: &[&str], want: &str| -> Result<()> {
        let (ok, out, err) = mha(args)?;
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(
            std::fs::read(run.join("model.safetensors"))?,
            model,
            "{args:?}"
        );
        Ok(())
    };
    let resume = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["train", "--out", s(&run), "--resume", "--steps", "8"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    expect_error(
        &refs(&resume(&["--grad-accum", "0"])),
        "0 is not in 1..=1000000",
    )?;
    expect_error(
        &[
            "train",
            "--data",
            s(&dir.path().join("nope")),
            "--out",
            s(&run),
        ],
        "already holds a run",
    )?;
    expect_error(
        &[
            "train",
            "--data",
            s(&dir.path().join("nope")),
            "--out",
            s(&dir.path().join("r2")),
        ],
        "nope: not found",
    )?;
    // A tokenizer that is not the data's.
    let other = dir.path().join("other");
    let (ok, _, err) = prepare_english(&other, "280")?;
    assert!(ok, "{err}");
    let tok = other.join("tokenizer.json");
    let r3 = dir.path().join("r3");
    expect_error(
        &[
            "train",
            "--data",
            s(&data),
            "--tokenizer",
            s(&tok),
            "--out",
            s(&r3),
        ],
        "other/tokenizer.json does not match the data",
    )?;
    assert!(!r3.join("model.safetensors").exists());
    expect_error(
        &["eval", "--checkpoint", s(&run), "--data", s(&other)],
        "the checkpoint's tokenizer does not match the data",
    )?;
    // A token file whose length does not match its meta: resuming names it.
    let bin = data.join("tokens.bin");
    let bytes = std::fs::read(&bin)?;
    std::fs::write(&bin, &bytes[..bytes.len() - 3])?;
    expect_error(
        &refs(&resume(&[])),
        "the file is truncated or not this data's",
    )?;
    std::fs::write(&bin, &bytes)?;
    std::fs::write(data.join("meta.json"), "not json")?;
    expect_error(&refs(&resume(&[])), "not a prepared-data description")?;
    // Preparing over existing data is refused; an empty source is named.
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "")?;
    let (ok, _, err) = run_mha!(
        "prepare --text {} --out {}",
        s(&empty),
        s(&dir.path().join("e"))
    )?;
    assert!(!ok && err.contains("empty.txt is empty"), "{err}");
    let (ok, _, err) = run_mha!("prepare --text {} --out {}", s(&english()), s(&other))?;
    assert!(!ok && err.contains("already holds prepared data"), "{err}");
    Ok(())
}

/// Options left out take the library's text presets: prepared data trains with
/// `TrainConfig::for_text()` and the model of `NextTokenPredictorConfig::for_text`.
#[test]
fn options_left_out_take_the_text_presets() -> Result<()> {
    use candle_mha_train::models::NextTokenPredictorConfig;
    use candle_mha_train::{TrainConfig, TrainerState};

    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (ok, _, err) = prepare_english(&data, "300")?;
    assert!(ok, "{err}");
    let run = dir.path().join("run");
    let (ok, _, err) = run_mha!(
        "train --data {} --out {} --steps 1 --quiet",
        s(&data),
        s(&run)
    )?;
    assert!(ok, "{err}");
    let state: TrainerState =
        serde_json::from_str(&std::fs::read_to_string(run.join("trainer_state.json"))?)?;
    assert_eq!(
        state.config,
        TrainConfig {
            steps: 1,
            // The command line decays to a tenth of the peak, as its --help says.
            min_lr: TrainConfig::for_text().lr / 10.0,
            ..TrainConfig::for_text()
        }
    );
    let model = NextTokenPredictorConfig::load(run.join("config.json"))?;
    // The text preset, with the command line's head without a bias (exportable to GPT-2).
    let preset = NextTokenPredictorConfig {
        head_bias: Some(false),
        ..NextTokenPredictorConfig::for_text(model.vocab_size)
    };
    assert_eq!(model, preset);
    assert!((256..=300).contains(&model.vocab_size), "{model:?}");
    Ok(())
}
