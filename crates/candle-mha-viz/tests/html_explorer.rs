//! The attention explorer page (`analysis::html::attention_explorer`, `mha inspect --html`):
//! its errors, its data, its size and escaping without a browser; then in headless Chromium
//! (skipped politely when it is not installed) what each view draws, what hovering and
//! clicking change, and that the values and colours it shows are the crate's.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha_viz::html::{attention_explorer, ExplorerOptions};
use candle_mha_viz::{
    attention_flow, attention_rollout, colormap, fuse_heads, HeadFusion, RolloutFusion,
};
use common::browser::{page_data, screenshot_dir, Browser};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde_json::Value;

/// One browser at a time: the load-time measurement should not share the CPU with another
/// Chromium, and two cores are the norm here.
static BROWSER: Mutex<()> = Mutex::new(());

/// Softmax rows of seeded normal logits: `dims` = (…, L, S), f32.
fn random_weights(seed: u64, dims: &[usize]) -> Result<Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let normal = Normal::new(0.0f64, 1.5)?;
    let s = *dims.last().unwrap();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n / s {
        let logits: Vec<f64> = (0..s).map(|_| normal.sample(&mut rng)).collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|x| (x - max).exp()).collect();
        let total: f64 = e.iter().sum();
        out.extend(e.iter().map(|x| (x / total) as f32));
    }
    Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
}

fn labels(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn err_of(r: candle_mha::candle::Result<String>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_input_is_a_clear_error() -> Result<()> {
    let w = random_weights(1, &[2, 3, 4, 5])?;
    let (q, k) = (labels("q", 4), labels("k", 5));
    let opts = ExplorerOptions::default();
    let e = err_of(attention_explorer(&w.get(0)?.get(0)?, &q, &k, &opts));
    assert!(e.contains("rank 2") && e.contains("(H, L, S)"), "{e}");
    let e = err_of(attention_explorer(&w.unsqueeze(0)?, &q, &k, &opts));
    assert!(e.contains("rank 5") && e.contains("[1, 2, 3, 4, 5]"), "{e}");
    let e = err_of(attention_explorer(&w.narrow(1, 0, 0)?, &q, &k, &opts));
    assert!(e.contains("H = 0"), "{e}");
    let e = err_of(attention_explorer(&w.to_dtype(DType::U32)?, &q, &k, &opts));
    assert!(e.contains("U32") && e.contains("float"), "{e}");
    // NaN at layer 1, head 2, query 3, key 1: flat index ((1·3 + 2)·4 + 3)·5 + 1.
    let mut v = values(&w)?;
    v[((3 + 2) * 4 + 3) * 5 + 1] = f64::NAN;
    let bad = Tensor::from_vec(v, (2, 3, 4, 5), &Device::Cpu)?;
    let e = err_of(attention_explorer(&bad, &q, &k, &opts));
    assert!(e.contains("NaN at layer 1, head 2, query 3, key 1"), "{e}");
    let e = err_of(attention_explorer(&w, &labels("q", 3), &k, &opts));
    assert!(
        e.contains("query_labels has 3 entries; expected L = 4"),
        "{e}"
    );
    let e = err_of(attention_explorer(&w, &q, &labels("k", 6), &opts));
    assert!(
        e.contains("key_labels has 6 entries; expected S = 5"),
        "{e}"
    );
    for d in [0, 7] {
        let e = err_of(attention_explorer(
            &w,
            &q,
            &k,
            &ExplorerOptions::default().with_decimals(d),
        ));
        assert!(
            e.contains(&format!("decimals = {d}")) && e.contains("1 to 6"),
            "{e}"
        );
    }
    let e = err_of(attention_explorer(
        &w,
        &q,
        &k,
        &ExplorerOptions::default()
            .with_matrix("mine", Tensor::zeros((5, 4), DType::F32, &Device::Cpu)?),
    ));
    assert!(
        e.contains("opts.matrices[0] (\"mine\") has shape [5, 4]") && e.contains("(4, 5)"),
        "{e}"
    );
    let inf = Tensor::from_vec(
        (0..20)
            .map(|i| if i == 7 { f32::INFINITY } else { 0.0 })
            .collect::<Vec<_>>(),
        (4, 5),
        &Device::Cpu,
    )?;
    let e = err_of(attention_explorer(
        &w,
        &q,
        &k,
        &ExplorerOptions::default().with_matrix("inf", inf),
    ));
    assert!(e.contains("inf at row 1, column 2"), "{e}");
    // 1e12 · 10^4 is beyond the integers a JS number holds exactly.
    let big = Tensor::from_vec(
        (0..20)
            .map(|i| if i == 19 { 1e12f64 } else { 0.0 })
            .collect::<Vec<_>>(),
        (4, 5),
        &Device::Cpu,
    )?;
    let e = err_of(attention_explorer(
        &w,
        &q,
        &k,
        &ExplorerOptions::default().with_matrix("big", big),
    ));
    assert!(
        e.contains("value 1000000000000, too large to store with 4 decimals")
            && e.contains("row 3, column 4"),
        "{e}"
    );
    Ok(())
}

#[test]
fn the_data_round_trips_within_the_precision() -> Result<()> {
    // Cross-attention (L ≠ S): no rollout or flow; an extra matrix.
    let w = random_weights(2, &[2, 3, 4, 5])?;
    let extra = random_weights(3, &[4, 5])?;
    let (q, k) = (labels("q", 4), labels("k", 5));
    let opts = ExplorerOptions::default()
        .with_decimals(3)
        .with_title("cross")
        .with_matrix("mine", extra.clone());
    let html = attention_explorer(&w, &q, &k, &opts)?;
    let d = page_data(&html)?;
    assert_eq!(
        (
            &d["layers"],
            &d["heads"],
            &d["rows"],
            &d["cols"],
            &d["decimals"]
        ),
        (
            &Value::from(2),
            &Value::from(3),
            &Value::from(4),
            &Value::from(5),
            &Value::from(3)
        )
    );
    assert_eq!(strings(&d["query_labels"]), q);
    assert_eq!(strings(&d["key_labels"]), k);
    let close = |stored: &[i64], want: &[f64], scale: f64| {
        assert_eq!(stored.len(), want.len());
        for (s, w) in stored.iter().zip(want) {
            assert!(
                (*s as f64 / scale - w).abs() <= 0.5 / scale + 1e-12,
                "{s} vs {w}"
            );
        }
    };
    close(&ints(&d["weights"]), &values(&w)?, 1e3);
    let m = d["matrices"].as_array().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["name"], "mine");
    close(&ints(&m[0]["values"]), &values(&extra)?, 1e3);
    assert!(html.contains("<title>cross</title>"));
    assert!(html.contains("2 layers × 3 heads, 4 queries × 5 keys, values rounded to 3 decimals; "));

    // Self-attention: rollout and flow as the crate computes them (mean of heads, residual).
    let w = random_weights(4, &[3, 2, 6, 6])?;
    let t = labels("t", 6);
    let html = attention_explorer(&w, &t, &t, &ExplorerOptions::default())?;
    let d = page_data(&html)?;
    let layers: Vec<Tensor> = (0..3).map(|l| w.get(l)).collect::<Result<_, _>>()?;
    let m = d["matrices"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert!(m[0]["name"]
        .as_str()
        .unwrap()
        .starts_with("rollout over 3 layers"));
    assert!(m[1]["name"]
        .as_str()
        .unwrap()
        .starts_with("flow over 3 layers"));
    let rollout = attention_rollout(&layers, RolloutFusion::Mean, true, 0.0)?;
    let flow = attention_flow(&layers, RolloutFusion::Mean, true)?;
    // The f32 inputs make f32 results; 1e-6 covers their rounding.
    let close6 = |stored: &[i64], want: &[f64]| {
        for (s, w) in stored.iter().zip(want) {
            assert!((*s as f64 / 1e4 - w).abs() <= 0.5e-4 + 1e-6, "{s} vs {w}");
        }
    };
    close6(&ints(&m[0]["values"]), &values(&rollout)?);
    close6(&ints(&m[1]["values"]), &values(&flow)?);
    // Without them, and one layer: the summary says so.
    let html = attention_explorer(
        &w.get(0)?,
        &t,
        &t,
        &ExplorerOptions::default()
            .with_rollout(false)
            .with_flow(false),
    )?;
    assert_eq!(page_data(&html)?["matrices"], Value::Array(vec![]));
    assert!(
        html.contains("1 layer × 2 heads, 6 queries × 6 keys"),
        "{html}"
    );
    Ok(())
}

#[test]
fn file_size_is_proportional_to_the_weights() -> Result<()> {
    let size = |layers: usize, heads: usize, len: usize| -> Result<(usize, usize)> {
        let w = random_weights(5, &[layers, heads, len, len])?;
        let t = labels("t", len);
        let opts = ExplorerOptions::default()
            .with_rollout(false)
            .with_flow(false);
        Ok((w.elem_count(), attention_explorer(&w, &t, &t, &opts)?.len()))
    };
    let (n1, s1) = size(1, 2, 16)?;
    let (n2, s2) = size(2, 4, 32)?;
    let (n3, s3) = size(4, 4, 64)?;
    // Bytes per extra weight: a number of at most 5 characters and a comma.
    let b12 = (s2 - s1) as f64 / (n2 - n1) as f64;
    let b23 = (s3 - s2) as f64 / (n3 - n2) as f64;
    println!(
        "{n1} weights: {s1} bytes; {n2}: {s2}; {n3}: {s3}; {b12:.2} and {b23:.2} bytes/weight"
    );
    assert!(
        (1.5..=6.0).contains(&b12) && (1.5..=6.0).contains(&b23),
        "{b12} {b23}"
    );
    assert!((b12 / b23 - 1.0).abs() < 0.25, "{b12} {b23}");
    // Fewer decimals, a smaller file.
    let w = random_weights(5, &[4, 4, 64, 64])?;
    let t = labels("t", 64);
    let two = attention_explorer(&w, &t, &t, &ExplorerOptions::default().with_decimals(2))?;
    assert!(two.len() < s3 * 4 / 5, "{} vs {s3}", two.len());
    Ok(())
}

const NASTY: [&str; 4] = [
    "<script>alert(1)</script>",
    "\"quote'",
    "a&b",
    "<img src=x onerror=\"document.title='pwned'\">",
];

#[test]
fn labels_are_escaped_in_the_html() -> Result<()> {
    let w = random_weights(6, &[2, 4, 4])?;
    let q: Vec<String> = NASTY.iter().map(|s| s.to_string()).collect();
    let html = attention_explorer(
        &w,
        &q,
        &q,
        &ExplorerOptions::default().with_title("</title><script>alert(2)</script>"),
    )?;
    assert!(
        !html.contains("<script>alert("),
        "a label's script is in the HTML raw"
    );
    assert!(
        !html.contains("<img"),
        "a label's element is in the HTML raw"
    );
    // The page's own three scripts (data, colours, code) and no other.
    assert_eq!(html.matches("<script").count(), 3);
    assert!(html.contains("\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"));
    assert!(html.contains("a\\u0026b"));
    assert_eq!(strings(&page_data(&html)?["query_labels"]), q);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// In the browser.

/// The browser (None: not installed, test skipped) and the lock that keeps it alone.
fn browser() -> Result<Option<(std::sync::MutexGuard<'static, ()>, Browser)>> {
    let guard = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Browser::start()?.map(|b| (guard, b)))
}

fn state(b: &Browser) -> Result<Value> {
    b.eval("return window.mhaExplorer.state();")
}

fn canvas_attr(b: &Browser, name: &str) -> Result<String> {
    let v = b.eval(&format!(
        "return document.getElementById('hv-canvas').dataset.{name};"
    ))?;
    Ok(v.as_str().context("no such data attribute")?.to_string())
}

/// Picks `value` in the `<select>` `id` as a user would (a real click cannot drive the
/// native drop-down headless): set it, fire `change`.
fn choose(b: &Browser, id: &str, value: &str) -> Result<()> {
    b.eval(&format!(
        "const s = document.getElementById({id:?}); s.value = {value:?};
         if (s.value !== {value:?}) throw new Error('no option ' + {value:?});
         s.dispatchEvent(new Event('change')); return null;"
    ))?;
    Ok(())
}

/// Lines the head view should draw: stored weights (round(w·10^4)) of at least 0.01 in layer
/// `l`, over the `heads`, for queries `rows` and keys `cols`.
fn visible(
    w: &[f64],
    dims: [usize; 4],
    l: usize,
    heads: &[usize],
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> usize {
    let [_, nh, nr, nc] = dims;
    let mut n = 0;
    for &h in heads {
        for i in rows.clone() {
            for j in cols.clone() {
                if (w[((l * nh + h) * nr + i) * nc + j] * 1e4).round() >= 100.0 {
                    n += 1;
                }
            }
        }
    }
    n
}

/// Hovers cell (i, j) of the matrix view and returns (query, key, value) from the readout.
fn hover_cell(b: &Browser, i: usize, j: usize) -> Result<(String, String, f64)> {
    let cell = state(b)?["matrix"]["cell"].as_f64().context("no cell")?;
    b.hover_at(
        "#mx-canvas",
        (j as f64 + 0.5) * cell,
        (i as f64 + 0.5) * cell,
    )?;
    b.wait_for(
        &format!("document.getElementById('mx-r-pos').textContent === '({i}, {j})'"),
        Duration::from_secs(5),
    )?;
    let value = b.text("#mx-r-value")?;
    Ok((
        b.text("#mx-r-query")?,
        b.text("#mx-r-key")?,
        value.parse().with_context(|| format!("value {value:?}"))?,
    ))
}

/// The colour the matrix canvas shows at the centre of cell (i, j).
fn cell_colour(b: &Browser, i: usize, j: usize) -> Result<[u8; 3]> {
    let v = b.eval(&format!(
        "const c = document.getElementById('mx-canvas'); const s = Number(c.dataset.cell);
         const d = c.getContext('2d').getImageData(Math.floor(({j} + 0.5) * s),
                                                   Math.floor(({i} + 0.5) * s), 1, 1).data;
         return [d[0], d[1], d[2]];"
    ))?;
    let a: Vec<u8> = serde_json::from_value(v)?;
    Ok([a[0], a[1], a[2]])
}

/// Checks the shown matrix against `want` (the crate's values, `(L, S)` row-major) at a few
/// cells: the readout within `tol`, the colour against the PNG heatmap's colour map on the
/// scale of `stored` (the values the page holds) from its min to its max.
#[allow(clippy::too_many_arguments)]
fn check_matrix(
    b: &Browser,
    want: &[f64],
    stored: &[f64],
    cols: usize,
    cells: &[(usize, usize)],
    tol: f64,
    q: &[String],
    k: &[String],
) -> Result<()> {
    let lo = stored.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = stored.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let st = state(b)?;
    ensure!(
        st["matrix"]["vmin"].as_f64() == Some(lo) && st["matrix"]["vmax"].as_f64() == Some(hi),
        "scale {} {} vs {lo} {hi}",
        st["matrix"]["vmin"],
        st["matrix"]["vmax"]
    );
    let digits = st["matrix"]["digits"].as_u64().unwrap() as usize;
    ensure!(b.text("#mx-vmin")? == format!("{lo:.digits$}"));
    ensure!(b.text("#mx-vmax")? == format!("{hi:.digits$}"));
    for &(i, j) in cells {
        let (ql, kl, v) = hover_cell(b, i, j)?;
        ensure!(
            ql == q[i] && kl == k[j],
            "labels {ql:?} {kl:?} at ({i}, {j})"
        );
        let w = want[i * cols + j];
        ensure!((v - w).abs() <= tol, "cell ({i}, {j}): page {v}, crate {w}");
        let t = if hi > lo {
            (stored[i * cols + j] - lo) / (hi - lo)
        } else {
            0.5
        };
        let c = cell_colour(b, i, j)?;
        ensure!(
            c == colormap(t),
            "cell ({i}, {j}): colour {c:?}, heatmap {:?}",
            colormap(t)
        );
    }
    Ok(())
}

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
        attention_rollout(&layers, RolloutFusion::Mean, true, 0.0)?,
        attention_flow(&layers, RolloutFusion::Mean, true)?,
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
