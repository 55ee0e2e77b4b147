//! The attention explorer page in headless Chromium (skipped politely when it is not
//! installed): what each view draws, what hovering and clicking change, that the values and
//! colours it shows are the crate's, and how fast a large page loads.

use candle_mha_test_support as common;
mod explorer_page;

use std::time::{Duration, Instant};

use anyhow::Result;
use candle_mha_viz::html::{attention_explorer, ExplorerOptions};
use candle_mha_viz::{attention_flow, attention_rollout, fuse_heads, HeadFusion};
use common::browser::{page_data, screenshot_dir};
use explorer_page::*;
use serde_json::Value;

#[test]
fn views_of_a_model_in_the_browser() -> Result<()> {
    let Some((_guard, b)) = browser()? else {
        return Ok(());
    };
    let dims = [2, 3, 6, 6];
    let w = random_weights(7, &dims)?;
    let wv = values(&w)?;
    let t: Vec<String> = ["The", "cat", "sat", "on", "the", "mat"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mine = random_weights(8, &[6, 6])?;
    let html = attention_explorer(
        &w,
        &t,
        &t,
        &ExplorerOptions::default().with_matrix("my score", mine.clone()),
    )?;
    let data = page_data(&html)?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.html");
    std::fs::write(&path, &html)?;
    b.open(&path)?;

    // Head view: tokens, heads, layers; every visible line of layer 0.
    assert_eq!(b.count("#hv-queries .hv-tok")?, 6);
    assert_eq!(b.count("#hv-keys .hv-tok")?, 6);
    assert_eq!(b.count(".hv-head")?, 3);
    assert_eq!(b.count("#hv-layer option")?, 2);
    assert_eq!(b.text("#hv-keys .hv-tok[data-j=\"5\"]")?, "mat");
    let all = [0, 1, 2];
    assert_eq!(canvas_attr(&b, "focus")?, "");
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 0, &all, 0..6, 0..6).to_string()
    );
    // Hovering query 2: only row 2's lines.
    b.hover("#hv-queries .hv-tok[data-i=\"2\"]")?;
    b.wait_for(
        "document.getElementById('hv-canvas').dataset.focus === 'row 2'",
        Duration::from_secs(5),
    )?;
    let row2 = visible(&wv, dims, 0, &all, 2..3, 0..6);
    assert_eq!(canvas_attr(&b, "lines")?, row2.to_string());
    // Head 1 off: its lines go; hovering again shows row 2 of heads 0 and 2.
    b.click(".hv-head[data-head=\"1\"]")?;
    assert_eq!(
        b.eval("return document.querySelector('.hv-head[data-head=\"1\"]').getAttribute('aria-pressed');")?,
        "false"
    );
    assert_eq!(canvas_attr(&b, "heads")?, "0,2");
    assert_eq!(canvas_attr(&b, "focus")?, "");
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 0, &[0, 2], 0..6, 0..6).to_string()
    );
    b.hover("#hv-queries .hv-tok[data-i=\"2\"]")?;
    let row2_on = visible(&wv, dims, 0, &[0, 2], 2..3, 0..6);
    assert!(row2_on < row2, "{row2_on} {row2}");
    b.wait_for(
        &format!("document.getElementById('hv-canvas').dataset.lines === '{row2_on}'"),
        Duration::from_secs(5),
    )?;
    // Hovering key 4: only column 4's lines; in layer 1 too.
    b.hover("#hv-keys .hv-tok[data-j=\"4\"]")?;
    b.wait_for(
        "document.getElementById('hv-canvas').dataset.focus === 'col 4'",
        Duration::from_secs(5),
    )?;
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 0, &[0, 2], 0..6, 4..5).to_string()
    );
    choose(&b, "hv-layer", "1")?;
    assert_eq!(canvas_attr(&b, "layer")?, "1");
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 1, &[0, 2], 0..6, 4..5).to_string()
    );
    b.screenshot(&screenshot_dir().join("explorer-head.png"))?;

    // Model view: every layer × head; the shared layer's... click layer 1, head 2.
    b.click("#tab-model")?;
    assert_eq!(state(&b)?["view"], "model");
    assert_eq!(b.count(".mv-thumb")?, 6);
    // A corner, a heading per head and per layer.
    assert_eq!(b.count("#mv-grid .mv-label")?, 1 + 3 + 2);
    assert_eq!(b.count("#view-model:not([hidden])")?, 1);
    assert_eq!(b.count("#view-head[hidden]")?, 1);
    b.screenshot(&screenshot_dir().join("explorer-model.png"))?;
    b.click(".mv-thumb[data-layer=\"0\"][data-head=\"2\"]")?;
    let st = state(&b)?;
    assert_eq!(
        (&st["view"], &st["layer"], &st["matrix"]["choice"]),
        (&Value::from("matrix"), &Value::from(0), &Value::from("2"))
    );
    assert_eq!(b.text("#mx-title")?, "layer 0, head 2");
    assert_eq!(b.count("#mx-rows .mx-label")?, 6);
    assert_eq!(b.count("#mx-cols .mx-label")?, 6);
    assert_eq!(b.text("#mx-cols .mx-label[data-j=\"2\"]")?, "sat");
    assert_eq!(
        b.eval("return document.getElementById('mx-layer').value;")?,
        "0"
    );
    assert_eq!(
        b.eval("return document.getElementById('hv-layer').value;")?,
        "0"
    );
    assert_eq!(
        b.count(".mv-thumb.sel[data-layer=\"0\"][data-head=\"2\"]")?,
        1
    );

    // Matrix view: one head, fused heads, rollout, flow, the extra matrix.
    let stored = ints(&data["weights"]);
    let slab = |l: usize, h: usize| -> Vec<f64> {
        let o = (l * 3 + h) * 36;
        stored[o..o + 36].iter().map(|&q| q as f64 / 1e4).collect()
    };
    let cells = [(0, 0), (1, 4), (3, 2), (5, 5), (4, 1)];
    let tol = 0.5e-4 + 1e-9;
    check_matrix(
        &b,
        &values(&w.get(0)?.get(2)?)?,
        &slab(0, 2),
        6,
        &cells,
        tol,
        &t,
        &t,
    )?;
    choose(&b, "mx-layer", "1")?;
    assert_eq!(b.text("#mx-title")?, "layer 1, head 2");
    check_matrix(
        &b,
        &values(&w.get(1)?.get(2)?)?,
        &slab(1, 2),
        6,
        &cells,
        tol,
        &t,
        &t,
    )?;
    b.screenshot(&screenshot_dir().join("explorer-matrix.png"))?;
    // The mean of the stored heads, as the page computes it: Σ q / (H · 10^4).
    let mean: Vec<f64> = (0..36)
        .map(|k| (0..3).map(|h| stored[(3 + h) * 36 + k]).sum::<i64>() as f64 / 3e4)
        .collect();
    choose(&b, "mx-matrix", "mean")?;
    assert_eq!(b.text("#mx-title")?, "layer 1, mean of 3 heads");
    let fused = |f: HeadFusion| -> Result<Vec<f64>> { values(&fuse_heads(&w.get(1)?, f)?) };
    check_matrix(&b, &fused(HeadFusion::Mean)?, &mean, 6, &cells, tol, &t, &t)?;
    let max: Vec<f64> = (0..36)
        .map(|k| (0..3).map(|h| stored[(3 + h) * 36 + k]).max().unwrap() as f64 / 1e4)
        .collect();
    choose(&b, "mx-matrix", "max")?;
    check_matrix(&b, &fused(HeadFusion::Max)?, &max, 6, &cells, tol, &t, &t)?;
    let layers = [w.get(0)?, w.get(1)?];
    let matrices = data["matrices"].as_array().unwrap();
    assert_eq!(b.count("#mx-matrix option")?, 3 + 3 + 3);
    for (k, want) in [
        attention_rollout(&layers, HeadFusion::Mean, true, 0.0)?,
        attention_flow(&layers, HeadFusion::Mean, true)?,
        mine,
    ]
    .iter()
    .enumerate()
    {
        choose(&b, "mx-matrix", &format!("m{k}"))?;
        assert_eq!(
            b.eval("return document.getElementById('mx-layer').disabled;")?,
            true
        );
        let st: Vec<f64> = ints(&matrices[k]["values"])
            .iter()
            .map(|&q| q as f64 / 1e4)
            .collect();
        // The f32 rollout/flow differ from f64 ones by rounding only.
        check_matrix(&b, &values(want)?, &st, 6, &cells, tol + 1e-6, &t, &t)?;
        if k == 0 {
            b.screenshot(&screenshot_dir().join("explorer-rollout.png"))?;
        }
    }
    assert_eq!(b.text("#mx-title")?, "my score");
    // Back in the head view, the layer chosen in the matrix view.
    b.click("#tab-head")?;
    assert_eq!(canvas_attr(&b, "layer")?, "1");
    let errors = b.js_errors()?;
    assert!(errors.is_empty(), "{errors:?}");
    Ok(())
}

#[test]
fn cross_attention_module_page_is_offline_and_escaped() -> Result<()> {
    let Some((_guard, b)) = browser()? else {
        return Ok(());
    };
    // One layer of the module: (H, L, S) with L ≠ S, labels that would be markup.
    let dims = [1, 2, 4, 5];
    let w = random_weights(9, &dims[1..])?;
    let wv = values(&w)?;
    let q: Vec<String> = NASTY.iter().map(|s| s.to_string()).collect();
    let k = labels("mem", 5);
    let html = attention_explorer(&w, &q, &k, &ExplorerOptions::default())?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("cross.html");
    std::fs::write(&path, &html)?;
    b.open(&path)?;

    assert_eq!(b.count("#hv-queries .hv-tok")?, 4);
    assert_eq!(b.count("#hv-keys .hv-tok")?, 5);
    assert_eq!(b.count(".hv-head")?, 2);
    // Labels are text: same innerText, no element or script from them, nothing ran.
    for (i, label) in q.iter().enumerate() {
        assert_eq!(
            &b.text(&format!("#hv-queries .hv-tok[data-i=\"{i}\"]"))?,
            label
        );
        assert_eq!(
            &b.text(&format!("#mx-rows .mx-label[data-i=\"{i}\"]"))?,
            label
        );
    }
    assert_eq!(b.eval("return document.scripts.length;")?, 3);
    assert_eq!(b.count("img")?, 0);
    assert_eq!(b.eval("return document.title;")?, "Attention");
    // Offline: nothing fetched, no http(s) URL in any src or href.
    assert_eq!(
        b.eval("return performance.getEntriesByType('resource').length;")?,
        0
    );
    assert_eq!(
        b.eval(
            "return [...document.querySelectorAll('[src], [href]')]
               .filter(e => /^https?:/i.test(e.getAttribute('src') || e.getAttribute('href'))).length;"
        )?,
        0
    );

    // Hovering a key: its column over both heads.
    b.hover("#hv-keys .hv-tok[data-j=\"3\"]")?;
    b.wait_for(
        "document.getElementById('hv-canvas').dataset.focus === 'col 3'",
        Duration::from_secs(5),
    )?;
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 0, &[0, 1], 0..4, 3..4).to_string()
    );
    b.hover("#hv-queries .hv-tok[data-i=\"0\"]")?;
    b.wait_for(
        "document.getElementById('hv-canvas').dataset.focus === 'row 0'",
        Duration::from_secs(5),
    )?;
    assert_eq!(
        canvas_attr(&b, "lines")?,
        visible(&wv, dims, 0, &[0, 1], 0..1, 0..5).to_string()
    );
    b.screenshot(&screenshot_dir().join("explorer-cross-head.png"))?;

    b.click("#tab-model")?;
    assert_eq!(b.count(".mv-thumb")?, 2);
    b.click(".mv-thumb[data-head=\"1\"]")?;
    // No rollout or flow for cross-attention: heads and fusions only.
    assert_eq!(b.count("#mx-matrix option")?, 2 + 3);
    assert_eq!(
        state(&b)?["matrix"]["cell"].as_f64().map(|c| {
            let canvas = b
                .eval("const c = document.getElementById('mx-canvas'); return [c.width, c.height];")
                .unwrap();
            (
                canvas[0].as_f64().unwrap() / c,
                canvas[1].as_f64().unwrap() / c,
            )
        }),
        Some((5.0, 4.0))
    );
    let stored: Vec<f64> = ints(&page_data(&html)?["weights"])[20..40]
        .iter()
        .map(|&x| x as f64 / 1e4)
        .collect();
    let cells = [(0, 0), (0, 4), (3, 2), (2, 3)];
    check_matrix(
        &b,
        &values(&w.get(1)?)?,
        &stored,
        5,
        &cells,
        0.5e-4 + 1e-9,
        &q,
        &k,
    )?;
    b.screenshot(&screenshot_dir().join("explorer-cross-matrix.png"))?;
    let errors = b.js_errors()?;
    assert!(errors.is_empty(), "{errors:?}");
    Ok(())
}

#[test]
fn a_12_layer_12_head_128_token_page_loads() -> Result<()> {
    let Some((_guard, b)) = browser()? else {
        return Ok(());
    };
    let w = random_weights(10, &[12, 12, 128, 128])?;
    let t = labels("tok", 128);
    let t0 = Instant::now();
    let html = attention_explorer(&w, &t, &t, &ExplorerOptions::default())?;
    let build = t0.elapsed();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("big.html");
    std::fs::write(&path, &html)?;
    let t0 = Instant::now();
    b.open(&path)?;
    let open = t0.elapsed();
    let ready = b
        .eval("return window.mhaExplorer.readyMs;")?
        .as_f64()
        .unwrap();
    let lines = canvas_attr(&b, "lines")?;
    // A hover redraws one row of 12 heads.
    let t0 = Instant::now();
    b.hover("#hv-queries .hv-tok[data-i=\"5\"]")?;
    b.wait_for(
        "document.getElementById('hv-canvas').dataset.focus === 'row 5'",
        Duration::from_secs(5),
    )?;
    let hover = t0.elapsed();
    let model = b
        .eval(
            "const t = performance.now(); document.getElementById('tab-model').click();
             return performance.now() - t;",
        )?
        .as_f64()
        .unwrap();
    assert_eq!(b.count(".mv-thumb")?, 144);
    b.screenshot(&screenshot_dir().join("explorer-big-model.png"))?;
    let matrix = b
        .eval(
            "const t = performance.now(); document.querySelector('.mv-thumb[data-layer=\"11\"]').click();
             return performance.now() - t;",
        )?
        .as_f64()
        .unwrap();
    println!(
        "12 × 12 × 128 × 128: {} bytes, built in {build:.2?}; ready after {ready:.0} ms \
         (open() returned after {open:.2?}), {lines} lines; hover {hover:.2?}, model view \
         {model:.0} ms, matrix view {matrix:.0} ms",
        html.len()
    );
    b.screenshot(&screenshot_dir().join("explorer-big-matrix.png"))?;
    // The times are printed, not asserted: they measure the machine as much as the page.
    assert!(ready.is_finite() && ready >= 0.0, "ready after {ready} ms");
    let errors = b.js_errors()?;
    assert!(errors.is_empty(), "{errors:?}");
    Ok(())
}
