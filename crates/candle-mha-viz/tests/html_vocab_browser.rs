//! The vocabulary-matrix page in headless Chromium (when installed): what it shows against the
//! crate's numbers, and how fast a large one responds.

use candle_mha_test_support as common;
mod vocab_page;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_mha_viz::colormap;

use common::browser::{screenshot_dir, Browser};
use vocab_page::*;

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

/// On a 1280-pixel window the table does not fit beside the matrix: it goes below it, whole
/// (no column cut off), and a matrix whose cells are too small for labels has no empty label
/// band above it.
#[test]
fn a_narrower_window_keeps_the_table_whole() -> Result<()> {
    let Some(b) = Browser::start()? else {
        return Ok(());
    };
    b.set_window_size(1280, 1000)?;
    let vm = random_matrix(400, 400, 40, 16, 2.0, 3);
    let (_dir, path) = write_page(&vm, &labels(400))?;
    b.open(&path)?;
    let layout = b.eval(
        "const r = id => document.getElementById(id).getBoundingClientRect();
         const t = document.getElementById('vm-table');
         return { tableTop: r('vm-table-panel').top, matrixBottom: r('vm-matrix-panel').bottom,
                  overflow: t.scrollWidth - t.clientWidth, labels: r('vm-collabels').height,
                  canvasTop: r('vm-canvas').top, navBottom: r('vm-nav').bottom };",
    )?;
    let num = |k: &str| layout[k].as_f64().unwrap_or(f64::NAN);
    assert!(num("tableTop") >= num("matrixBottom"), "{layout}");
    assert!(num("overflow") <= 0.0, "{layout}");
    assert_eq!(num("labels"), 0.0, "{layout}");
    assert!(num("canvasTop") - num("navBottom") < 10.0, "{layout}");
    b.screenshot(&screenshot_dir().join("vocab_1280.png"))?;
    Ok(())
}
