//! The vocabulary-matrix page (`analysis::html::vocab_matrix_html`, `mha vocab-matrix --html`):
//! its errors, its embedded data against the crate's numbers, its size, and (when Chromium is
//! installed) what a browser shows and how fast.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_mha::candle::{Device, Tensor};
use candle_mha_viz::html::{vocab_matrix_html, VocabHtmlOptions};
use candle_mha_viz::{colormap, VocabMatrix};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use common::browser::{page_data, screenshot_dir, Browser};

/// A matrix from `n` random sequences of `len` tokens (self-attention, causal rows of random
/// positive weights with some exact zeros, so counts differ from positions). `skew` > 1 makes
/// small ids more frequent (a Zipf-like vocabulary); ids stay below `used` ≤ `v`.
fn random_matrix(v: usize, used: usize, n: usize, len: usize, skew: f64, seed: u64) -> VocabMatrix {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids: Vec<u32> = (0..n * len)
        .map(|_| ((rng.random::<f64>().powf(skew) * used as f64) as u32).min(used as u32 - 1))
        .collect();
    let mut w = vec![0f32; n * len * len];
    for row in 0..n * len {
        let i = row % len;
        let r = &mut w[row * len..(row + 1) * len];
        for x in r.iter_mut().take(i + 1) {
            *x = if rng.random::<f64>() < 0.2 {
                0.0
            } else {
                rng.random::<f32>() + 0.01
            };
        }
        r[i] += 0.05; // a query always sees itself
        let total: f32 = r.iter().sum();
        r.iter_mut().for_each(|x| *x /= total);
    }
    let ids = Tensor::from_vec(ids, (n, len), &Device::Cpu).unwrap();
    let w = Tensor::from_vec(w, (n, len, len), &Device::Cpu).unwrap();
    let mut vm = VocabMatrix::new(v);
    vm.add(&ids, &ids, &w, None).unwrap();
    vm
}

/// Labels `t0`, `t1`, … with a few hostile or awkward ones among the first tokens.
fn labels(v: usize) -> Vec<String> {
    (0..v)
        .map(|i| match i {
            1 => "<script>alert(1)</script>".to_string(),
            2 => "\"quote'".to_string(),
            3 => "a&b".to_string(),
            4 => "two\nlines 🙂".to_string(),
            5 => " ".to_string(),
            _ => format!("t{i}"),
        })
        .collect()
}

fn ints(v: &serde_json::Value, key: &str) -> Vec<i64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The cells a page embeds: `(query, key) → (sum, count, mean, share)` in real units, plus
/// per query token `(row total, query positions)`.
type Cells = HashMap<(u32, u32), (f64, u64, f64, f64)>;

fn decode(data: &serde_json::Value) -> (Cells, HashMap<u32, (f64, u64)>) {
    let scale = 10f64.powi(data["decimals"].as_i64().unwrap() as i32);
    let (rows, row_len) = (ints(data, "rows"), ints(data, "row_len"));
    let (total, nq) = (ints(data, "row_total"), ints(data, "row_queries"));
    let (key, sum, count) = (ints(data, "key"), ints(data, "sum"), ints(data, "count"));
    let (mean, share) = (ints(data, "mean"), ints(data, "share"));
    let mut cells = Cells::new();
    let mut per_row = HashMap::new();
    let mut c = 0;
    for (r, &q) in rows.iter().enumerate() {
        per_row.insert(q as u32, (total[r] as f64 / scale, nq[r] as u64));
        let mut k = 0;
        for _ in 0..row_len[r] {
            k += key[c];
            cells.insert(
                (q as u32, k as u32),
                (
                    sum[c] as f64 / scale,
                    count[c] as u64,
                    mean[c] as f64 / scale,
                    share[c] as f64 / scale,
                ),
            );
            c += 1;
        }
    }
    assert_eq!(c, key.len(), "row_len does not add up to the cells");
    (cells, per_row)
}

#[test]
fn bad_input_is_an_error_naming_the_argument() -> Result<()> {
    let vm = random_matrix(12, 12, 2, 6, 1.0, 1);
    let l = labels(12);
    let err = vocab_matrix_html(&vm, &l[..11], &VocabHtmlOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("labels has 11 entries")
            && err.to_string().contains("vocab_size() = 12"),
        "{err}"
    );
    for d in [0, 7] {
        let err =
            vocab_matrix_html(&vm, &l, &VocabHtmlOptions::default().with_decimals(d)).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("opts.decimals = {d}; expected 1 to 6")),
            "{err}"
        );
    }
    let err = vocab_matrix_html(&vm, &l, &VocabHtmlOptions::default().with_top_k(0)).unwrap_err();
    assert!(err.to_string().contains("opts.top_k = 0"), "{err}");
    // The method delegates, errors included.
    assert!(vm.to_html(&l[..3], &VocabHtmlOptions::default()).is_err());
    assert_eq!(
        vm.to_html(&l, &VocabHtmlOptions::default())?,
        vocab_matrix_html(&vm, &l, &VocabHtmlOptions::default())?
    );
    Ok(())
}

/// `VocabMatrix::query_count` (the page's "queries" column): positions per query token,
/// skipped positions left out.
#[test]
fn query_count_counts_query_positions() -> Result<()> {
    let ids = Tensor::new(&[[0u32, 2, 2, 1], [2, 0, 3, 3]], &Device::Cpu)?;
    let w =
        Tensor::ones((2, 4, 4), candle_mha::candle::DType::F32, &Device::Cpu)?.affine(0.25, 0.0)?;
    let mask = Tensor::new(&[[0u8, 0, 0, 0], [0, 0, 0, 1]], &Device::Cpu)?;
    let mut vm = VocabMatrix::new(5);
    vm.add(&ids, &ids, &w, Some(&mask))?;
    let counts: Vec<u64> = (0..5).map(|q| vm.query_count(q)).collect();
    assert_eq!(counts, [2, 1, 3, 1, 0]);
    assert_eq!(counts.iter().sum::<u64>(), vm.num_queries());
    Ok(())
}

#[test]
fn embedded_data_round_trips_within_the_precision() -> Result<()> {
    for (decimals, seed) in [(4u32, 7u64), (2, 8), (6, 9)] {
        let vm = random_matrix(40, 30, 8, 12, 2.0, seed);
        let l = labels(40);
        let html = vocab_matrix_html(
            &vm,
            &l,
            &VocabHtmlOptions::default().with_decimals(decimals),
        )?;
        let data = page_data(&html)?;
        let tol = 0.5 * 10f64.powi(-(decimals as i32)) + 1e-12;
        assert_eq!(data["vocab_size"], 40);
        assert_eq!(data["decimals"], decimals);
        assert_eq!(data["num_queries"], vm.num_queries());
        let (cells, rows) = decode(&data);
        assert_eq!(cells.len(), vm.num_cells());
        for ((q, k), (sum, count)) in vm.cells() {
            let (s, c, mean, share) = cells[&(q, k)];
            assert!((s - sum).abs() <= tol, "sum ({q},{k}): {s} vs {sum}");
            assert_eq!(c, count, "count ({q},{k})");
            let m = sum / count as f64;
            assert!((mean - m).abs() <= tol, "mean ({q},{k}): {mean} vs {m}");
            let rs = vm.row_share(q, k);
            assert!(
                (share - rs).abs() <= tol,
                "share ({q},{k}): {share} vs {rs}"
            );
        }
        // Rows: every query token seen, with its total and query positions.
        let expected_rows: Vec<u32> = (0..40).filter(|&q| vm.query_count(q) > 0).collect();
        let mut got_rows: Vec<u32> = rows.keys().copied().collect();
        got_rows.sort();
        assert_eq!(got_rows, expected_rows);
        for (&q, &(total, nq)) in &rows {
            let expected: f64 = vm
                .cells()
                .iter()
                .filter(|c| c.0 .0 == q)
                .map(|c| c.1 .0)
                .sum();
            assert!((total - expected).abs() <= tol, "row total {q}");
            assert_eq!(nq, vm.query_count(q), "query positions of {q}");
        }
        // Labels: only the tokens seen, as text (the JSON escapes restore them exactly).
        let tokens = ints(&data, "tokens");
        assert!(
            tokens.iter().all(|&t| t < 30),
            "unused ids embedded: {tokens:?}"
        );
        for (i, &t) in tokens.iter().enumerate() {
            assert_eq!(data["labels"][i], l[t as usize].as_str());
        }
    }
    Ok(())
}

#[test]
fn labels_cannot_inject_markup() -> Result<()> {
    let vm = random_matrix(12, 12, 4, 8, 1.0, 3);
    let html = vocab_matrix_html(&vm, &labels(12), &VocabHtmlOptions::default())?;
    assert!(
        !html.contains("<script>alert"),
        "a label reached the markup"
    );
    assert!(!html.contains("a&b"), "a raw & in the file");
    assert_eq!(html.matches("<script").count(), 3, "data, colours, code");
    assert!(page_data(&html)?["labels"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l == "<script>alert(1)</script>"));
    // The title is escaped too.
    let html = vocab_matrix_html(
        &vm,
        &labels(12),
        &VocabHtmlOptions::default().with_title("<b>x</b> & y"),
    )?;
    assert!(html.contains("&lt;b&gt;x&lt;/b&gt; &amp; y") && !html.contains("<b>x"));
    Ok(())
}

#[test]
fn size_grows_with_the_cells_not_the_vocabulary() -> Result<()> {
    let l = labels(5000);
    let one = random_matrix(5000, 5000, 20, 32, 1.0, 11);
    let two = random_matrix(5000, 5000, 40, 32, 1.0, 11);
    let (a, b) = (
        vocab_matrix_html(&one, &l, &VocabHtmlOptions::default())?.len(),
        vocab_matrix_html(&two, &l, &VocabHtmlOptions::default())?.len(),
    );
    let cells = (one.num_cells(), two.num_cells());
    let ratio = b as f64 / a as f64;
    let cell_ratio = cells.1 as f64 / cells.0 as f64;
    println!(
        "V = 5000: {} cells → {a} bytes, {} cells → {b} bytes ({:.1} bytes per cell)",
        cells.0,
        cells.1,
        (b - a) as f64 / (cells.1 - cells.0) as f64
    );
    assert!(
        (ratio / cell_ratio - 1.0).abs() < 0.15,
        "size ratio {ratio:.2} for a cell ratio {cell_ratio:.2}"
    );
    // A 5000-token vocabulary with a handful of cells: the page's own weight, no V × V array.
    let few = random_matrix(5000, 5000, 1, 4, 1.0, 12);
    let size = vocab_matrix_html(&few, &l, &VocabHtmlOptions::default())?.len();
    println!("V = 5000, {} cells: {size} bytes", few.num_cells());
    assert!(size < 60_000, "{size} bytes for {} cells", few.num_cells());
    // Fewer decimals, smaller file; the summary states the size.
    let d2 = vocab_matrix_html(&two, &l, &VocabHtmlOptions::default().with_decimals(2))?;
    assert!(d2.len() < b, "{} vs {b}", d2.len());
    let summary = d2.split("id=\"mha-summary\">").nth(1).unwrap();
    let summary = &summary[..summary.find("</p>").unwrap()];
    assert!(
        summary.contains("5000 tokens")
            && summary.contains(&format!("{} nonzero cells", two.num_cells()))
            && summary.contains("values to 2 decimals")
            && summary.contains(" kB"),
        "{summary}"
    );
    Ok(())
}

#[test]
fn an_empty_matrix_gives_a_page() -> Result<()> {
    let vm = VocabMatrix::new(3);
    let html = vocab_matrix_html(&vm, &labels(3), &VocabHtmlOptions::default())?;
    let data = page_data(&html)?;
    assert_eq!(ints(&data, "rows"), Vec::<i64>::new());
    assert!(html.contains("0 nonzero cells"));
    Ok(())
}

// ---- In a browser ----

const DEC: u32 = 4;

/// A value as the page stores it: `round(v · 10^DEC)`.
fn scaled(v: f64) -> i64 {
    (v * 10f64.powi(DEC as i32)).round() as i64
}

/// Cell `(q, k)` in value mode `mode`, from the crate.
fn crate_value(vm: &VocabMatrix, mode: &str, q: u32, k: u32) -> f64 {
    let (sum, count) = vm.cell(q, k);
    match mode {
        "share" => vm.row_share(q, k),
        "mean" if count > 0 => sum / count as f64,
        "mean" => 0.0,
        "sum" => sum,
        "count" => count as f64,
        m => panic!("mode {m}"),
    }
}

/// What the crate says the page should list, for checking it.
struct Expected {
    /// Query tokens (rows) and key tokens (columns), by id.
    queries: Vec<u32>,
    keys: Vec<u32>,
    /// Stored row totals.
    mass: HashMap<u32, i64>,
}

impl Expected {
    fn new(vm: &VocabMatrix) -> Self {
        let mut totals: HashMap<u32, f64> = HashMap::new();
        let mut keys = std::collections::BTreeSet::new();
        for ((q, k), (sum, _)) in vm.cells() {
            *totals.entry(q).or_default() += sum;
            keys.insert(k);
        }
        let queries: Vec<u32> = (0..vm.vocab_size() as u32)
            .filter(|&q| vm.query_count(q) > 0)
            .collect();
        let mass = queries
            .iter()
            .map(|&q| (q, scaled(totals.get(&q).copied().unwrap_or(0.0))))
            .collect();
        Self {
            queries,
            keys: keys.into_iter().collect(),
            mass,
        }
    }

    /// `ids` in the page's "mass" order: stored row total, largest first, ties by id.
    fn by_mass(&self, ids: &[u32]) -> Vec<u32> {
        let mut v = ids.to_vec();
        v.sort_by_key(|t| (-self.mass.get(t).copied().unwrap_or(0), *t));
        v
    }

    /// The top `k` keys of query `q` by stored share (ties: smaller key id), keys passing `keep`.
    fn top_k(vm: &VocabMatrix, q: u32, k: usize, keep: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut row: Vec<(i64, u32)> = vm
            .cells()
            .into_iter()
            .filter(|c| c.0 .0 == q && keep(c.0 .1))
            .map(|c| (-scaled(vm.row_share(q, c.0 .1)), c.0 .1))
            .collect();
        row.sort();
        row.into_iter().take(k).map(|(_, key)| key).collect()
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn state(b: &Browser) -> Result<Value> {
    b.eval("return window.mhaVocab.state();")
}

/// The table rows in the DOM, in display order: `(query id, label, [key ids])`.
fn table_rows(b: &Browser) -> Result<Vec<(u32, String, Vec<u32>)>> {
    let v = b.eval(
        "return [...document.querySelectorAll('#vm-table .vm-row')]
           .sort((a, b) => a.dataset.index - b.dataset.index)
           .map(r => [Number(r.dataset.q), r.querySelector('.vm-q').textContent,
                      [...r.querySelectorAll('.vm-key')].map(k => Number(k.dataset.k))]);",
    )?;
    Ok(v.as_array()
        .context("rows")?
        .iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap() as u32,
                r[1].as_str().unwrap().to_string(),
                ids(&r[2]),
            )
        })
        .collect())
}

/// The colour at the centre of every shown cell, row by row.
fn cell_colours(b: &Browser) -> Result<Vec<[u8; 3]>> {
    let v = b.eval(
        "const c = document.getElementById('vm-canvas'), s = window.mhaVocab.state();
         const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, out = [];
         for (let i = 0; i < s.shownRows; i++) for (let j = 0; j < s.shownCols; j++) {
           const x = Math.floor(j * s.cell + s.cell / 2), y = Math.floor(i * s.cell + s.cell / 2);
           const p = (y * c.width + x) * 4; out.push([px[p], px[p + 1], px[p + 2]]);
         }
         return out;",
    )?;
    Ok(v.as_array()
        .context("colours")?
        .iter()
        .map(|c| {
            [
                c[0].as_u64().unwrap() as u8,
                c[1].as_u64().unwrap() as u8,
                c[2].as_u64().unwrap() as u8,
            ]
        })
        .collect())
}

/// Hovers window cell `(i, j)` and returns the readout: (query id, key id, query label, key
/// label, value text).
fn hover_cell(
    b: &Browser,
    i: usize,
    j: usize,
    cell: f64,
) -> Result<(u32, u32, String, String, String)> {
    b.hover_at(
        "#vm-canvas",
        j as f64 * cell + cell / 2.0,
        i as f64 * cell + cell / 2.0,
    )?;
    let v = b.eval(
        "const r = document.getElementById('vm-readout');
         return [Number(r.dataset.q), Number(r.dataset.k),
                 document.getElementById('vm-readout-query').textContent,
                 document.getElementById('vm-readout-key').textContent,
                 document.getElementById('vm-readout-value').dataset.value];",
    )?;
    Ok((
        v[0].as_u64().context("no hovered query")? as u32,
        v[1].as_u64().context("no hovered key")? as u32,
        v[2].as_str().unwrap().to_string(),
        v[3].as_str().unwrap().to_string(),
        v[4].as_str().unwrap().to_string(),
    ))
}

fn write_page(vm: &VocabMatrix, labels: &[String]) -> Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vocab.html");
    let html = vocab_matrix_html(vm, labels, &VocabHtmlOptions::default().with_decimals(DEC))?;
    candle_mha_train::io::write_atomic(&path, html.as_bytes())?;
    Ok((dir, path))
}

#[test]
fn small_page_shows_the_crate_numbers() -> Result<()> {
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    // Token 11 never occurs: neither a row nor a column.
    let vm = random_matrix(12, 11, 6, 8, 1.0, 5);
    let l = labels(12);
    let e = Expected::new(&vm);
    let (_dir, path) = write_page(&vm, &l)?;
    b.open(&path)?;

    // Counts: every query token is a row, every key token a column; all fit.
    let s = state(&b)?;
    assert_eq!(s["mode"], "share");
    assert_eq!(s["sort"], "mass");
    assert_eq!(ids(&s["rows"]), e.by_mass(&e.queries));
    assert_eq!(ids(&s["cols"]), e.by_mass(&e.keys));
    let canvas = b.eval(
        "const d = document.getElementById('vm-canvas').dataset; return [Number(d.rows), Number(d.cols)];",
    )?;
    assert_eq!(canvas, serde_json::json!([e.queries.len(), e.keys.len()]));
    let rows = table_rows(&b)?;
    assert_eq!(rows.len(), e.queries.len());
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        e.by_mass(&e.queries),
        "table order"
    );
    // Labels are text, hostile ones included, and nothing ran.
    for (q, label, keys) in &rows {
        assert_eq!(label, &l[*q as usize]);
        assert_eq!(keys, &Expected::top_k(&vm, *q, 5, |_| true), "top 5 of {q}");
    }
    assert!(rows.iter().any(|r| r.1 == "<script>alert(1)</script>"));
    assert!(rows.iter().any(|r| r.1 == "\"quote'"));
    assert!(rows.iter().any(|r| r.1 == "a&b"));
    assert_eq!(b.count("script")?, 3);
    // The values shown in the table: stored shares.
    let first_values = b.eval(
        "return [...document.querySelector('#vm-table .vm-row[data-index=\"0\"]').querySelectorAll('.vm-kv')].map(e => e.textContent);",
    )?;
    let q0 = rows[0].0;
    let expected: Vec<String> = rows[0]
        .2
        .iter()
        .map(|&k| format!("{:.4}", scaled(vm.row_share(q0, k)) as f64 / 1e4))
        .collect();
    assert_eq!(first_values, serde_json::json!(expected));

    // Offline: nothing fetched.
    assert_eq!(
        b.eval("return performance.getEntriesByType('resource').length;")?,
        0
    );
    b.screenshot(&screenshot_dir().join("vocab-small.png"))?;

    // Hover every cell: the readout names the cell and shows the crate's share; the pixel
    // colour is the PNG colour map of the stored value between the window's min and max.
    let cell = s["cell"].as_f64().unwrap();
    let (qs, ks) = (ids(&s["rows"]), ids(&s["cols"]));
    let colours = cell_colours(&b)?;
    let stored: Vec<f64> = qs
        .iter()
        .flat_map(|&q| ks.iter().map(move |&k| (q, k)))
        .map(|(q, k)| scaled(vm.row_share(q, k)) as f64 / 1e4)
        .collect();
    let lo = stored.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = stored.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(s["lo"].as_f64(), Some(lo));
    assert_eq!(s["hi"].as_f64(), Some(hi));
    assert_eq!(colours.len(), stored.len());
    for (n, (&v, &c)) in stored.iter().zip(&colours).enumerate() {
        assert_eq!(c, colormap((v - lo) / (hi - lo)), "cell {n}: value {v}");
    }
    // The √ scale: the same range, colour of √t.
    b.click("#vm-scale-sqrt")?;
    assert_eq!(state(&b)?["scale"], "sqrt");
    for (n, (&v, &c)) in stored.iter().zip(&cell_colours(&b)?).enumerate() {
        assert_eq!(
            c,
            colormap(((v - lo) / (hi - lo)).sqrt()),
            "√ cell {n}: value {v}"
        );
    }
    b.click("#vm-scale-linear")?;
    assert_eq!(cell_colours(&b)?, colours);
    for (i, &q) in qs.iter().enumerate() {
        for (j, &k) in ks.iter().enumerate() {
            let (hq, hk, ql, kl, value) = hover_cell(&b, i, j, cell)?;
            assert_eq!((hq, hk), (q, k), "hovered ({i}, {j})");
            assert_eq!(
                (ql.as_str(), kl.as_str()),
                (l[q as usize].as_str(), l[k as usize].as_str())
            );
            let shown: f64 = value.parse()?;
            let want = vm.row_share(q, k);
            assert!(
                (shown - want).abs() <= 0.5e-4 + 1e-12,
                "({q}, {k}): shows {value}, share {want}"
            );
        }
    }
    // The other values, on a few cells each: the buttons switch what the page shows.
    for mode in ["mean", "sum", "count"] {
        b.click(&format!("#vm-mode-{mode}"))?;
        assert_eq!(state(&b)?["mode"], mode);
        for (i, j) in [(0, 0), (1, 2), (qs.len() - 1, ks.len() - 1), (2, 0)] {
            let (q, k, _, _, value) = hover_cell(&b, i, j, cell)?;
            let shown: f64 = value.parse()?;
            let want = crate_value(&vm, mode, q, k);
            assert!(
                (shown - want).abs() <= 0.5e-4 + 1e-12,
                "{mode} ({q}, {k}): shows {value}, crate {want}"
            );
        }
    }
    b.click("#vm-mode-share")?;

    // k: two more keys per row.
    b.click("#vm-k-inc")?;
    b.click("#vm-k-inc")?;
    assert_eq!(state(&b)?["k"], 7);
    for (q, _, keys) in table_rows(&b)? {
        assert_eq!(keys, Expected::top_k(&vm, q, 7, |_| true), "top 7 of {q}");
    }
    b.click("#vm-k-dec")?;
    assert!(table_rows(&b)?.iter().all(|r| r.2.len() <= 6));

    // Sort by label: rows and columns reorder.
    b.click("#vm-sort-label")?;
    let by_label = |ids: &[u32]| {
        let mut v = ids.to_vec();
        v.sort_by(|a, b| l[*a as usize].cmp(&l[*b as usize]).then(a.cmp(b)));
        v
    };
    let s = state(&b)?;
    assert_eq!(ids(&s["rows"]), by_label(&e.queries));
    assert_eq!(ids(&s["cols"]), by_label(&e.keys));
    assert_eq!(
        table_rows(&b)?.iter().map(|r| r.0).collect::<Vec<_>>(),
        by_label(&e.queries)
    );
    b.click("#vm-sort-id")?;
    assert_eq!(ids(&state(&b)?["rows"]), e.queries);

    // Filter query tokens: exactly the labels containing the text, in the canvas too.
    b.type_into("#vm-filter", "t1")?;
    let want: Vec<u32> = e
        .queries
        .iter()
        .copied()
        .filter(|&q| l[q as usize].contains("t1"))
        .collect();
    assert!(!want.is_empty() && want.len() < e.queries.len());
    assert_eq!(ids(&state(&b)?["rows"]), want);
    assert_eq!(
        table_rows(&b)?.iter().map(|r| r.0).collect::<Vec<_>>(),
        want
    );
    assert_eq!(
        b.eval("return Number(document.getElementById('vm-canvas').dataset.rows);")?,
        want.len()
    );
    b.type_into("#vm-filter", "&")?;
    assert_eq!(ids(&state(&b)?["rows"]), vec![3]);
    b.type_into("#vm-filter", "")?;
    b.eval("const f = document.getElementById('vm-filter'); f.dispatchEvent(new Event('input')); return 0;")?;
    assert_eq!(ids(&state(&b)?["rows"]), e.queries);
    // Filter key tokens: columns and the keys listed.
    b.type_into("#vm-key-filter", "t")?;
    let keep = |k: u32| l[k as usize].contains('t');
    let want: Vec<u32> = e.keys.iter().copied().filter(|&k| keep(k)).collect();
    assert_eq!(ids(&state(&b)?["cols"]), want);
    for (q, _, keys) in table_rows(&b)? {
        assert_eq!(
            keys,
            Expected::top_k(&vm, q, 6, keep),
            "filtered keys of {q}"
        );
    }

    // Clicking a table row marks that token.
    b.click("#vm-table .vm-row[data-index=\"2\"]")?;
    let s = state(&b)?;
    assert_eq!(s["selected"], ids(&s["rows"])[2]);
    assert_eq!(b.count("#vm-table .vm-row.sel")?, 1);
    b.screenshot(&screenshot_dir().join("vocab-small-filtered.png"))?;
    assert_eq!(b.js_errors()?, Vec::<String>::new());
    // Still nothing fetched after all that (a late load would show here).
    assert_eq!(
        b.eval("return performance.getEntriesByType('resource').map(r => r.name);")?,
        serde_json::json!([])
    );
    Ok(())
}

/// Times `action` (JS statements) in the page: milliseconds from before it to after the page
/// re-rendered (the handlers render synchronously).
fn time_action(b: &Browser, action: &str) -> Result<f64> {
    let v = b.eval(&format!(
        "const t0 = performance.now(); {{ {action}; }} return performance.now() - t0;"
    ))?;
    v.as_f64().context("time")
}

#[test]
fn large_vocabulary_stays_responsive() -> Result<()> {
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    let vm = random_matrix(5000, 5000, 160, 64, 2.5, 6);
    let l = labels(5000);
    let e = Expected::new(&vm);
    let (_dir, path) = write_page(&vm, &l)?;
    let size = std::fs::metadata(&path)?.len();
    let t = Instant::now();
    b.open(&path)?;
    let load = t.elapsed();
    let timings = b.eval("return window.mhaVocab.timings();")?;
    println!(
        "V = 5000, {} cells, {} query tokens: {:.2} MB, opened in {:.0} ms (JSON parse {:.0} ms, first render {:.0} ms)",
        vm.num_cells(),
        e.queries.len(),
        size as f64 / 1e6,
        load.as_secs_f64() * 1e3,
        timings["parse"].as_f64().unwrap_or(-1.0),
        timings["firstRender"].as_f64().unwrap_or(-1.0),
    );
    assert!(vm.num_cells() > 150_000, "{} cells", vm.num_cells());

    // A window of the matrix, a few table rows in the DOM.
    let s = state(&b)?;
    assert_eq!(ids(&s["rows"]), e.by_mass(&e.queries));
    assert_eq!(
        (s["shownRows"].as_u64(), s["shownCols"].as_u64()),
        (Some(560), Some(560))
    );
    assert_eq!(s["cell"], 1);
    // The table's cells never run into each other, and its numbers show whole: the id, mass
    // and query count of every row drawn fit their columns (masses of whole numbers without
    // decimals: 214170, not 214170.0000).
    let layout = b.eval(
        "const bad = [];
         for (const row of document.querySelectorAll('#vm-table .vm-row')) {
           const cells = [...row.children];
           for (let i = 0; i + 1 < cells.length; i++) {
             if (cells[i].getBoundingClientRect().right > cells[i + 1].getBoundingClientRect().left + 0.5)
               bad.push('overlap ' + row.dataset.q + ' ' + cells[i].className);
           }
           for (const c of row.querySelectorAll('.vm-id, .vm-mass, .vm-nq'))
             if (c.scrollWidth > c.clientWidth + 1) bad.push('cut ' + row.dataset.q + ' ' + c.className + ' ' + c.textContent);
           const mass = row.querySelector('.vm-mass').textContent;
           if (/\\.0+$/.test(mass)) bad.push('decimals ' + mass);
         }
         return bad;",
    )?;
    assert_eq!(layout, serde_json::json!([]), "table layout");
    let dom_rows = b.count("#vm-table .vm-row")?;
    assert!((20..=60).contains(&dom_rows), "{dom_rows} rows in the DOM");
    assert_eq!(
        b.eval("return Number(document.getElementById('vm-table').dataset.total);")?,
        e.queries.len()
    );
    assert_eq!(
        b.eval("return performance.getEntriesByType('resource').length;")?,
        0
    );
    b.screenshot(&screenshot_dir().join("vocab-large.png"))?;

    let set = |id: &str, v: &str| {
        format!(
            "const f = document.getElementById('{id}'); f.value = {}; f.dispatchEvent(new Event('input'))",
            serde_json::json!(v)
        )
    };
    let hover = "const c = document.getElementById('vm-canvas'), r = c.getBoundingClientRect();
                 c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + 200.5, clientY: r.top + 100.5, bubbles: true}))";
    let mut times = Vec::new();
    for (name, action) in [
        (
            "sort by label",
            "document.getElementById('vm-sort-label').click()".to_string(),
        ),
        (
            "sort by mass",
            "document.getElementById('vm-sort-mass').click()".to_string(),
        ),
        (
            "sort by queries",
            "document.getElementById('vm-sort-count').click()".to_string(),
        ),
        ("filter query tokens 't12'", set("vm-filter", "t12")),
        ("clear the filter", set("vm-filter", "")),
        ("filter key tokens 't3'", set("vm-key-filter", "t3")),
        ("clear the key filter", set("vm-key-filter", "")),
        (
            "value: mean",
            "document.getElementById('vm-mode-mean').click()".to_string(),
        ),
        (
            "value: share",
            "document.getElementById('vm-mode-share').click()".to_string(),
        ),
        (
            "k + 1",
            "document.getElementById('vm-k-inc').click()".to_string(),
        ),
        ("hover a cell", hover.to_string()),
    ] {
        let ms = time_action(&b, &action)?;
        println!("  {name}: {ms:.1} ms");
        times.push((name, ms));
    }
    // The table draws on the next frame after a scroll: the page times that itself.
    b.eval("document.getElementById('vm-table').scrollTop = 26000; return 0;")?;
    b.wait_for(
        "document.querySelector('#vm-table .vm-row[data-index=\"1000\"]')",
        Duration::from_secs(5),
    )?;
    let ms = b
        .eval("return window.mhaVocab.timings().tableScroll;")?
        .as_f64()
        .context("tableScroll")?;
    println!("  scroll the table to row 1000: {ms:.1} ms");
    // The rows drawn after the scroll are those of the order at that place.
    let order = ids(&state(&b)?["rows"]);
    let drawn = table_rows(&b)?;
    assert!(drawn.len() <= 60, "{} rows in the DOM", drawn.len());
    let first =
        b.eval("return Number(document.querySelector('#vm-table .vm-row').dataset.index);")?;
    let first = first.as_u64().context("index")? as usize;
    assert!((990..=1001).contains(&first), "first row drawn: {first}");
    for (n, (q, label, _)) in drawn.iter().enumerate() {
        assert_eq!(*q, order[first + n]);
        assert_eq!(label, &l[*q as usize]);
    }
    times.push(("scroll the table", ms));
    // The times are printed, not asserted: they measure the machine as much as the page.
    for (name, ms) in &times {
        assert!(ms.is_finite() && *ms >= 0.0, "{name}: {ms} ms");
    }
    assert!(b.js_errors()?.is_empty());

    // Real typing filters to exactly the matching rows, canvas included.
    b.eval("document.getElementById('vm-sort-mass').click(); return 0;")?;
    b.type_into("#vm-filter", "t12")?;
    let want: Vec<u32> = e.by_mass(
        &e.queries
            .iter()
            .copied()
            .filter(|&q| l[q as usize].contains("t12"))
            .collect::<Vec<_>>(),
    );
    assert_eq!(ids(&state(&b)?["rows"]), want);
    assert_eq!(
        b.eval("return Number(document.getElementById('vm-canvas').dataset.rows);")?,
        want.len().min(560)
    );
    // Sorting by label at this size: the order the crate's labels give.
    b.click("#vm-sort-label")?;
    let mut by_label = want.clone();
    by_label.sort_by(|a, b| l[*a as usize].cmp(&l[*b as usize]).then(a.cmp(b)));
    assert_eq!(ids(&state(&b)?["rows"]), by_label);
    b.click("#vm-sort-mass")?;
    b.type_into("#vm-filter", "")?;
    b.eval(&format!("{}; return 0;", set("vm-filter", "")))?;

    // Zoom in until labels show; hover a few cells and check their values and colours.
    for _ in 0..9 {
        b.click("#vm-zoom-in")?;
    }
    let s = state(&b)?;
    let cell = s["cell"].as_f64().unwrap();
    assert_eq!(cell, 16.0);
    let n = (560.0 / cell) as usize;
    assert_eq!(s["shownRows"].as_u64(), Some(n as u64));
    let (qs, ks) = (ids(&s["rows"]), ids(&s["cols"]));
    let colours = cell_colours(&b)?;
    let (lo, hi) = (s["lo"].as_f64().unwrap(), s["hi"].as_f64().unwrap());
    let mut window_max = 0f64;
    for &q in &qs[..n] {
        for &k in &ks[..n] {
            window_max = window_max.max(scaled(vm.row_share(q, k)) as f64 / 1e4);
        }
    }
    assert_eq!((lo, hi), (0.0, window_max));
    for (i, j) in [(0, 0), (1, 1), (0, 1), (3, 7), (n - 1, n - 1), (5, 0)] {
        let (q, k, _, _, value) = hover_cell(&b, i, j, cell)?;
        assert_eq!((q, k), (qs[i], ks[j]));
        let want = vm.row_share(q, k);
        let shown: f64 = value.parse()?;
        assert!(
            (shown - want).abs() <= 0.5e-4 + 1e-12,
            "({q}, {k}): {value} vs {want}"
        );
        let v = scaled(want) as f64 / 1e4;
        assert_eq!(
            colours[i * n + j],
            colormap((v - lo) / (hi - lo)),
            "colour of ({q}, {k})"
        );
    }
    // The wheel scrolls the window: 100 px over 16-px cells is 6 rows (shift: columns).
    b.eval(
        "const c = document.getElementById('vm-canvas'), r = c.getBoundingClientRect();
         c.dispatchEvent(new WheelEvent('wheel', {deltaY: 100, clientX: r.left + 5, clientY: r.top + 5, cancelable: true}));
         c.dispatchEvent(new WheelEvent('wheel', {deltaY: 100, shiftKey: true, clientX: r.left + 5, clientY: r.top + 5, cancelable: true}));
         return 0;",
    )?;
    let s = state(&b)?;
    assert_eq!((s["row0"].as_u64(), s["col0"].as_u64()), (Some(6), Some(6)));
    let (hq, hk, _, _, _) = hover_cell(&b, 0, 0, cell)?;
    assert_eq!((hq, hk), (qs[6], ks[6]));
    // Clicking a cell marks its query token and brings its table row into view.
    b.click_at("#vm-canvas", cell * 2.5, cell * 20.5)?;
    let s = state(&b)?;
    assert_eq!(s["selected"], qs[26]);
    assert_eq!(
        b.eval("const r = document.querySelector('#vm-table .vm-row.sel'); return r ? Number(r.dataset.q) : null;")?,
        qs[26]
    );
    b.eval("document.getElementById('vm-table').scrollTop = 0; return 0;")?;
    b.wait_for(
        "document.querySelector('#vm-table .vm-row[data-index=\"3\"]')",
        Duration::from_secs(5),
    )?;
    b.click("#vm-table .vm-row[data-index=\"3\"]")?;
    assert_eq!(state(&b)?["selected"], qs[3]);
    b.screenshot(&screenshot_dir().join("vocab-large-zoomed.png"))?;
    assert!(b.js_errors()?.is_empty());
    Ok(())
}
