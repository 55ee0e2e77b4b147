//! `mha train --autocast bf16`: recorded in the run, changed on resume, and refused with
//! nothing written where it cannot apply (`--dtype f64`, a GPU); `mha generate --autocast
//! bf16` on that run, and refused in the same cases.

mod common;

use std::path::Path;

use anyhow::Result;
use common::run_mha;
use common::s;

fn state(run: &Path) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(&std::fs::read(
        run.join("trainer_state.json"),
    )?)?)
}

#[test]
fn autocast_is_kept_in_the_run_and_may_change_on_resume() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(200),
    )?;
    let run = tmp.path().join("run");
    let (ok, out, err) = run_mha!(
        "train --text {} --out {} --steps 3 --eval-every 0 --autocast bf16 --embed-dim 32 --num-heads 2 --num-layers 1 --max-len 32 --batch-size 4",
        s(&text),
        s(&run)
    )?;
    assert!(ok, "{out}{err}");
    assert_eq!(state(&run)?["config"]["autocast_bf16"], true);
    let (ok, out, err) = run_mha!("train --resume --out {} --steps 5 --autocast off", s(&run))?;
    assert!(ok, "{out}{err}");
    assert!(
        err.contains("changed on resume: --autocast off (was bf16)"),
        "{err}"
    );
    assert!(state(&run)?["config"].get("autocast_bf16").is_none());

    for (flag, value, want) in [
        (
            "--dtype",
            "f64",
            "--autocast bf16 with --dtype f64: autocast rounds f32 products; expected --dtype f32",
        ),
        (
            "--device",
            "cuda",
            "--autocast bf16 with --device cuda: autocast is for the CPU's products",
        ),
    ] {
        let flags = format!("{flag} {value}");
        let other = tmp.path().join("other");
        let (ok, _, err) = run_mha!(
            "train --text {} --out {} --steps 1 --autocast bf16 {} {}",
            s(&text),
            s(&other),
            flag,
            value
        )?;
        assert!(!ok && err.contains(want), "{flags}: {err}");
        assert!(
            !other.exists(),
            "{flags}: the refused run wrote {}",
            other.display()
        );
    }

    // Generation from the run under autocast: one prompt, then a batch of two.
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt the --prompt fox --max-new-tokens 6 --autocast bf16",
        s(&run)
    )?;
    assert!(ok && out.lines().count() == 2, "{out}{err}");
    let (ok, out, err) = run_mha!(
        "generate --checkpoint {} --prompt the --max-new-tokens 6 --autocast bf16",
        s(&run)
    )?;
    assert!(ok && out.lines().count() == 1, "{out}{err}");
    assert!(err.contains("6 new tokens in"), "{err}");
    for (flag, value, want) in [
        (
            "--dtype",
            "f64",
            "--autocast bf16 with --dtype f64: autocast rounds f32 products",
        ),
        (
            "--device",
            "cuda",
            "--autocast bf16 with --device cuda: autocast is for the CPU's",
        ),
    ] {
        let (ok, _, err) = run_mha!(
            "generate --checkpoint {} --prompt the --autocast bf16 {} {}",
            s(&run),
            flag,
            value
        )?;
        assert!(!ok && err.contains(want), "generate {flag} {value}: {err}");
    }
    Ok(())
}
