//! A run directory is untrusted input (they are shared like `.pt` files): a crafted manifest,
//! links planted where a save or a recovery writes, files that never end, sizes no machine
//! holds. Each case ends in a clear error (exit 1 or 2, naming the file or option) or a
//! correct run: nothing outside the run is written, nothing aborts, nothing hangs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use candle_mha_train::checksum::sha256_hex;
use common::{
    assert_refused, gpl_text, mha, mha_exe, mha_within, run_mha, s, train_tiny_run, words,
    TINY_TEXT_MODEL,
};

fn manifest_entry(name: &str, bytes: &[u8]) -> serde_json::Value {
    serde_json::json!({"name": name, "bytes": bytes.len(), "sha256": sha256_hex(bytes)})
}

/// `checkpoint.json` entries that name files outside the run, with their payloads planted
/// where a recovery would look: `--resume` refuses the directory as invalid and writes
/// nothing; the readers say "invalid", never "resume it".
#[test]
fn a_crafted_manifest_never_writes_outside_the_run() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = train_tiny_run(tmp.path())?;
    let outside = tmp.path().join("outside.txt");
    let payload = b"planted payload".to_vec();
    for name in [s(&outside).to_string(), "../outside.txt".to_string()] {
        std::fs::write(&outside, b"keep")?;
        let manifest = serde_json::json!({"files": [manifest_entry(&name, &payload)]});
        std::fs::write(run.join("checkpoint.json"), manifest.to_string())?;
        // Where a recovery of that entry would take its staged copy from.
        let staged = PathBuf::from(format!("{}/.{name}.staged", s(&run)));
        if let Some(parent) = staged.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&staged, &payload)?;
        assert_refused(
            &[
                "train",
                "--out",
                s(&run),
                "--resume",
                "--steps",
                "25",
                "--quiet",
            ],
            "not a valid checkpoint manifest",
        )?;
        assert_eq!(std::fs::read(&outside)?, b"keep", "entry {name}");
        for args in [
            vec!["eval", "--checkpoint", s(&run)],
            vec!["info", s(&run)],
            vec!["generate", "--checkpoint", s(&run), "--prompt", "T1"],
            vec!["inspect", "--checkpoint", s(&run), "--input", "T1 T2"],
        ] {
            let (code, err) = mha_within(&args, 60)?;
            assert!(
                code == 1
                    && err.contains("not a valid checkpoint manifest")
                    && !err.contains("resum"),
                "{args:?}: {err}"
            );
        }
    }
    // A manifest that omits the weights, or lists nothing, does not vouch for a tampered file.
    std::fs::write(run.join("checkpoint.json"), r#"{"files": []}"#)?;
    assert_refused(
        &["eval", "--checkpoint", s(&run)],
        "does not list config.json",
    )?;
    Ok(())
}

/// For every file a save or a recovery writes (the lock, each checkpoint file and its staged
/// name, the manifest, `metrics.jsonl`, `best/` and the files in it, the data directory of a
/// text run, temporary names of the next pids), a link to a file outside the run: training,
/// resuming and preparing never change that file.
#[test]
fn links_planted_in_a_run_are_never_written_through() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let base = train_tiny_run(tmp.path())?;
    let outside = tmp.path().join("outside.txt");
    let outside_dir = tmp.path().join("outside_dir");
    let ckpt = [
        "model.safetensors",
        "config.json",
        "optimizer.safetensors",
        "trainer_state.json",
        "vocab.json",
    ];
    let mut names: Vec<String> = vec![
        ".lock".into(),
        "checkpoint.json".into(),
        "metrics.jsonl".into(),
    ];
    for f in ckpt {
        names.push(f.into());
        names.push(format!(".{f}.staged"));
        names.push(format!("best/{f}"));
    }
    let pid = std::process::id();
    for p in pid..pid + 20 {
        names.push(format!(".checkpoint.json.tmp-{p}"));
        names.push(format!(".metrics.jsonl.tmp-{p}"));
    }
    let mut planted = 0;
    for name in &names {
        let run = tmp.path().join("run-copy");
        let _ = std::fs::remove_dir_all(&run);
        copy_dir(&base, &run)?;
        std::fs::write(&outside, b"keep")?;
        let link = run.join(name);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink(&outside, &link)?;
        planted += 1;
        let (code, err) = mha_within(
            &[
                "train",
                "--out",
                s(&run),
                "--resume",
                "--steps",
                "26",
                "--save-every",
                "2",
                "--quiet",
            ],
            120,
        )?;
        assert_eq!(
            std::fs::read(&outside)?,
            b"keep",
            "through {name}: exit {code}\n{err}"
        );
        assert!(code == 0 || code == 1, "{name}: exit {code}\n{err}");
    }
    // best/ as a link to a directory outside: its files are never replaced.
    let run = tmp.path().join("run-best");
    copy_dir(&base, &run)?;
    std::fs::create_dir_all(&outside_dir)?;
    std::fs::write(outside_dir.join("config.json"), b"keep")?;
    std::fs::remove_dir_all(run.join("best"))?;
    std::os::unix::fs::symlink(&outside_dir, run.join("best"))?;
    assert_refused(
        &[
            "train",
            "--out",
            s(&run),
            "--resume",
            "--steps",
            "26",
            "--quiet",
        ],
        "symbolic link",
    )?;
    assert_eq!(std::fs::read(outside_dir.join("config.json"))?, b"keep");
    // A text run's data directory, and its lock, as links.
    let corpus = gpl_text();
    let text_run = tmp.path().join("text-run");
    std::fs::create_dir_all(&text_run)?;
    std::os::unix::fs::symlink(&outside_dir, text_run.join("data"))?;
    let mut train = vec![
        "train",
        "--text",
        &corpus,
        "--out",
        s(&text_run),
        "--steps",
        "2",
        "--quiet",
    ];
    train.extend(words(TINY_TEXT_MODEL));
    assert_refused(&train, "symbolic link")?;
    assert_eq!(
        std::fs::read_dir(&outside_dir)?.count(),
        1,
        "nothing prepared outside"
    );
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data)?;
    std::os::unix::fs::symlink(&outside, data.join(".lock"))?;
    std::fs::write(&outside, b"keep")?;
    assert_refused(
        &["prepare", "--text", &corpus, "--out", s(&data)],
        "symbolic link",
    )?;
    assert_eq!(std::fs::read(&outside)?, b"keep");
    assert!(planted > 40);
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Reading a run while it saves every step: `mha info` (and the library's check) sees a whole
/// checkpoint or "being saved", never a false "changed or damaged".
#[test]
fn readers_never_report_damage_during_a_save() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("ev.txt");
    std::fs::write(&data, "T1 T2 T3 T4\nT1 T3 T5 T2\n".repeat(20))?;
    let run = tmp.path().join("run");
    let mut child = Command::new(mha_exe()?)
        .args([
            "train",
            "--tokens",
            s(&data),
            "--out",
            s(&run),
            "--steps",
            "100000",
            "--save-every",
            "1",
            "--eval-every",
            "5",
            "--embed-dim",
            "8",
            "--num-heads",
            "2",
            "--num-layers",
            "1",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let reads = [
        candle_mha_train::run_dir::CONFIG_FILE,
        candle_mha_train::run_dir::MODEL_FILE,
        candle_mha_train::run_dir::STATE_FILE,
    ];
    let (mut whole, mut saving, mut calls) = (0, 0, 0);
    let result = (|| -> Result<()> {
        while calls < 300 {
            anyhow::ensure!(child.try_wait()?.is_none(), "the run ended early");
            if !run.join("checkpoint.json").exists() {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            calls += 1;
            let (code, err) = mha_within(&["info", s(&run)], 60)?;
            anyhow::ensure!(
                !err.contains("damaged"),
                "call {calls}: a false report: {err}"
            );
            match code {
                0 => whole += 1,
                _ => saving += 1,
            }
            for dir in [run.clone(), run.join("best")] {
                if let Err(e) = candle_mha_train::verify_checkpoint(
                    &dir,
                    &reads,
                    candle_mha_train::Unverified::Refuse,
                ) {
                    let e = e.to_string();
                    anyhow::ensure!(!e.contains("damaged"), "a false report: {e}");
                }
            }
        }
        Ok(())
    })();
    child.kill()?;
    child.wait()?;
    result?;
    assert!(whole > 100, "{whole} whole reads, {saving} during a save");
    Ok(())
}

/// A run moved as a whole resumes and evaluates from another working directory, ending bit
/// for bit where the uninterrupted run ends; a data directory substituted for the run's (the
/// same tokenizer, other tokens) is refused naming what differs; options that shaped the text
/// and a contradicting dtype are listed as contradictions.
#[test]
fn a_moved_run_resumes_exactly_and_substituted_data_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let corpus = gpl_text();
    // All steps inside the warmup: the schedule of 6 steps is that of 12 for their first 6.
    let common = [
        "--warmup",
        "100",
        "--eval-every",
        "4",
        "--save-every",
        "100",
        "--quiet",
    ];
    let train = |out: &Path, steps: &str, resume: bool| -> Result<()> {
        let mut args = vec!["train", "--out", s(out), "--steps", steps];
        if resume {
            args.push("--resume");
        } else {
            args.extend(["--text", &corpus]);
            args.extend(words(TINY_TEXT_MODEL));
        }
        args.extend(common);
        let (ok, _, err) = mha(&args)?;
        anyhow::ensure!(ok, "mha {args:?}: {err}");
        Ok(())
    };
    let whole = tmp.path().join("whole");
    train(&whole, "12", false)?;
    let first = tmp.path().join("a/run");
    std::fs::create_dir_all(tmp.path().join("a"))?;
    train(&first, "6", false)?;
    let state = std::fs::read_to_string(first.join("trainer_state.json"))?;
    assert!(state.contains("\"dir\": \"data\""), "{state}");
    assert!(
        std::fs::read_to_string(first.join("best/trainer_state.json"))?
            .contains("\"dir\": \"../data\"")
    );
    let moved = tmp.path().join("b/moved");
    std::fs::create_dir_all(tmp.path().join("b"))?;
    std::fs::rename(&first, &moved)?;
    // From another working directory.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere)?;
    let out = Command::new(mha_exe()?)
        .current_dir(&elsewhere)
        .args(["train", "--out", s(&moved), "--resume", "--steps", "12"])
        .args(common)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(whole.join("model.safetensors"))?,
        std::fs::read(moved.join("model.safetensors"))?,
        "the moved run ends where the uninterrupted one does"
    );
    assert_eq!(
        std::fs::read(whole.join("optimizer.safetensors"))?,
        std::fs::read(moved.join("optimizer.safetensors"))?,
    );
    let out = Command::new(mha_exe()?)
        .current_dir(&elsewhere)
        .args(["eval", "--checkpoint", s(&moved.join("best"))])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Options that shape the data, and the dtype, contradict the run: listed.
    let (ok, _, err) = run_mha!(
        "train --out {} --resume --bpe-vocab 1000 --dtype f64",
        s(&moved)
    )?;
    assert!(
        !ok && err.contains("--bpe-vocab 1000: the run has 300")
            && err.contains("--dtype f64: the run has f32"),
        "{err}"
    );

    // A run on a data directory outside it; that directory replaced by other tokens made
    // with the same tokenizer.
    let data = tmp.path().join("data");
    let (ok, _, err) = run_mha!(
        "prepare --text {} --out {} --vocab-size 300",
        &corpus,
        s(&data)
    )?;
    assert!(ok, "{err}");
    let run = tmp.path().join("on-data");
    let mut args = vec![
        "train",
        "--data",
        s(&data),
        "--out",
        s(&run),
        "--steps",
        "2",
        "--quiet",
    ];
    // The tiny model without its BPE size (the data has its tokenizer).
    args.extend(&words(TINY_TEXT_MODEL)[2..]);
    let (ok, _, err) = mha(&args)?;
    assert!(ok, "{err}");
    let tokenizer = tmp.path().join("tokenizer.json");
    std::fs::copy(data.join("tokenizer.json"), &tokenizer)?;
    std::fs::remove_dir_all(&data)?;
    let half = tmp.path().join("half.txt");
    let text = std::fs::read_to_string(&corpus)?;
    std::fs::write(&half, &text[..text.len() / 2])?;
    let (ok, _, err) = run_mha!(
        "prepare --text {} --out {} --tokenizer {}",
        s(&half),
        s(&data),
        s(&tokenizer)
    )?;
    assert!(ok, "{err}");
    assert_refused(
        &[
            "train",
            "--out",
            s(&run),
            "--resume",
            "--steps",
            "4",
            "--quiet",
        ],
        "not the data the run was trained on",
    )?;
    assert_refused(
        &["eval", "--checkpoint", s(&run)],
        "not the data the run was trained on",
    )?;
    Ok(())
}

/// `train --text` holds the lock of its `OUT/data`: `mha prepare` into it is refused while the
/// run lives.
#[test]
fn a_text_run_holds_its_data_directory() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let corpus = gpl_text();
    let mut args = vec![
        "train",
        "--text",
        &corpus,
        "--out",
        s(&run),
        "--steps",
        "100000",
        "--quiet",
    ];
    args.extend(words(TINY_TEXT_MODEL));
    let mut child = Command::new(mha_exe()?)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !run.join("data/meta.json").exists() {
        assert!(
            Instant::now() < deadline,
            "the run did not prepare its data"
        );
        assert!(child.try_wait()?.is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let result = assert_refused(
        &["prepare", "--text", &corpus, "--out", s(&run.join("data"))],
        "in use by another process",
    );
    child.kill()?;
    child.wait()?;
    result
}
