//! The vocabulary-matrix page (`html::vocab_matrix_html`, `mha vocab-matrix --html`): its
//! errors, its embedded data against the crate's numbers, and its size. What a browser shows:
//! `html_vocab_browser.rs`.

use candle_mha_test_support as common;
mod vocab_page;

use anyhow::Result;
use candle_mha::candle::{Device, Tensor};
use candle_mha_viz::html::{vocab_matrix_html, VocabHtmlOptions};
use candle_mha_viz::VocabMatrix;

use common::browser::page_data;
use vocab_page::*;

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
