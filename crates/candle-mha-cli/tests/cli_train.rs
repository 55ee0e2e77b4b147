//! `mha train`, `mha generate`, `mha eval` end to end on small data written by the tests,
//! and their errors on bad data.

use std::path::Path;

mod common;

use anyhow::Result;
use common::{mha, run_mha};

/// Event streams with a rule: after `T3` comes `T5` or `T4`, sequences start with `T1`.
fn write_events(path: &Path, lines: usize) -> Result<()> {
    let patterns = [
        "T1 T2 T3 T4 T3 T5",
        "T1 T3 T5 T2",
        "T1 T2 T2 T3 T4",
        "T1 T4 T3 T5 T5",
    ];
    let text: Vec<&str> = (0..lines).map(|i| patterns[i % patterns.len()]).collect();
    std::fs::write(path, text.join("\n") + "\n")?;
    Ok(())
}

#[test]
fn train_generate_eval_resume_on_a_token_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("events.txt");
    write_events(&data, 200)?;
    let out = dir.path().join("run");
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let small =
        common::words("--embed-dim 16 --num-heads 2 --num-layers 1 --batch-size 16 --quiet");
    let mut args = vec![
        "train",
        "--tokens",
        d,
        "--out",
        o,
        "--steps",
        "150",
        "--eval-every",
        "50",
        "--save-every",
        "100",
    ];
    args.extend(small);
    let (ok, stdout, stderr) = mha(&args)?;
    assert!(ok, "{stdout}{stderr}");
    // Notices and progress on stderr; the run's result on stdout.
    assert!(stderr.contains("device: cpu"), "{stderr}");
    assert!(
        stderr.contains("data: 180 training and 20 validation sequences, 9 ids, longest 8 tokens"),
        "{stderr}"
    );
    assert!(
        stderr.contains("step 50: eval loss") && stderr.contains("step 100: checkpoint saved"),
        "{stderr}"
    );
    assert!(stdout.contains("final eval (step 150): loss"), "{stdout}");
    for f in [
        "model.safetensors",
        "config.json",
        "vocab.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }

    // The rule "T1 first" is learned: greedy generation from BOS starts with T1 ... and
    // every prompt symbol must be known.
    let (ok, stdout, stderr) = run_mha!(
        "generate --checkpoint {} --prompt 'T1 T3' --max-new-tokens 3",
        o
    )?;
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("T1 T3\n=> T5"), "{stdout}");
    let (ok, _, stderr) = run_mha!("generate --checkpoint {} --prompt 'T1 T9'", o)?;
    assert!(
        !ok && stderr.contains("\"T9\"") && stderr.contains("not in the vocabulary"),
        "{stderr}"
    );
    let (ok, stdout, stderr) =
        run_mha!("generate --checkpoint {} --prompt T1 --top-k 2 --seed 3", o)?;
    assert!(ok && stdout.starts_with("T1\n=> "), "{stdout}{stderr}");

    let (ok, stdout, stderr) = mha(&["eval", "--checkpoint", o])?;
    assert!(
        ok && stdout.contains("eval on the run's validation set (20 sequences): loss"),
        "{stdout}{stderr}"
    );
    let (ok, stdout, _) = run_mha!("eval --checkpoint {} --tokens {}", o, d)?;
    assert!(ok && stdout.contains("(200 sequences)"), "{stdout}");

    // Train further: continues at the saved step.
    let (ok, stdout, stderr) = run_mha!("train --out {} --resume --steps 160 --quiet", o)?;
    assert!(
        ok && stderr.contains("resuming at step 150 of 160")
            && stdout.contains("final eval (step 160)"),
        "{stdout}{stderr}"
    );
    // Without --resume an existing run is not overwritten.
    let (ok, _, stderr) = run_mha!("train --tokens {} --out {} --steps 5", d, o)?;
    assert!(
        !ok && stderr.contains("already holds a run: pass --resume"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn bad_data_and_checkpoints_are_clear_errors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(p("empty.txt"), "\n\n# only a comment\n")?;
    let (ok, _, stderr) = run_mha!(
        "train --tokens {} --out {} --steps 1",
        &p("empty.txt"),
        &p("r1")
    )?;
    assert!(
        !ok && stderr.contains("error: ") && stderr.contains("empty.txt"),
        "{stderr}"
    );

    std::fs::write(p("long.txt"), "a b\na b c d e f g h\n")?;
    let (ok, _, stderr) = run_mha!(
        "train --tokens {} --out {} --max-len 4 --steps 1",
        &p("long.txt"),
        &p("r2")
    )?;
    assert!(
        !ok && stderr.contains("long.txt:2:") && stderr.contains("at most"),
        "{stderr}"
    );

    // Hyper-parameters PyTorch would reject (or that train into NaNs) are errors, and no
    // checkpoint is written.
    for (flag, message) in [
        ("--lr=-1", "for '--lr <LR>': expected a number in [0, "),
        ("--lr=nan", "for '--lr <LR>': expected a number in [0, "),
        ("--weight-decay=-0.5", "expected a number in [0, 1000]"),
        (
            "--clip=-1",
            "for '--clip <CLIP>': expected a number in [0, ",
        ),
        ("--val-fraction=1.5", "expected a number in [0, 1]"),
        (
            "--dropout=1",
            "for '--dropout <DROPOUT>': expected a number in [0, 1)",
        ),
        // Finite but diverging: after the first update the evaluation loss is NaN, and the
        // save refuses.
        (
            "--lr=1e30",
            "evaluation loss is NaN, the weights have diverged",
        ),
    ] {
        let out = p("bad_hparams");
        let (ok, _, stderr) = run_mha!("train {} --out {} --steps 1", flag, &out)?;
        assert!(!ok && stderr.contains(message), "{flag}: {stderr}");
        assert!(
            !dir.path().join("bad_hparams/model.safetensors").exists(),
            "{flag}: a checkpoint was written"
        );
    }

    let (ok, _, stderr) = run_mha!("train --out {} --resume", &p("r3"))?;
    assert!(
        !ok && stderr.contains("has no trainer_state.json"),
        "{stderr}"
    );
    let (ok, _, stderr) = run_mha!("train --out {} --dtype f16 --steps 1", &p("r3"))?;
    assert!(
        !ok && stderr.contains("training runs in f32 or f64"),
        "{stderr}"
    );
    let (ok, _, stderr) = run_mha!("train --out {} --device cuda:0 --steps 1", &p("r3"))?;
    assert!(
        !ok && (stderr.contains("without CUDA support") || stderr.contains("not available")),
        "{stderr}"
    );

    // A checkpoint whose config.json does not match its weights.
    write_events(&dir.path().join("ev.txt"), 20)?;
    let (ok, _, stderr) = run_mha!(
        "train --tokens {} --out {} --steps 2 --embed-dim 8 --num-heads 2 --num-layers 1 --quiet",
        &p("ev.txt"),
        &p("r4")
    )?;
    assert!(ok, "{stderr}");
    let cfg = std::fs::read_to_string(dir.path().join("r4/config.json"))?
        .replace("\"embed_dim\": 8", "\"embed_dim\": 16");
    std::fs::write(dir.path().join("r4/config.json"), cfg)?;
    // checkpoint.json records what the save wrote: the edit is named as such.
    let (ok, _, stderr) = run_mha!("generate --checkpoint {} --prompt T1", &p("r4"))?;
    assert!(
        !ok && stderr.contains("config.json does not match")
            && stderr.contains("changed or damaged"),
        "{stderr}"
    );
    // Without it (a checkpoint put together by hand) it is refused unless --unverified; then
    // the load report names the mismatch.
    std::fs::remove_file(dir.path().join("r4/checkpoint.json"))?;
    let (ok, _, stderr) = run_mha!("generate --checkpoint {} --prompt T1", &p("r4"))?;
    assert!(!ok && stderr.contains("has no checkpoint.json"), "{stderr}");
    let (ok, _, stderr) = run_mha!(
        "generate --checkpoint {} --prompt T1 --unverified",
        &p("r4")
    )?;
    assert!(
        !ok && stderr.contains("size mismatch for") && stderr.contains("NextTokenPredictor"),
        "{stderr}"
    );
    let (ok, _, stderr) = mha(&["eval", "--checkpoint", &p("missing")])?;
    assert!(
        !ok && stderr.contains("config.json: no such file"),
        "{stderr}"
    );
    Ok(())
}

/// Options left out take the library's presets: a token file trains with
/// `TrainConfig::default()` and the model of `NextTokenPredictorConfig::new`, its context the
/// data's longest sequence.
#[test]
fn options_left_out_take_the_sequence_presets() -> Result<()> {
    use candle_mha_train::models::NextTokenPredictorConfig;
    use candle_mha_train::{TrainConfig, TrainerState};

    let dir = tempfile::tempdir()?;
    let data = dir.path().join("events.txt");
    write_events(&data, 20)?;
    let out = dir.path().join("run");
    let (ok, _, stderr) = run_mha!(
        "train --tokens {} --out {} --steps 1 --quiet",
        data.to_str().unwrap(),
        out.to_str().unwrap()
    )?;
    assert!(ok, "{stderr}");
    let state: TrainerState =
        serde_json::from_str(&std::fs::read_to_string(out.join("trainer_state.json"))?)?;
    assert_eq!(
        state.config,
        TrainConfig {
            steps: 1,
            // The command line decays to a tenth of the peak, as its --help says.
            min_lr: TrainConfig::default().lr / 10.0,
            ..TrainConfig::default()
        }
    );
    // 9 ids (4 specials, T1..T5); the longest sequence has 8 tokens (BOS, 6 symbols, EOS).
    assert_eq!(
        NextTokenPredictorConfig::load(out.join("config.json"))?,
        NextTokenPredictorConfig {
            max_len: 7,
            // The command line's head has no bias (exportable to GPT-2).
            head_bias: Some(false),
            ..NextTokenPredictorConfig::new(9)
        }
    );
    Ok(())
}
