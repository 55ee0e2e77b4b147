//! What the vocabulary-matrix page tests share: random matrices, the page's embedded data
//! decoded, the crate's values, and the browser's view of a page.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_mha::candle::{Device, Tensor};
use candle_mha_viz::html::{vocab_matrix_html, VocabHtmlOptions};
use candle_mha_viz::VocabMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::common::browser::Browser;

/// A matrix from `n` random sequences of `len` tokens (self-attention, causal rows of random
/// positive weights with some exact zeros, so counts differ from positions). `skew` > 1 makes
/// small ids more frequent (a Zipf-like vocabulary); ids stay below `used` ≤ `v`.
pub fn random_matrix(
    v: usize,
    used: usize,
    n: usize,
    len: usize,
    skew: f64,
    seed: u64,
) -> VocabMatrix {
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
pub fn labels(v: usize) -> Vec<String> {
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

pub fn ints(v: &serde_json::Value, key: &str) -> Vec<i64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The cells a page embeds: `(query, key) → (sum, count, mean, share)` in real units, plus
/// per query token `(row total, query positions)`.
pub type Cells = HashMap<(u32, u32), (f64, u64, f64, f64)>;

pub fn decode(data: &serde_json::Value) -> (Cells, HashMap<u32, (f64, u64)>) {
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

pub const DEC: u32 = 4;

/// A value as the page stores it: `round(v · 10^DEC)`.
pub fn scaled(v: f64) -> i64 {
    (v * 10f64.powi(DEC as i32)).round() as i64
}

/// Cell `(q, k)` in value mode `mode`, from the crate.
pub fn crate_value(vm: &VocabMatrix, mode: &str, q: u32, k: u32) -> f64 {
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
pub struct Expected {
    /// Query tokens (rows) and key tokens (columns), by id.
    pub queries: Vec<u32>,
    pub keys: Vec<u32>,
    /// Stored row totals.
    pub mass: HashMap<u32, i64>,
}

impl Expected {
    pub fn new(vm: &VocabMatrix) -> Self {
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
    pub fn by_mass(&self, ids: &[u32]) -> Vec<u32> {
        let mut v = ids.to_vec();
        v.sort_by_key(|t| (-self.mass.get(t).copied().unwrap_or(0), *t));
        v
    }

    /// The top `k` keys of query `q` by stored share (ties: smaller key id), keys passing `keep`.
    pub fn top_k(vm: &VocabMatrix, q: u32, k: usize, keep: impl Fn(u32) -> bool) -> Vec<u32> {
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

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn state(b: &Browser) -> Result<Value> {
    b.eval("return window.mhaVocab.state();")
}

/// The table rows in the DOM, in display order: `(query id, label, [key ids])`.
pub fn table_rows(b: &Browser) -> Result<Vec<(u32, String, Vec<u32>)>> {
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
pub fn cell_colours(b: &Browser) -> Result<Vec<[u8; 3]>> {
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
pub fn hover_cell(
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

pub fn write_page(vm: &VocabMatrix, labels: &[String]) -> Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vocab.html");
    let html = vocab_matrix_html(vm, labels, &VocabHtmlOptions::default().with_decimals(DEC))?;
    candle_mha::io::write_atomic(&path, html.as_bytes())?;
    Ok((dir, path))
}

/// Times `action` (JS statements) in the page: milliseconds from before it to after the page
/// re-rendered (the handlers render synchronously).
pub fn time_action(b: &Browser, action: &str) -> Result<f64> {
    let v = b.eval(&format!(
        "const t0 = performance.now(); {{ {action}; }} return performance.now() - t0;"
    ))?;
    v.as_f64().context("time")
}
