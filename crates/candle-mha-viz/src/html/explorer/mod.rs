//! The attention explorer: one self-contained HTML page to read the weights of every layer and
//! head of one input interactively, offline (after bertviz's `head_view` and `model_view`,
//! which need a notebook and the network), plus a labelled heatmap with values on hover.
//!
//! The views, the DOM contract and the data are documented on [`attention_explorer`].

mod input;
mod options;

use candle::{Result, Tensor};

pub use options::ExplorerOptions;

use super::super::heads::HeadFusion;
use super::super::line_plot::PALETTE;
use super::super::rollout::{attention_flow, attention_rollout, ATTENTION_FLOW_MAX_LEN};
use super::page::{check_decimals, json_string, json_strings, push_scaled_ints, Page};
use input::{check_labels, check_storable, read_matrix, read_weights};

const CSS: &str = include_str!("explorer.css");
const JS_PARTS: [&str; 5] = [
    include_str!("core.js"),
    include_str!("head_view.js"),
    include_str!("model_view.js"),
    include_str!("matrix_view.js"),
    include_str!("main.js"),
];
const BODY: &str = include_str!("body.html");

/// The whole explorer page as a String (write it with [`candle_mha::io::write_atomic`]): head,
/// model and matrix views of `weights`, one self-contained HTML file that works offline.
///
/// # Views
/// - **Head view**: query tokens left, key tokens right, one line per (head, query, key) with
///   opacity ∝ weight, one colour per head, drawn on a canvas. Lines with a stored weight
///   below 0.01 (`round(w·10^decimals) < round(0.01·10^decimals)`, at least 1: opacity under
///   1 %, invisible on white) are skipped, which keeps 12 heads × 128² lines responsive.
///   Hovering a query shows only its row, hovering a key only its column (and shades the
///   other column's tokens by the strongest weight). The page opens on layer 0, all heads.
/// - **Model view**: every layer × head as a small heatmap (each with its own min–max colour
///   scale); clicking one opens it in the matrix view.
/// - **Matrix view**: one heatmap (viridis, the colours of [`heatmap_png`]; the scale runs from
///   the shown matrix's smallest to its largest value, as the PNG's default) of one layer's
///   head, or its heads fused by mean / max / min (computed in the page from the stored
///   heads), or the rollout / flow over all layers, or the caller's extra matrices. Hovering a
///   cell shows its query, key and value. Values are shown with the stored decimals; a mean of
///   heads with one decimal more (it is a mean of stored values, each within
///   `0.5·10^-decimals` of the input).
///
/// The layer is shared by the views: choosing it in one view chooses it in the others.
///
/// # DOM contract (stable, used by the tests)
/// - Tabs `#tab-head`, `#tab-model`, `#tab-matrix` (`aria-selected`) show the sections
///   `#view-head`, `#view-model`, `#view-matrix` (the others are `hidden`).
/// - Head view: layer `<select id="hv-layer">`; one `button.hv-head[data-head=h]` per head
///   (`aria-pressed` "true" when shown; its background is the head's colour), `#hv-all`,
///   `#hv-none`; tokens `#hv-queries .hv-tok[data-i]` and `#hv-keys .hv-tok[data-j]` (their
///   text is the label); the canvas `#hv-canvas` with `data-lines` (lines drawn),
///   `data-focus` (`"row i"`, `"col j"` or `""`), `data-layer` and `data-heads` (the shown
///   heads, `"0,2"`). Tokens are 20 CSS px apart, the first at the top.
/// - Model view: `#mv-grid` holds one `canvas.mv-thumb[data-layer][data-head]` per layer ×
///   head (the open one has class `sel`) and `.mv-label` headings.
/// - Matrix view: layer `<select id="mx-layer">`, matrix `<select id="mx-matrix">` (values
///   `"0"`…`"H-1"` for a head, `"mean"`, `"max"`, `"min"`, and `"m0"`, `"m1"`… for the
///   model-wide matrices in the data's order: rollout, flow, then the extra ones); `#mx-title`;
///   the heatmap `canvas#mx-canvas` (one `data-cell` CSS px square per value, drawn 1:1, query
///   rows top to bottom, key columns left to right; also `data-rows`, `data-cols`); labels
///   `#mx-rows .mx-label[data-i]`, `#mx-cols .mx-label[data-j]`; the colour bar
///   `canvas#mx-colorbar` (vmin left, vmax right) between `#mx-vmin` and `#mx-vmax` (the
///   scale's ends with the matrix's decimals); the hover readout `#mx-readout`
///   (`#mx-r-query`, `#mx-r-key`, `#mx-r-value`, `#mx-r-pos` `"(i, j)"`; empty when not over a
///   cell).
/// - `window.mhaExplorer.state()`: a snapshot `{view, layer, layers, heads, rows, cols,
///   decimals, enabled, focus, lines, minLineWeight, matrix: {choice, title, layer, cell,
///   vmin, vmax, digits}}` (`matrix` is null until the matrix view was shown);
///   `window.mhaExplorer.readyMs`: `performance.now()` when the first render was painted;
///   `document.body.dataset.ready` is `"1"` from then on.
///
/// # Data (`#mha-data`)
/// `{decimals, layers, heads, rows, cols, query_labels, key_labels, head_colors, weights,
/// matrices: [{name, values}]}`: `weights` is `(layers, H, L, S)` row-major, each
/// `round(w · 10^decimals)`; each matrix `(L, S)` likewise.
///
/// # Shapes
/// `weights`: `(H, L, S)` (one layer, e.g. the module's `average_attn_weights=False` output
/// for one batch row) or `(layers, H, L, S)`; any float dtype, any device. `query_labels`: L
/// entries, `key_labels`: S entries (cross-attention and stacked inputs have different lists).
/// `opts.matrices`: each `(L, S)`.
///
/// # Errors
/// Wrong rank, empty dims, non-float dtype, NaN/inf (naming the layer, head, query and key of
/// the first one), label counts not matching (naming which list, got, expected), bad
/// decimals, extra matrices of the wrong shape or non-finite; values too large for JS to hold
/// exactly once scaled (`|v|·10^decimals ≥ 2^53`).
///
/// PyTorch equivalent: none (bertviz's `head_view(attention, tokens)` and
/// `model_view(attention, tokens)` in a notebook, with `attention` a tuple of per-layer
/// `(batch, H, L, S)` tensors).
///
/// [`heatmap_png`]: crate::heatmap_png
pub fn attention_explorer(
    weights: &Tensor,
    query_labels: &[String],
    key_labels: &[String],
    opts: &ExplorerOptions,
) -> Result<String> {
    check_decimals(opts.decimals)
        .map_err(|e| candle::Error::Msg(format!("attention_explorer: opts.{e}")))?;
    let w = read_weights(weights, opts.decimals)?;
    check_labels(query_labels, "query_labels", "L", w.rows, weights.dims())?;
    check_labels(key_labels, "key_labels", "S", w.cols, weights.dims())?;
    let mut matrices: Vec<(String, Vec<f64>)> = Vec::new();
    if w.rows == w.cols && (opts.rollout || (opts.flow && w.rows <= ATTENTION_FLOW_MAX_LEN)) {
        let layers: Vec<Tensor> = (0..w.layers).map(|l| w.layer(l)).collect::<Result<_>>()?;
        let of = |n: usize| match n {
            1 => "1 layer".to_string(),
            n => format!("{n} layers"),
        };
        // Weights that are not distributions (negative ones) can make these large.
        if opts.rollout {
            let r = attention_rollout(&layers, HeadFusion::Mean, true, 0.0)?;
            let values: Vec<f64> = r.flatten_all()?.to_vec1()?;
            check_storable(&values, w.cols, opts.decimals, "the rollout of weights")?;
            matrices.push((
                format!("rollout over {} (mean of heads, residual)", of(w.layers)),
                values,
            ));
        }
        if opts.flow && w.rows <= ATTENTION_FLOW_MAX_LEN {
            let f = attention_flow(&layers, HeadFusion::Mean, true)?;
            let values: Vec<f64> = f.flatten_all()?.to_vec1()?;
            check_storable(
                &values,
                w.cols,
                opts.decimals,
                "the attention flow of weights",
            )?;
            matrices.push((
                format!("flow over {} (mean of heads, residual)", of(w.layers)),
                values,
            ));
        }
    }
    for (idx, (name, m)) in opts.matrices.iter().enumerate() {
        let values = read_matrix(idx, name, m, (w.rows, w.cols), opts.decimals)?;
        matrices.push((name.clone(), values));
    }

    let mut data = String::with_capacity(w.values.len() * 6 + 1024);
    data.push_str(&format!(
        "{{\"decimals\":{},\"layers\":{},\"heads\":{},\"rows\":{},\"cols\":{},\"query_labels\":{},\
         \"key_labels\":{},\"head_colors\":{},\"weights\":",
        opts.decimals,
        w.layers,
        w.heads,
        w.rows,
        w.cols,
        json_strings(query_labels),
        json_strings(key_labels),
        json_strings(&head_colours(w.heads)),
    ));
    push_scaled_ints(&mut data, &w.values, opts.decimals);
    data.push_str(",\"matrices\":[");
    for (i, (name, values)) in matrices.iter().enumerate() {
        if i > 0 {
            data.push(',');
        }
        data.push_str(&format!("{{\"name\":{},\"values\":", json_string(name)));
        push_scaled_ints(&mut data, values, opts.decimals);
        data.push('}');
    }
    data.push_str("]}");

    let plural = |n: usize, one: &str, many: &str| match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    let summary = format!(
        "{} × {}, {} × {}, values rounded to {} decimals; {{size}}",
        plural(w.layers, "layer", "layers"),
        plural(w.heads, "head", "heads"),
        plural(w.rows, "query", "queries"),
        plural(w.cols, "key", "keys"),
        opts.decimals,
    );
    let js = JS_PARTS.concat();
    let page = Page {
        title: opts.title.as_deref().unwrap_or("Attention"),
        summary: &summary,
        css: CSS,
        body: BODY,
        data_json: &data,
        js: &format!("(function () {{\n'use strict';\n{js}\n}})();"),
    };
    Ok(page.render())
}

/// One colour per head: the line charts' ten, then hues spread by the golden angle.
fn head_colours(heads: usize) -> Vec<String> {
    (0..heads)
        .map(|h| match PALETTE.get(h) {
            Some([r, g, b]) => format!("#{r:02x}{g:02x}{b:02x}"),
            None => {
                let hue = (h as f64 * 137.508) % 360.0;
                let [r, g, b] = hsl_to_rgb(hue, 0.65, 0.45);
                format!("#{r:02x}{g:02x}{b:02x}")
            }
        })
        .collect()
}

/// HSL (hue in degrees, saturation and lightness in `[0, 1]`) to 8-bit RGB.
fn hsl_to_rgb(h: f64, s: f64, l: f64) -> [u8; 3] {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (h / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    [to(r), to(g), to(b)]
}
