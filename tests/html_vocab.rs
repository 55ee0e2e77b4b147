//! The vocabulary-matrix page (`analysis::html::vocab_matrix_html`, `mha vocab-matrix --html`):
//! its errors, its embedded data against the crate's numbers, its size, and (when Chromium is
//! installed) what a browser shows and how fast.

mod common;

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_mha::analysis::html::{vocab_matrix_html, VocabHtmlOptions};
use candle_mha::analysis::VocabMatrix;
use candle_mha::candle::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

/// Labels `t0`, `t1`, … with a few hostile ones among the first tokens.
fn labels(v: usize) -> Vec<String> {
    (0..v)
        .map(|i| match i {
            1 => "<script>alert(1)</script>".to_string(),
            2 => "\"quote'".to_string(),
            3 => "a&b".to_string(),
            _ => format!("t{i}"),
        })
        .collect()
}

/// The JSON in the page's `#mha-data` element.
fn embedded_data(html: &str) -> Result<serde_json::Value> {
    let start_tag = "<script type=\"application/json\" id=\"mha-data\">";
    let start = html.find(start_tag).context("no #mha-data")? + start_tag.len();
    let end = start
        + html[start..]
            .find("</script>")
            .context("unclosed #mha-data")?;
    Ok(serde_json::from_str(&html[start..end])?)
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
        let data = embedded_data(&html)?;
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
    assert!(embedded_data(&html)?["labels"]
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
    let data = embedded_data(&html)?;
    assert_eq!(ints(&data, "rows"), Vec::<i64>::new());
    assert!(html.contains("0 nonzero cells"));
    Ok(())
}

/// Writes demo pages for looking at by hand (`cargo test --test html_vocab -- --ignored`).
#[test]
#[ignore]
fn write_demo_pages() -> Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/html-screenshots");
    std::fs::create_dir_all(&dir)?;
    let small = random_matrix(12, 11, 6, 8, 1.0, 5);
    std::fs::write(
        dir.join("vocab-small.html"),
        vocab_matrix_html(&small, &labels(12), &VocabHtmlOptions::default())?,
    )?;
    let large = random_matrix(5000, 5000, 160, 64, 2.5, 6);
    println!("large: {} cells", large.num_cells());
    std::fs::write(
        dir.join("vocab-large.html"),
        vocab_matrix_html(&large, &labels(5000), &VocabHtmlOptions::default())?,
    )?;
    Ok(())
}
