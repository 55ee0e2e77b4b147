//! `mha inspect` and `mha vocab-matrix` on a small model trained by `mha train`.

mod common;

use anyhow::Result;
use common::run_mha;

#[test]
fn inspect_and_vocab_matrix() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    common::train_tiny_run(dir.path())?;

    let (ok, stdout, stderr) = run_mha!("inspect --checkpoint {} --input 'T1 T2 T3' --png {} --svg {} --dot {} --graphml {} --rollout --all-heads", &p("run"), &p("a.png"), &p("a.svg"), &p("a.dot"), &p("a.graphml"))?;
    assert!(ok, "{stderr}");
    // A labelled 4×4 table (BOS + 3 tokens) of the last layer, causal: row <bos> is 1, 0, 0, 0.
    assert!(
        stdout.contains("attention, layer 1, mean over 2 heads"),
        "{stdout}"
    );
    let bos_row = stdout
        .lines()
        .find(|l| l.starts_with("<bos>"))
        .unwrap_or_default();
    assert_eq!(
        bos_row.split_whitespace().collect::<Vec<_>>(),
        ["<bos>", "1.000", "0.000", "0.000", "0.000"],
        "{stdout}"
    );
    assert!(
        stdout.contains("layer 1, head 1") && stdout.contains("attention rollout over 2 layers"),
        "{stdout}"
    );
    let png = std::fs::read(p("a.png"))?;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // --all-heads: one panel per head under a title that says so (not the fused matrix's).
    let svg = std::fs::read_to_string(p("a.svg"))?;
    assert!(
        svg.contains("<svg") && svg.contains("layer 1, 2 heads") && !svg.contains("mean over"),
        "{svg}"
    );
    assert!(std::fs::read_to_string(p("a.dot"))?.contains("digraph"));
    assert!(std::fs::read_to_string(p("a.graphml"))?.contains("<graphml"));

    let (ok, _, stderr) = run_mha!("inspect --checkpoint {} --input T1 --layer 5", &p("run"))?;
    assert!(
        !ok && stderr.contains("--layer 5: the model has 2 layers"),
        "{stderr}"
    );
    let (ok, _, stderr) = run_mha!("inspect --checkpoint {} --input 'T1 T7'", &p("run"))?;
    assert!(!ok && stderr.contains("\"T7\""), "{stderr}");

    let (ok, stdout, stderr) = run_mha!(
        "vocab-matrix --checkpoint {} --out {} --top-k 2",
        &p("run"),
        &p("vm")
    )?;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("vocabulary matrix: layer 1, mean over heads"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("T3") && l.contains("->")),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.path().join("vm/vocab_matrix.csv"))?;
    assert!(
        csv.starts_with("query,key,sum,count,mean,row_share"),
        "{csv}"
    );
    assert!(dir.path().join("vm/vocab_matrix.safetensors").exists());

    // --no-safetensors: the sparse CSV only (the dense export is 4·V² f64 values).
    let (ok, _, stderr) = run_mha!(
        "vocab-matrix --checkpoint {} --out {} --no-safetensors",
        &p("run"),
        &p("vm2")
    )?;
    assert!(ok, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("vm2/vocab_matrix.csv"))?,
        csv,
        "the same cells as the first run"
    );
    assert!(!dir.path().join("vm2/vocab_matrix.safetensors").exists());
    assert!(
        stderr.contains("wrote") && !stderr.contains("vocab_matrix.safetensors"),
        "{stderr}"
    );
    Ok(())
}
