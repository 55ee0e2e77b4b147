//! What a user or a file gives is bounded and checked like a run directory: sizes from files
//! and flags within the machine, devices and FIFOs refused by every input option, and the
//! small items of trust (signals, vocabularies of GPT-2's size, a dtype kept on resume). Each
//! case ends in a clear error or a correct run: nothing aborts, nothing hangs.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use common::{
    assert_refused, gpl_text, mha, mha_exe, mha_within, mkfifo, run_mha, s, train_tiny_run, words,
    TINY_TEXT_MODEL,
};

/// What a file says is bounded like what a flag says: a `config.json` far beyond its weights
/// or the machine, an expanded view of 2 GiB in a 1.6 KB `.pt`, batches and models no memory
/// holds: errors naming the quantity, never an abort.
#[test]
fn sizes_from_files_and_flags_are_bounded() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = train_tiny_run(tmp.path())?;
    std::fs::remove_file(run.join("checkpoint.json"))?;
    let config = std::fs::read_to_string(run.join("config.json"))?;
    let cases = [
        (
            "\"vocab_size\": 9",
            "\"vocab_size\": 1000000000",
            "vocab_size 1000000000",
        ),
        ("\"embed_dim\": 8", "\"embed_dim\": 65536", "parameters"),
        (
            "\"max_len\": 6",
            "\"max_len\": 1000000000",
            "max_len 1000000000",
        ),
        (
            "\"ff_dim\": 32",
            "\"ff_dim\": 1000000000",
            "ff_dim 1000000000",
        ),
    ];
    for (from, to, needle) in cases {
        assert!(config.contains(from), "{config}");
        std::fs::write(run.join("config.json"), config.replace(from, to))?;
        // Without its manifest (--unverified): the sizes themselves are the check.
        for args in [
            vec!["eval", "--checkpoint", s(&run), "--unverified"],
            vec![
                "generate",
                "--checkpoint",
                s(&run),
                "--prompt",
                "T1",
                "--unverified",
            ],
        ] {
            assert_refused(&args, needle)?;
        }
    }
    std::fs::write(run.join("config.json"), &config)?;
    let state = std::fs::read_to_string(run.join("trainer_state.json"))?;
    std::fs::write(
        run.join("trainer_state.json"),
        state.replace("\"batch_size\": 64", "\"batch_size\": 1000000000000"),
    )?;
    assert_refused(
        &["train", "--out", s(&run), "--resume", "--steps", "30"],
        "batch_size 1000000000000",
    )?;
    let expanded = common::fixtures_dir().join("checkpoints/expanded_view.pt");
    assert_refused(&["info", s(&expanded)], "an expanded view may take")?;
    for extra in [
        vec!["--batch-size", "100000000"],
        vec![
            "--embed-dim",
            "16384",
            "--num-layers",
            "64",
            "--num-heads",
            "16",
        ],
    ] {
        let out = tmp.path().join(format!("big-{}", extra.len()));
        let mut args = vec!["train", "--out", s(&out), "--steps", "1", "--quiet"];
        args.extend(extra);
        assert_refused(&args, "of memory")?;
    }
    Ok(())
}

/// Every path option that reads a file refuses a device and a FIFO at once: no read until
/// memory runs out, no wait for a writer that never comes.
#[test]
fn devices_and_fifos_are_refused_by_every_input_option() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = train_tiny_run(tmp.path())?;
    let corpus = gpl_text();
    let text_run = tmp.path().join("text-run");
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
    let (ok, _, err) = mha(&train)?;
    assert!(ok, "{err}");
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo)?;
    for input in ["/dev/zero", "/dev/urandom", s(&fifo)] {
        let out = tmp.path().join("out");
        let o = s(&out);
        let cases: Vec<Vec<&str>> = vec![
            vec!["prepare", "--text", input, "--out", o],
            vec!["prepare", "--tokens", input, "--out", o],
            vec![
                "prepare",
                "--text",
                &corpus,
                "--tokenizer",
                input,
                "--out",
                o,
            ],
            vec!["train", "--tokens", input, "--out", o],
            vec!["train", "--text", input, "--out", o],
            vec!["train", "--text", &corpus, "--tokenizer", input, "--out", o],
            vec!["eval", "--checkpoint", s(&text_run), "--text", input],
            vec!["eval", "--checkpoint", s(&run), "--tokens", input],
            vec![
                "vocab-matrix",
                "--checkpoint",
                s(&text_run),
                "--text",
                input,
                "--out",
                o,
            ],
            vec![
                "inspect",
                "--checkpoint",
                s(&text_run),
                "--input-file",
                input,
            ],
            vec!["info", input],
        ];
        for args in cases {
            let (code, err) = mha_within(&args, 30)?;
            assert!(
                code == 1 && err.contains(input) && err.contains("not a regular file"),
                "{args:?}: exit {code}\n{err}"
            );
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    Ok(())
}

/// The smaller items: a non-UTF-8 path is refused at start; a stray file in a new run's
/// directory is refused before any work; a bad line of `metrics.jsonl` is skipped with a
/// warning on resume; SIGINT and SIGTERM save, then exit 130 and 143; identical runs write
/// identical bytes.
#[test]
fn small_items_of_trust() -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir()?;
    let bad = tmp.path().join(std::ffi::OsStr::from_bytes(b"run-\xff"));
    let out = Command::new(mha_exe()?)
        .args(["train", "--out"])
        .arg(&bad)
        .args(["--steps", "1"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && err.contains("not valid UTF-8"),
        "{err}"
    );
    assert!(!bad.exists());

    let stray = tmp.path().join("stray");
    std::fs::create_dir_all(&stray)?;
    std::fs::write(stray.join("metrics.jsonl"), "my own notes\n")?;
    std::fs::write(stray.join("notes.txt"), "mine")?;
    let corpus = gpl_text();
    let mut train = vec![
        "train",
        "--text",
        &corpus,
        "--out",
        s(&stray),
        "--steps",
        "2",
        "--quiet",
    ];
    train.extend(words(TINY_TEXT_MODEL));
    assert_refused(
        &train,
        "holds files a run did not write (metrics.jsonl, notes.txt)",
    )?;
    assert!(!stray.join("data").exists(), "nothing prepared");
    assert_eq!(
        std::fs::read_to_string(stray.join("metrics.jsonl"))?,
        "my own notes\n"
    );

    // Identical runs, identical bytes (the optimizer file's metadata included).
    let run = train_tiny_run(tmp.path())?;
    let again = tmp.path().join("again");
    std::fs::create_dir_all(&again)?;
    let other = train_tiny_run(&again)?;
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "config.json",
        "vocab.json",
    ] {
        let same = std::fs::read(run.join(f))? == std::fs::read(other.join(f))?;
        assert!(same, "{f} differs between two identical runs");
    }

    let metrics = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    std::fs::write(run.join("metrics.jsonl"), format!("garbage\n{metrics}"))?;
    let (ok, _, err) = run_mha!("train --out {} --resume --steps 22", s(&run))?;
    assert!(
        ok && err.contains("metrics.jsonl:1") && err.contains("skipped"),
        "{err}"
    );

    for (sig, code) in [(libc_sigint(), 130), (libc_sigterm(), 143)] {
        let out = tmp.path().join(format!("sig{sig}"));
        let mut child = Command::new(mha_exe()?)
            .args([
                "train",
                "--out",
                s(&out),
                "--steps",
                "1000000",
                "--save-every",
                "0",
                "--quiet",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !out.join("metrics.jsonl").exists() {
            assert!(Instant::now() < deadline, "the run did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()?;
        let status = child.wait()?;
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err)?;
        assert_eq!(status.code(), Some(code), "{err}");
        assert!(
            out.join("trainer_state.json").exists() && err.contains("--resume"),
            "{err}"
        );
    }
    Ok(())
}

fn libc_sigint() -> i32 {
    2
}

fn libc_sigterm() -> i32 {
    15
}

/// `mha vocab-matrix` on a model of GPT-2's 50,257 ids: the V × V dense buffer (81 GB) is
/// never asked for; the cells are written sparse.
#[test]
fn vocab_matrix_runs_on_a_gpt2_sized_vocabulary() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    // 50,253 symbols and the 4 specials: 50,257 ids.
    let symbols: Vec<String> = (0..50_253).map(|i| format!("w{i}")).collect();
    let lines: Vec<String> = symbols.chunks(8).map(|c| c.join(" ")).collect();
    let tokens = tmp.path().join("tokens.txt");
    std::fs::write(&tokens, lines.join("\n"))?;
    let run = tmp.path().join("run");
    let (ok, _, err) = run_mha!("train --tokens {} --out {} --steps 1 --batch-size 8 --embed-dim 8 --num-heads 2 --num-layers 1 --val-fraction 0.01 --quiet", s(&tokens), s(&run))?;
    assert!(ok, "{err}");
    let corpus = tmp.path().join("corpus.txt");
    std::fs::write(&corpus, lines[..200].join("\n"))?;
    let out = tmp.path().join("vm");
    let (code, err) = mha_within(
        &[
            "vocab-matrix",
            "--checkpoint",
            s(&run),
            "--tokens",
            s(&corpus),
            "--out",
            s(&out),
        ],
        300,
    )?;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("50257 ids are more than the 8192 written dense"),
        "{err}"
    );
    let sd = candle_mha::checkpoint::StateDict::load(out.join("vocab_matrix.safetensors"))?;
    let cells = sd.get("sum").expect("sum").dims1()?;
    // 200 sequences of 8 symbols (9 positions with BOS), causal: at most 200 × 45 cells.
    assert!(cells > 200 && cells <= 200 * 45, "{cells} cells");
    Ok(())
}

/// An f64 run stopped and resumed with a plain `--resume` (what the stop message suggests)
/// continues in f64 and ends bit for bit where the uninterrupted run ends.
#[test]
fn an_f64_run_resumed_plainly_stays_f64() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (whole, parts) = (tmp.path().join("whole"), tmp.path().join("parts"));
    // Inside the default warmup (100 steps): the schedule of 6 steps is that of 12 for its first
    // 6; the defaults' evaluation (every 250) and save (every 500) happen at the end only.
    let run = |out: &Path, steps: &str, extra: &[&str]| -> Result<()> {
        let mut args = vec![
            "train",
            "--out",
            s(out),
            "--steps",
            steps,
            "--train-examples",
            "500",
        ];
        // The tiny model's shape; this task has no vocabulary to size.
        args.extend(&words(TINY_TEXT_MODEL)[2..]);
        args.push("--quiet");
        args.extend(extra);
        let (ok, _, err) = mha(&args)?;
        anyhow::ensure!(ok, "{args:?}: {err}");
        Ok(())
    };
    run(&whole, "12", &["--dtype", "f64"])?;
    run(&parts, "6", &["--dtype", "f64"])?;
    run(&parts, "12", &["--resume"])?;
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let same = std::fs::read(whole.join(f))? == std::fs::read(parts.join(f))?;
        assert!(same, "{f}: the f64 run resumed with --resume differs");
    }
    let state = std::fs::read_to_string(parts.join("trainer_state.json"))?;
    assert!(state.contains("\"dtype\": \"f64\""), "{state}");
    Ok(())
}
