//! `mha plot`: charts from two runs' metrics.jsonl, the per-run summary, names, errors.

mod common;

use std::path::Path;

use anyhow::Result;
use common::image::Image;
use common::{mha, run_mha};

// matplotlib's tab10: run k's train curve gets entry 2k, its validation curve 2k + 1.
const PALETTE: [[u8; 3]; 4] = [
    [0x1f, 0x77, 0xb4],
    [0xff, 0x7f, 0x0e],
    [0x2c, 0xa0, 0x2c],
    [0xd6, 0x27, 0x28],
];

/// A run directory `dir` whose metrics.jsonl holds `lines`.
fn run_dir(dir: &Path, lines: &[&str]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n")?;
    Ok(())
}

/// Run "a": 4 steps, two evaluations (the better at step 2); run "b": 3 steps, one.
fn two_runs(root: &Path) -> Result<()> {
    run_dir(
        &root.join("a"),
        &[
            r#"{"step":1,"train_loss":3.0,"lr":0.001,"grad_norm":1.0,"tokens_per_s":100.0,"tokens":64}"#,
            r#"{"step":2,"train_loss":2.5,"lr":0.001}"#,
            r#"{"step":2,"val_loss":2.25,"val_perplexity":9.49,"val_accuracy":0.2}"#,
            r#"{"step":3,"train_loss":2.0}"#,
            r#"{"step":4,"train_loss":1.5,"val_loss":2.375,"val_perplexity":10.75}"#,
        ],
    )?;
    run_dir(
        &root.join("b"),
        &[
            r#"{"step":1,"train_loss":4.0}"#,
            r#"{"step":2,"train_loss":3.5}"#,
            r#"{"step":3,"train_loss":3.25,"val_loss":3.5}"#,
        ],
    )
}

#[test]
fn plots_two_runs_to_png_and_svg() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    two_runs(tmp.path())?;
    let (png_path, svg_path) = (tmp.path().join("x.png"), tmp.path().join("x.svg"));
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let (a, b) = (p(&tmp.path().join("a")), p(&tmp.path().join("b")));
    let (ok, out, err) = run_mha!(
        "plot {} {} --png {} --svg {} --width 640 --height 360 --title 'two runs'",
        &a,
        &b,
        &p(&png_path),
        &p(&svg_path)
    )?;
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "a: 4 steps logged, last train loss 1.5000 at step 4; best val loss 2.2500 at step 2 (2 evaluations)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "b: 3 steps logged, last train loss 3.2500 at step 3; best val loss 3.5000 at step 3 (1 evaluation)"
        ),
        "{out}"
    );
    let img = Image::open(&png_path)?;
    assert_eq!(img.size(), (640, 360));
    for (k, rgb) in PALETTE.iter().enumerate() {
        // b's single evaluation is a 7×7 marker (plus its legend swatch).
        assert!(
            img.count(*rgb) >= 49,
            "series {k} colour {rgb:?}: {}",
            img.count(*rgb)
        );
    }
    let svg = std::fs::read_to_string(&svg_path)?;
    assert!(
        svg.contains(r#"width="640" height="360""#),
        "{}",
        &svg[..200]
    );
    assert_eq!(svg.matches(r#"<g class="series""#).count(), 4);
    for name in ["a train", "a val", "b train", "b val", "two runs", "step"] {
        assert!(svg.contains(&format!(">{name}</text>")), "{name}");
    }
    // Default size and title.
    let (ok, _, err) = run_mha!("plot {} --png {}", &a, &p(&png_path))?;
    assert!(ok, "{err}");
    assert_eq!(Image::open(&png_path)?.w, 800);
    Ok(())
}

#[test]
fn runs_sharing_a_name_are_named_by_path() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (x, y) = (tmp.path().join("x/run"), tmp.path().join("y/run"));
    run_dir(
        &x,
        &[
            r#"{"step":1,"train_loss":1.0}"#,
            r#"{"step":2,"train_loss":0.5}"#,
        ],
    )?;
    run_dir(&y, &[r#"{"step":1,"train_loss":2.0}"#])?;
    let svg_path = tmp.path().join("p.svg");
    let (ok, out, err) = run_mha!(
        "plot {} {} --svg {}",
        x.to_str().unwrap(),
        y.to_str().unwrap(),
        svg_path.to_str().unwrap()
    )?;
    assert!(ok, "{err}");
    assert!(out.contains("no evaluations"), "{out}");
    let svg = std::fs::read_to_string(&svg_path)?;
    assert!(
        svg.contains(&format!("<title>{} train</title>", x.display())),
        "{svg}"
    );
    assert!(svg.contains(&format!("<title>{} train</title>", y.display())));
    Ok(())
}

#[test]
fn errors_missing_metrics_and_no_output() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    two_runs(tmp.path())?;
    let a = tmp.path().join("a");
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty)?;
    let png_path = tmp.path().join("x.png");
    let (ok, _, err) = run_mha!(
        "plot {} {} --png {}",
        a.to_str().unwrap(),
        empty.to_str().unwrap(),
        png_path.to_str().unwrap()
    )?;
    assert!(!ok);
    assert!(
        err.contains(empty.to_str().unwrap()) && err.contains("metrics.jsonl"),
        "{err}"
    );
    assert!(!png_path.exists(), "nothing is written on an error");
    let (ok, _, err) = mha(&["plot", a.to_str().unwrap()])?;
    assert!(
        !ok && err.contains("--png") && err.contains("--svg"),
        "{err}"
    );
    let missing = tmp.path().join("nope");
    let (ok, _, err) = run_mha!(
        "plot {} --png {}",
        missing.to_str().unwrap(),
        png_path.to_str().unwrap()
    )?;
    assert!(!ok && err.contains(missing.to_str().unwrap()), "{err}");
    // A metrics file without any loss: nothing to plot.
    std::fs::write(empty.join("metrics.jsonl"), "")?;
    let (ok, _, err) = run_mha!(
        "plot {} --png {}",
        empty.to_str().unwrap(),
        png_path.to_str().unwrap()
    )?;
    assert!(!ok && err.contains("nothing to plot"), "{err}");
    Ok(())
}
