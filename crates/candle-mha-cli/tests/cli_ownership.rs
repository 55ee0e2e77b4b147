//! A run or data directory is owned by one process: a second `mha train` or `mha prepare` on a
//! directory another process holds exits with an error naming the holder, and changes
//! nothing there.

mod common;

use anyhow::Result;
use candle_mha_train::run::lock::DirLock;
use common::{gpl_text as text, mha, run_mha, words, TINY_TEXT_MODEL};

/// Every file of `dir` with its bytes, but the lock file (which holds its last owner's pid).
fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file() && e.file_name() != ".lock")
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_held_directory_refuses_a_second_writer() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (run, data) = (tmp.path().join("run"), tmp.path().join("data"));
    let (run_s, data_s) = (run.to_str().unwrap(), data.to_str().unwrap());
    // A finished run, then another process (this test) holding its directory.
    let corpus = text();
    let mut train = vec![
        "train", "--text", &corpus, "--out", run_s, "--steps", "5", "--quiet",
    ];
    train.extend(words(TINY_TEXT_MODEL));
    let (ok, _, err) = mha(&train)?;
    assert!(ok, "{err}");
    let before = snapshot(&run);
    let lock = DirLock::acquire(&run, "a test")?;
    let holder = format!("pid {}, a test", std::process::id());
    let mut resume = train.clone();
    resume[6] = "10";
    resume.push("--resume");
    let (ok, _, err) = mha(&resume)?;
    assert!(
        !ok && err.contains("in use by another process") && err.contains(&holder),
        "{err}"
    );
    let (ok, _, err) = run_mha!("prepare --text {} --out {}", &text(), run_s)?;
    assert!(!ok && err.contains(&holder), "{err}");
    // The lock file holds the owner's pid; nothing else changed.
    let after: Vec<_> = snapshot(&run)
        .into_iter()
        .filter(|(n, _)| n != ".lock")
        .collect();
    let before: Vec<_> = before.into_iter().filter(|(n, _)| n != ".lock").collect();
    assert!(after == before, "the held run directory changed");
    drop(lock);
    // Free again: the lock file left behind does not block.
    let (ok, _, err) = mha(&resume)?;
    assert!(ok, "{err}");
    let (ok, _, err) = run_mha!("prepare --text {} --out {}", &text(), data_s)?;
    assert!(ok, "{err}");
    Ok(())
}

/// `--resume` refuses options that contradict the run, listing each, and applies and prints
/// the cadence options it may change.
#[test]
fn resume_refuses_contradicting_options() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap();
    let other = tmp.path().join("other.txt");
    std::fs::write(
        &other,
        "another corpus, not the one the run was prepared from\n".repeat(50),
    )?;
    let corpus = text();
    let mut base = vec![
        "train",
        "--text",
        &corpus,
        "--out",
        run_s,
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--quiet",
    ];
    base.extend(words(TINY_TEXT_MODEL));
    let (ok, _, err) = mha(&base)?;
    assert!(ok, "{err}");
    let before = snapshot(&run);
    let other_s = other.to_str().unwrap();
    let (ok, _, err) = run_mha!("train --resume --out {} --text {} --embed-dim 32 --num-heads 2 --lr 0.1 --seed 9 --batch-size 3 --steps 8", run_s, other_s)?;
    assert!(!ok, "{err}");
    for want in [
        "5 option(s) contradict",
        "--text",
        "--embed-dim 32: the run has 16",
        "--lr 0.1",
        "--seed 9",
        "--batch-size 3",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    assert!(
        !err.contains("--num-heads"),
        "an agreeing option was listed: {err}"
    );
    let after = snapshot(&run);
    assert!(
        after == before,
        "a refused resume changed the run directory"
    );
    // The same options as the run, and a cadence change: accepted, the change printed.
    let mut resume = base.clone();
    resume[6] = "6";
    resume[8] = "3";
    resume.push("--resume");
    let (ok, _, err) = mha(&resume)?;
    assert!(ok, "{err}");
    assert!(
        err.contains("changed on resume: --eval-every 3 (was 2)"),
        "{err}"
    );
    Ok(())
}
