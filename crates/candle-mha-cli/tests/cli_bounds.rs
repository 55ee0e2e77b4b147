//! Every numeric option and input size is bounded: out-of-range values, devices, link cycles
//! and hostile tokenizers are errors naming what is allowed, never a panic (exit 101), an
//! abort (134), a hang or an allocation beyond what the input needs.

mod common;

use anyhow::Result;
use common::{gpl_text as text, mha, run_mha, words, TINY_TEXT_MODEL};

/// Runs `mha args` and returns its exit code and stderr.
fn run(args: &[&str]) -> Result<(Option<i32>, String)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mha"))
        .args(args)
        .output()?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn out_of_range_options_name_their_range() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("x");
    let (t, o) = (text(), out.to_str().unwrap().to_string());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "prepare",
                "--text",
                &t,
                "--out",
                &o,
                "--vocab-size",
                "18446744073709551615",
            ],
            "is not in 260..=1048576",
        ),
        (
            vec![
                "prepare",
                "--text",
                &t,
                "--out",
                &o,
                "--vocab-size",
                "4000000000",
            ],
            "is not in 260..=1048576",
        ),
        (
            vec![
                "prepare",
                "--text",
                &t,
                "--out",
                &o,
                "--chunk-kb",
                "18446744073709551615",
            ],
            "is not in 1..=262144",
        ),
        (
            vec![
                "prepare",
                "--text",
                &t,
                "--out",
                &o,
                "--bpe-sample-mb",
                "nan",
            ],
            "expected a number in [0.001, 100000]",
        ),
        (
            vec![
                "inspect",
                "--checkpoint",
                &o,
                "--input",
                "a",
                "--decimals",
                "65535",
            ],
            "is not in 0..=12",
        ),
        (
            vec!["train", "--out", &o, "--batch-size", "0"],
            "is not in 1..=100000000",
        ),
        (
            vec!["train", "--out", &o, "--embed-dim", "4000000000"],
            "is not in 1..=65536",
        ),
        (
            vec!["train", "--out", &o, "--dist-timeout=-5"],
            "expected a number in [0, 10000000]",
        ),
        (
            vec!["train", "--out", &o, "--bpe-vocab", "70000000"],
            "is not in 260..=1048576",
        ),
        (
            vec![
                "generate",
                "--checkpoint",
                &o,
                "--prompt",
                "a",
                "--max-new-tokens",
                "99999999999",
            ],
            "is not in 0..=1000000",
        ),
        (
            vec!["eval", "--checkpoint", &o, "--max-windows", "0"],
            "is not in 1..=100000000",
        ),
        (
            vec!["plot", &o, "--width", "100000"],
            "is not in 64..=16384",
        ),
    ];
    for (args, want) in cases {
        let (code, err) = run(&args)?;
        assert!(
            code == Some(2) && err.contains(want),
            "{args:?}: exit {code:?}: {err}"
        );
    }
    Ok(())
}

#[test]
fn hostile_inputs_are_errors() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    // A device: not read (it has no end).
    #[cfg(unix)]
    for device in ["/dev/zero", "/dev/urandom"] {
        let (ok, _, err) = mha(&["info", device])?;
        assert!(!ok && err.contains("not a regular file"), "{device}: {err}");
    }
    // A directory with links to itself: each file once, and prepare ends.
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir(&corpus)?;
    std::fs::copy(text(), corpus.join("gpl.txt"))?;
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(".", corpus.join("a"))?;
        std::os::unix::fs::symlink(".", corpus.join("b"))?;
    }
    let data = tmp.path().join("data");
    let (ok, _, err) = run_mha!(
        "prepare --text {} --out {} --vocab-size 300 --quiet",
        corpus.to_str().unwrap(),
        data.to_str().unwrap()
    )?;
    assert!(ok, "{err}");
    // A tokenizer with one id set to 4000000000: refused when loaded.
    let json = std::fs::read_to_string(data.join("tokenizer.json"))?;
    let bad = json.replacen("\"<eos>\": 3", "\"<eos>\": 4000000000", 1);
    assert_ne!(bad, json, "the tokenizer's <eos> entry was not found");
    let bad_path = tmp.path().join("bad.json");
    std::fs::write(&bad_path, bad)?;
    let (ok, _, err) = run_mha!(
        "prepare --text {} --tokenizer {} --out {}",
        &text(),
        bad_path.to_str().unwrap(),
        tmp.path().join("d2").to_str().unwrap()
    )?;
    assert!(
        !ok && err.contains("has id 4000000000") && err.contains("expected ids below"),
        "{err}"
    );
    Ok(())
}

/// A step budget that reads a small corpus many times over is said at the start, with the
/// steps of one pass; a budget of a few passes is not.
#[test]
fn many_passes_over_a_small_corpus_are_announced() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = |steps: &str, out: &str| {
        let (corpus, out) = (text(), tmp.path().join(out));
        let mut args = vec![
            "train",
            "--text",
            &corpus,
            "--out",
            out.to_str().unwrap(),
            "--steps",
            steps,
            "--batch-size",
            "64",
            "--eval-every",
            "0",
            "--quiet",
        ];
        args.extend(words(TINY_TEXT_MODEL));
        mha(&args)
    };
    let (ok, _, err) = run("40", "many")?;
    assert!(ok, "{err}");
    assert!(
        err.contains("times over")
            && err.contains("one pass is about")
            && err.contains("--early-stop"),
        "{err}"
    );
    let (ok, _, err) = run("4", "few")?;
    assert!(ok && !err.contains("times over"), "{err}");
    Ok(())
}
