//! The HTML pages as the CLI writes them (`mha inspect --html`, `mha vocab-matrix --html`):
//! the file, its embedded data against what the command reports and writes beside it, and
//! that the page runs in headless Chromium. The pages' behaviour is tested in
//! candle-mha-viz on pages built through the library.

mod common;

use std::path::Path;

use anyhow::{Context, Result};
use common::browser::{page_data, Browser};
use common::run_mha;
use serde_json::Value;

fn values(v: &Value, key: &str) -> Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array"))
        .clone()
}

#[test]
fn inspect_html_writes_the_explorer() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    common::train_tiny_run(dir.path())?;
    let (ok, stdout, stderr) = run_mha!(
        "inspect --checkpoint {} --input 'T1 T2 T3' --html {}",
        &p("run"),
        &p("attn.html")
    )?;
    assert!(ok, "{stderr}");
    // The other outputs as before: the table of the last layer.
    assert!(
        stdout.contains("attention, layer 1, mean over 2 heads"),
        "{stdout}"
    );
    let html = std::fs::read_to_string(p("attn.html"))?;
    let size = stderr
        .lines()
        .find(|l| l.starts_with(&format!("wrote {}", p("attn.html"))))
        .with_context(|| stderr.clone())?;
    assert!(
        size.ends_with("; 2 layers × 2 heads × 4 tokens)") && size.contains(" kB;"),
        "{size}"
    );
    let d = page_data(&html)?;
    assert_eq!(
        (&d["layers"], &d["heads"], &d["rows"]),
        (&Value::from(2), &Value::from(2), &Value::from(4))
    );
    let labels: Vec<Value> = ["<bos>", "T1", "T2", "T3"].map(Value::from).to_vec();
    assert_eq!(values(&d, "query_labels"), labels);
    assert_eq!(values(&d, "matrices").len(), 2);
    assert!(
        html.contains("<title>run: attention on &quot;T1 T2 T3&quot;</title>"),
        "{}",
        &html[..400]
    );
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    b.open(Path::new(&p("attn.html")))?;
    assert_eq!(b.count(".mv-thumb")?, 4);
    assert_eq!(b.text("#hv-queries .hv-tok[data-i=\"0\"]")?, "<bos>");
    let errors = b.js_errors()?;
    assert!(errors.is_empty(), "{errors:?}");
    Ok(())
}

#[test]
fn vocab_matrix_html_writes_the_page() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    common::train_tiny_run(dir.path())?;
    let (ok, _, stderr) = run_mha!(
        "vocab-matrix --checkpoint {} --out {} --top-k 2 --head 1 --html {}",
        &p("run"),
        &p("vm"),
        &p("vm.html")
    )?;
    assert!(ok, "{stderr}");
    let html = std::fs::read_to_string(p("vm.html"))?;
    let data = page_data(&html)?;
    // As many cells as the CSV the command writes beside it (one line per nonzero cell).
    let cells: i64 = values(&data, "row_len")
        .iter()
        .map(|n| n.as_i64().unwrap())
        .sum();
    let csv = std::fs::read_to_string(dir.path().join("vm/vocab_matrix.csv"))?;
    assert_eq!(cells as usize, csv.lines().count() - 1, "{csv}");
    assert!(html.contains("layer 1, head 1, over"), "title");
    assert_eq!(data["top_k"], 2);
    let size = html.len() as f64 / 1e3;
    assert!(
        stderr.contains(&format!("wrote {} ({size:.1} kB; ", p("vm.html")))
            && stderr.contains(&format!("{} tokens, {cells} cells)", data["vocab_size"])),
        "{stderr}"
    );
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    b.open(Path::new(&p("vm.html")))?;
    assert!(b.text("#vm-table")?.contains("T3"));
    assert!(b.js_errors()?.is_empty());
    Ok(())
}
