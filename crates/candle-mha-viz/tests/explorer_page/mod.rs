//! What the explorer page tests share: seeded weights, the page's data read back, and the
//! browser's view of a page.
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use candle_mha::candle::{DType, Device, Tensor};
use candle_mha_viz::colormap;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde_json::Value;

use crate::common::browser::Browser;

/// One browser at a time: the load-time measurement should not share the CPU with another
/// Chromium, and two cores are the norm here.
pub static BROWSER: Mutex<()> = Mutex::new(());

/// Softmax rows of seeded normal logits: `dims` = (…, L, S), f32.
pub fn random_weights(seed: u64, dims: &[usize]) -> Result<Tensor> {
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

pub fn labels(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

pub fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
}

pub fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

pub fn err_of(r: candle_mha::candle::Result<String>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

pub const NASTY: [&str; 4] = [
    "<script>alert(1)</script>",
    "\"quote'",
    "a&b",
    "<img src=x onerror=\"document.title='pwned'\">",
];

// ---------------------------------------------------------------------------------------------
// In the browser.

/// The browser (None: not installed, test skipped) and the lock that keeps it alone.
pub fn browser() -> Result<Option<(std::sync::MutexGuard<'static, ()>, Browser)>> {
    let guard = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Browser::start()?.map(|b| (guard, b)))
}

pub fn state(b: &Browser) -> Result<Value> {
    b.eval("return window.mhaExplorer.state();")
}

pub fn canvas_attr(b: &Browser, name: &str) -> Result<String> {
    let v = b.eval(&format!(
        "return document.getElementById('hv-canvas').dataset.{name};"
    ))?;
    Ok(v.as_str().context("no such data attribute")?.to_string())
}

/// Picks `value` in the `<select>` `id` as a user would (a real click cannot drive the
/// native drop-down headless): set it, fire `change`.
pub fn choose(b: &Browser, id: &str, value: &str) -> Result<()> {
    b.eval(&format!(
        "const s = document.getElementById({id:?}); s.value = {value:?};
         if (s.value !== {value:?}) throw new Error('no option ' + {value:?});
         s.dispatchEvent(new Event('change')); return null;"
    ))?;
    Ok(())
}

/// Lines the head view should draw: stored weights (round(w·10^4)) of at least 0.01 in layer
/// `l`, over the `heads`, for queries `rows` and keys `cols`.
pub fn visible(
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
pub fn hover_cell(b: &Browser, i: usize, j: usize) -> Result<(String, String, f64)> {
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
pub fn cell_colour(b: &Browser, i: usize, j: usize) -> Result<[u8; 3]> {
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
pub fn check_matrix(
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
