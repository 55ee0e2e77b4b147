//! The vocabulary × vocabulary matrix page: a [`VocabMatrix`] as one self-contained HTML file
//! (`mha vocab-matrix --html`), browsable at a vocabulary of thousands of tokens.
//!
//! # What the page shows
//! - A value selector: **share** (the query token's share of attention, `sum / row total`, as
//!   [`VocabMatrix::row_share`]; the default), **mean** (`sum / count`, the mean weight when the
//!   key token is in view, as [`VocabMatrix::mean`]), **sum** and **count** (as
//!   [`VocabMatrix::cell`]).
//! - A canvas matrix, rows = query tokens, columns = key tokens, of one window of the current
//!   order: at most 560 / cell-size rows and columns, scrolled with the wheel (shift: columns)
//!   or the "rows from"/"columns from" boxes, zoomed by cell size (1 to 48 px; the initial size
//!   is the largest that fits every row and column, 1 px when none fits). Colours are viridis
//!   (the PNG heatmaps' exact table) from the minimum to the maximum of the shown values,
//!   never-seen cells counting as 0 (as in the dense exports); a flat range is drawn at the
//!   middle colour. The "√" button maps `√t` instead of `t` to the colours, which spreads the
//!   many small values of a corpus matrix (linear is the default). Labels are drawn beside the
//!   rows and above the columns when cells are at least 10 px. Hovering a cell shows its query
//!   and key tokens and its values.
//! - A table of query tokens (virtualised: only the rows in view are in the DOM) with their
//!   mass (row total), query positions and top-k key tokens by the current value (ties: smaller
//!   key id). `k` starts at [`VocabHtmlOptions::top_k`] and the page can raise it without limit:
//!   every cell is stored.
//! - Sorting (mass and queries: largest first; label: by UTF-16 code units; id; ties always by
//!   id) orders rows and columns alike, so the diagonal of a self-attention matrix stays the
//!   diagonal. Filters: "query token contains" keeps the query tokens whose label contains the
//!   text (case-sensitive), "key token contains" the key tokens (columns and table keys).
//!   Clicking a table row or a cell marks that token's row and column in the matrix.
//! - Rows are the tokens seen as queries, columns the tokens seen as keys (in some cell).
//!   Orders and top-k lists compare the stored values (rounded to `decimals`).
//!
//! # DOM contract (stable, for tests and scripts)
//! - `#vm-canvas`: the matrix window, exactly as large as the window (at most 560 × 560, at
//!   least 24 × 24; canvas pixels = CSS pixels): window cell `(i, j)` covers
//!   `x ∈ [j·cell, (j+1)·cell)`, `y ∈ [i·cell, (i+1)·cell)`. `data-rows`/`data-cols`: the rows
//!   and columns shown; `data-cell`, `data-row0`, `data-col0` (0-based start of the window in
//!   the current order), `data-total-rows`, `data-total-cols`.
//! - `#vm-readout` (`data-q`, `data-k`: the hovered ids) with `#vm-readout-query`,
//!   `#vm-readout-key` (labels), `#vm-readout-value` (`"MODE VALUE"`; `data-value`: the value
//!   alone, `decimals` digits after the point, an integer for count) and `#vm-readout-all`.
//! - `#vm-cbar-lo`, `#vm-cbar-hi`: the colour range.
//! - Buttons `#vm-mode-{share,mean,sum,count}`, `#vm-sort-{mass,count,label,id}` and
//!   `#vm-scale-{linear,sqrt}` (the current ones have class `active`); inputs `#vm-filter`,
//!   `#vm-key-filter`, `#vm-k` with buttons `#vm-k-dec`/`#vm-k-inc`;
//!   `#vm-zoom-in`/`#vm-zoom-out`; `#vm-row0`/`#vm-col0` (1-based).
//! - `#vm-table` (scrolling; `data-total`: matching query tokens) holds `.vm-row` elements
//!   (`data-q`: the id, `data-index`: the position in the order) with `.vm-q` (label), `.vm-id`,
//!   `.vm-mass`, `.vm-nq` and `.vm-key` chips (`data-k`) of `.vm-kl` (label) and `.vm-kv`
//!   (value).
//! - `window.mhaVocab.state()`: `{mode, sort, scale, queryFilter, keyFilter, k, cell, row0,
//!   col0, shownRows, shownCols, rows, cols, lo, hi, selected, decimals, vocabSize, cells}`
//!   (`rows`, `cols`: the token ids in the current order after filtering; `selected`: the
//!   marked token or −1). `window.mhaVocab.timings()`: milliseconds of the JSON parse
//!   (`parse`), the first render (`firstRender`, from the script's start), the last action of
//!   each kind (`mode`, `sort`, `filter`, `k`, `zoom`, `scroll`) and the last table redraw
//!   after a scroll (`tableScroll`).
//! - `document.body.dataset.ready == "1"` once the first render is done.
//!
//! # Embedded data (`#mha-data`), sparse: its size grows with the nonzero cells
//! `{format: "mha-vocab-matrix-1", vocab_size, decimals, top_k, num_queries, total_mass,
//! tokens, labels, rows, row_len, row_total, row_queries, key, sum, count, mean, share}`:
//! `tokens` are the ids seen (as query or key), ascending, and `labels` their labels; `rows` the
//! query token ids ascending, each with `row_len` cells, its `row_total` (scaled) and
//! `row_queries` (query positions); then one entry per cell, by query then key id: `key` (the
//! key id minus the previous key id of the same row; the first of a row is the id itself),
//! `sum`, `mean`, `share` (scaled) and `count`. Scaled numbers are integers
//! `round(v · 10^decimals)`, so every value shown is within `0.5 · 10^-decimals` of the crate's.

use std::fmt::Write as _;

use super::page::{check_decimals, json_strings, push_scaled_ints, storable, Page};
use crate::VocabMatrix;

/// How the vocabulary-matrix page is built.
///
/// PyTorch equivalent: none (bertviz has no corpus-level vocabulary view).
#[derive(Clone, Debug)]
pub struct VocabHtmlOptions {
    /// Page title. Default `None`: "Vocabulary attention matrix".
    pub title: Option<String>,
    /// Decimals stored per value (1..=6). Default 4.
    pub decimals: u32,
    /// Key tokens listed per query token in the table at first; the page stores every cell,
    /// so the reader can raise it. Default 5.
    pub top_k: usize,
}

impl Default for VocabHtmlOptions {
    fn default() -> Self {
        Self {
            title: None,
            decimals: 4,
            top_k: 5,
        }
    }
}

candle_mha::setters! {
    VocabHtmlOptions {
        with_title(title: Some(impl Into<String>));
        with_decimals(decimals: u32);
        with_top_k(top_k: usize);
    }
}

/// The vocabulary × vocabulary matrix `vm` as one self-contained HTML page (see the module
/// documentation for what it shows, its DOM contract and its data); write it with
/// [`write_atomic`](candle_mha::io::write_atomic).
///
/// `labels` holds one label per token id (`vm.vocab_size()` entries); only the labels of
/// tokens seen in `vm` are embedded, and they are inserted as text, never as HTML.
///
/// # Shapes
/// `vm`: a sparse `(V, V)` matrix, row = query token, column = key token; `labels`: `V`
/// strings. The page holds `O(nonzero cells + tokens seen)` numbers, never a dense `V × V`
/// array (about 17–20 bytes per cell at 4 decimals).
///
/// # Errors
/// `labels.len() != vm.vocab_size()`, `opts.decimals` outside 1..=6, `opts.top_k == 0`, and
/// sums too large to store at `opts.decimals` (above 2^53 once scaled).
///
/// PyTorch equivalent: none (bertviz's `head_view`/`model_view` show one input, not a corpus;
/// the closest is plotting `VocabMatrix::row_normalized` with matplotlib's `imshow`).
pub fn vocab_matrix_html(
    vm: &VocabMatrix,
    labels: &[String],
    opts: &VocabHtmlOptions,
) -> candle::Result<String> {
    let v = vm.vocab_size();
    if labels.len() != v {
        candle::bail!(
            "vocab_matrix_html: labels has {} entries; expected one per token id, vm.vocab_size() = {v}",
            labels.len()
        )
    }
    check_decimals(opts.decimals)
        .map_err(|e| candle::Error::Msg(format!("vocab_matrix_html: opts.{e}")))?;
    if opts.top_k == 0 {
        candle::bail!("vocab_matrix_html: opts.top_k = 0; expected at least 1 key per query token")
    }
    // Every stored sum is at most the total mass (weights are non-negative).
    if !storable(vm.total_mass(), opts.decimals) {
        candle::bail!(
            "vocab_matrix_html: total mass {} at opts.decimals = {} exceeds 2^53 once scaled; \
             expected fewer decimals",
            vm.total_mass(),
            opts.decimals
        )
    }
    let data = Data::new(vm);
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "Vocabulary attention matrix".to_string());
    let summary = format!(
        "{v} tokens in the vocabulary ({} seen as queries) · {} nonzero cells · {} query positions \
         · values to {} decimals · {{size}}",
        data.rows.len(),
        data.num_cells(),
        vm.num_queries(),
        opts.decimals
    );
    let json = data.to_json(vm, labels, opts);
    Ok(Page {
        title: &title,
        summary: &summary,
        css: include_str!("vocab.css"),
        body: include_str!("vocab.html"),
        data_json: &json,
        js: include_str!("vocab.js"),
    }
    .render())
}

/// The matrix in CSR form: cells grouped by query token, each row sorted by key id.
struct Data {
    /// Query token ids (seen as queries or in a cell), ascending.
    rows: Vec<u32>,
    /// Per row: its cells `(key, sum, count)` by key id.
    cells: Vec<Vec<(u32, f64, u64)>>,
}

impl Data {
    fn new(vm: &VocabMatrix) -> Self {
        let mut rows: Vec<u32> = (0..vm.vocab_size() as u32)
            .filter(|&q| vm.query_count(q) > 0)
            .collect();
        let mut cells: Vec<Vec<(u32, f64, u64)>> = vec![Vec::new(); rows.len()];
        // `cells()` is sorted by query then key; a query with cells but no counted position
        // cannot come from `add`, but is kept rather than dropped.
        for ((q, k), (sum, count)) in vm.cells() {
            let r = match rows.binary_search(&q) {
                Ok(r) => r,
                Err(r) => {
                    rows.insert(r, q);
                    cells.insert(r, Vec::new());
                    r
                }
            };
            cells[r].push((k, sum, count));
        }
        Self { rows, cells }
    }

    fn num_cells(&self) -> usize {
        self.cells.iter().map(Vec::len).sum()
    }

    fn to_json(&self, vm: &VocabMatrix, labels: &[String], opts: &VocabHtmlOptions) -> String {
        let d = opts.decimals;
        let n = self.num_cells();
        let mut seen = vec![false; vm.vocab_size()];
        for (&q, row) in self.rows.iter().zip(&self.cells) {
            seen[q as usize] = true;
            for &(k, _, _) in row {
                seen[k as usize] = true;
            }
        }
        let tokens: Vec<u32> = (0..seen.len() as u32)
            .filter(|&t| seen[t as usize])
            .collect();
        let token_labels: Vec<String> =
            tokens.iter().map(|&t| labels[t as usize].clone()).collect();

        let totals: Vec<f64> = self
            .cells
            .iter()
            .map(|row| row.iter().map(|c| c.1).sum())
            .collect();
        let (mut keys, mut sums, mut counts) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut means, mut shares) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (row, &total) in self.cells.iter().zip(&totals) {
            let mut prev = 0;
            for &(k, sum, count) in row {
                keys.push((k - prev) as u64);
                prev = k;
                sums.push(sum);
                counts.push(count);
                means.push(if count > 0 { sum / count as f64 } else { 0.0 });
                shares.push(if total > 0.0 { sum / total } else { 0.0 });
            }
        }

        let mut out = String::with_capacity(n * 32 + tokens.len() * 16 + 256);
        let _ = write!(
            out,
            "{{\"format\":\"mha-vocab-matrix-1\",\"vocab_size\":{},\"decimals\":{d},\"top_k\":{},\
             \"num_queries\":{},\"total_mass\":",
            vm.vocab_size(),
            opts.top_k,
            vm.num_queries()
        );
        let _ = write!(
            out,
            "{}",
            (vm.total_mass() * 10f64.powi(d as i32)).round() as i64
        );
        out.push_str(",\"tokens\":");
        push_ints(&mut out, tokens.iter().map(|&t| t as u64));
        out.push_str(",\"labels\":");
        out.push_str(&json_strings(&token_labels));
        out.push_str(",\"rows\":");
        push_ints(&mut out, self.rows.iter().map(|&q| q as u64));
        out.push_str(",\"row_len\":");
        push_ints(&mut out, self.cells.iter().map(|r| r.len() as u64));
        out.push_str(",\"row_total\":");
        push_scaled_ints(&mut out, &totals, d);
        out.push_str(",\"row_queries\":");
        push_ints(&mut out, self.rows.iter().map(|&q| vm.query_count(q)));
        out.push_str(",\"key\":");
        push_ints(&mut out, keys.into_iter());
        out.push_str(",\"sum\":");
        push_scaled_ints(&mut out, &sums, d);
        out.push_str(",\"count\":");
        push_ints(&mut out, counts.into_iter());
        out.push_str(",\"mean\":");
        push_scaled_ints(&mut out, &means, d);
        out.push_str(",\"share\":");
        push_scaled_ints(&mut out, &shares, d);
        out.push('}');
        out
    }
}

/// Writes `values` as a JSON array of integers.
fn push_ints(out: &mut String, values: impl Iterator<Item = u64>) {
    out.push('[');
    for (i, v) in values.enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{v}");
    }
    out.push(']');
}
