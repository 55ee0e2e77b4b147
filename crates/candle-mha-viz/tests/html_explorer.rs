//! The attention explorer page (`html::attention_explorer`, `mha inspect --html`) without a
//! browser: its errors, its data, its size and escaping. In headless Chromium:
//! `html_explorer_browser.rs`.

use candle_mha_test_support as common;
mod explorer_page;

use anyhow::Result;
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha_viz::html::{attention_explorer, ExplorerOptions};
use candle_mha_viz::{attention_flow, attention_rollout, HeadFusion};
use common::browser::page_data;
use explorer_page::*;
use serde_json::Value;

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
    let rollout = attention_rollout(&layers, HeadFusion::Mean, true, 0.0)?;
    let flow = attention_flow(&layers, HeadFusion::Mean, true)?;
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
