//! `scripts/compare_outputs.py`, which `scripts/gpu-check.sh` uses on a GPU machine to compare
//! an example's CPU and CUDA output: checked here, where device time costs nothing.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

/// Runs the script on two texts; `None` when there is no `python3`.
fn compare(a: &str, b: &str, args: &[&str]) -> Result<Option<(bool, String)>> {
    let dir = tempfile::tempdir()?;
    let (pa, pb) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
    std::fs::write(&pa, a)?;
    std::fs::write(&pb, b)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/compare_outputs.py");
    let out = match Command::new("python3")
        .arg(script)
        .args(args)
        .arg(&pa)
        .arg(&pb)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            println!("skipped: no python3 ({e})");
            return Ok(None);
        }
    };
    Ok(Some((out.status.success(), String::from_utf8(out.stdout)?)))
}

#[test]
fn equal_within_printed_precision_and_tolerance() -> Result<()> {
    let cpu = "weights:\n   0.529  0.471\nloss 0.12081 -> 0.10003 after one step\n";
    // A last-digit rounding, wider padding and a relative difference under 1e-3.
    let cuda = "weights:\n   0.530   0.471\nloss 0.120811 -> 0.10004 after one step\n";
    let Some((same, msg)) = compare(cpu, cuda, &[])? else {
        return Ok(());
    };
    assert!(same, "{msg}");
    assert!(msg.starts_with("SAME: 4 numbers"), "{msg}");
    Ok(())
}

#[test]
fn differences_are_reported() -> Result<()> {
    let cpu = "loss 0.12081 after 3 steps\n";
    for (other, what) in [
        ("loss 0.12381 after 3 steps\n", "number 0"),
        ("loss 0.12081 after 3 epochs\n", "text 2"),
        ("loss 0.12081 after 3 steps 4\n", "numbers in"),
    ] {
        let Some((same, msg)) = compare(cpu, other, &[])? else {
            return Ok(());
        };
        assert!(
            !same && msg.starts_with("DIFFERENT") && msg.contains(what),
            "{msg}"
        );
    }
    // A looser tolerance lets the first through.
    let (same, msg) = compare(cpu, "loss 0.12381 after 3 steps\n", &["--rtol", "0.05"])?.unwrap();
    assert!(same, "{msg}");
    Ok(())
}

#[test]
fn masked_durations_are_left_out() -> Result<()> {
    let (cpu, cuda) = ("trained in 1.4s: loss 0.9\n", "trained in 5.0s: loss 0.9\n");
    let Some((same, _)) = compare(cpu, cuda, &[])? else {
        return Ok(());
    };
    assert!(!same);
    let mask = ["--mask", r"[0-9.]+ ?(ms|s)\b"];
    let (same, msg) = compare(cpu, cuda, &mask)?.unwrap();
    assert!(same, "{msg}");
    Ok(())
}
