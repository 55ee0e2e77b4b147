//! Headless heatmaps of `(L, S)` matrices (attention weights, cosine tables, …) as RGB PNG or
//! SVG, one panel or a grid of panels (one per head) sharing one colour scale.
//!
//! Text is drawn with the crate's own 5×7 bitmap font (see `font.rs`) at scale 2, so the
//! PNGs are byte-for-byte the same on every machine: no system fonts, no font rasteriser. The
//! SVGs use the same layout with `monospace` text.
//!
//! # Layout (in pixels)
//! Constants: a text character is `CW = 12` wide (5 font pixels + 1 blank, ×2) and `CH = 14`
//! high (7 × 2); `MARGIN = 8`, `GAP = 6`, `BAR_GAP = 12`, `BAR_W = 16`, `PANEL_GAP = 16`,
//! `MIN_BAR_H = 36`. Label lengths count characters *after* truncation: row and column
//! labels longer than 16 characters are cut to 15 plus `~`, panel titles to 23 plus `~`, the
//! title to 99 plus `~`.
//!
//! ```text
//! rl = longest row label, cl = longest column label, pt = longest panel title (0 if none)
//! row_label_w   = rl·CW
//! rotated       = cl·CW > cell            (column labels then read bottom-to-top)
//! col_label_h   = 0 if cl = 0, else CH if not rotated, else cl·CW
//! panel_title_h = CH + GAP if panel titles are given, else 0   (never for heatmap_png/svg)
//! cells_x       = row_label_w + GAP                       (first cell, inside a panel)
//! cells_y       = panel_title_h + col_label_h + GAP
//! panel_w       = max(cells_x + S·cell, pt·CW)
//! panel_h       = cells_y + L·cell
//! grid          = ncols = ⌈√H⌉ panels across, nrows = ⌈H / ncols⌉ down (H = panel count)
//! block_w       = ncols·panel_w + (ncols − 1)·PANEL_GAP
//! block_h       = nrows·panel_h + (nrows − 1)·PANEL_GAP
//! bar_h         = max(block_h − cells_y, MIN_BAR_H)
//! tick_w        = max(chars(tick(vmin)), chars(tick(vmax)))·CW
//! title_h       = CH + GAP with a title, else 0;   tw = title chars·CW
//! width         = max(MARGIN + block_w + BAR_GAP + BAR_W + GAP + tick_w + MARGIN, 2·MARGIN + tw)
//! height        = MARGIN + title_h + max(block_h, cells_y + bar_h) + MARGIN
//! panel p       at x = MARGIN + (p mod ncols)·(panel_w + PANEL_GAP),
//!                  y = MARGIN + title_h + ⌊p / ncols⌋·(panel_h + PANEL_GAP)
//! cell (i, j)   at (panel x + cells_x + j·cell, panel y + cells_y + i·cell), cell × cell
//! colour bar    at x = MARGIN + block_w + BAR_GAP, y = MARGIN + title_h + cells_y,
//!                  BAR_W × bar_h, vmax at the top, vmin at the bottom
//! ```
//! Labels need `LINE = 18` pixels across (a 14-pixel line and the descenders of g j p q y):
//! when `cell < 18`, only every `⌈18 / cell⌉`-th row label and rotated column label is drawn
//! (the first, then every k-th), so they never overlap; the layout above does not change.
//!
//! `tick(v)` prints `v` with 3 decimals (`{:.3}`) when `m = max(|vmin|, |vmax|)` is 0 or in
//! `[1e-3, 1e5)`, else as `{:.2e}` (both ticks use the same form, so weights from ~1e-8 to 1
//! read `0.000` and `1.000`); `-0.000` prints as `0.000`. The max tick is drawn level with the
//! bar's top, the min tick level with its bottom, both `GAP` to the right of the bar.
//!
//! # Colours
//! Cell `(i, j)` is `colormap((v − vmin) / (vmax − vmin))` (clamped to `[0, 1]`; `0.5` when
//! `vmax = vmin`) over its whole `cell × cell` square, except for the value text. Values are
//! printed (scale-1 font, white on dark cells, black on light ones) only when
//! `show_values` is set, the matrix is at most 16 × 16 and the text fits inside the cell with
//! 2 pixels to spare on every side; so a cell's outer 2-pixel border is always its colour.
//! NaN and infinite values are not errors: they are drawn as grey (`#808080`) cells, left out
//! of the default `vmin`/`vmax`, and printed as `NaN`, `inf`, `-inf` (e.g. masked scores).
//!
//! # Writing files
//! [`save`] writes the bytes atomically (`candle_mha::io::write_atomic`); for SVG pass
//! `svg.as_bytes()`.
//!
//! # Files
//! This file holds the public API; `layout.rs` validates the input and computes the layout
//! above, `png.rs` and `svg.rs` draw it, `text.rs` writes values, ticks and text colours,
//! `viridis.rs` holds the colour map.

mod layout;
mod png;
mod svg;
mod text;
mod viridis;

use std::path::Path;

use candle::{Result, Tensor};

use layout::Plot;
pub use viridis::colormap;

/// How a heatmap is drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct HeatmapOptions {
    /// Side of one square cell, in pixels (≥ 1). Default 28.
    pub cell: u32,
    /// A line centred above everything. Default `None`.
    pub title: Option<String>,
    /// Print each value inside its cell. Default `true`; values are printed only for matrices
    /// of at most 16 × 16 whose value text fits the cell (see the module docs).
    pub show_values: bool,
    /// The value mapped to the first colormap entry. Default `None`: the smallest finite value
    /// (over all panels).
    pub vmin: Option<f64>,
    /// The value mapped to the last colormap entry. Default `None`: the largest finite value
    /// (over all panels).
    pub vmax: Option<f64>,
}

impl Default for HeatmapOptions {
    fn default() -> Self {
        Self {
            cell: 28,
            title: None,
            show_values: true,
            vmin: None,
            vmax: None,
        }
    }
}

/// Writes a heatmap (PNG bytes, or an SVG's `as_bytes()`) to `path` atomically, so a reader
/// never sees a half-written image.
///
/// PyTorch equivalent: none (matplotlib's `savefig`).
///
/// # Errors
/// The file cannot be written; the message names the path.
pub fn save(path: &Path, bytes: &[u8]) -> Result<()> {
    candle_mha::io::write_atomic(path, bytes)
}

/// One `(L, S)` matrix as an RGB PNG: row labels on the left, column labels on top (rotated
/// when wider than a cell), viridis cells, a colour bar with the min and max on the right and
/// an optional title. Sizes and positions follow the module-level layout.
///
/// PyTorch equivalent: none; matplotlib's `imshow` + `colorbar` + tick labels.
///
/// # Shapes
/// `matrix (L, S)`, any dtype (read as f64); `row_labels` has `L` entries, `col_labels` `S`.
///
/// # Errors
/// `matrix` not 2-D or empty, label counts that do not match its shape, `cell = 0`, `vmin`
/// or `vmax` not finite or `vmin > vmax`, or an image above 64 Mpx.
///
/// ```
/// use candle::{Device, Tensor};
/// use candle_mha_viz::heatmap::{heatmap_png, HeatmapOptions};
/// # fn main() -> candle::Result<()> {
/// let w = Tensor::new(&[[0.7f32, 0.3], [0.4, 0.6]], &Device::Cpu)?;
/// let labels = vec!["the".to_string(), "cat".to_string()];
/// let png = heatmap_png(&w, &labels, &labels, &HeatmapOptions::default())?;
/// assert_eq!(&png[1..4], b"PNG");
/// # Ok(())
/// # }
/// ```
pub fn heatmap_png(
    matrix: &Tensor,
    row_labels: &[String],
    col_labels: &[String],
    opts: &HeatmapOptions,
) -> Result<Vec<u8>> {
    let plot = Plot::new("heatmap_png", &[matrix], &[], row_labels, col_labels, opts)?;
    plot.png()
}

/// [`heatmap_png`]'s layout as an SVG document: a `<rect class="cell">` per cell with
/// `fill="#rrggbb"` and a `<title>` giving its labels and value, `<text>` labels, a gradient
/// colour bar; the root's `width`/`height` are the PNG's.
///
/// PyTorch equivalent: none; matplotlib's `savefig(…, format="svg")`.
///
/// # Shapes and errors
/// As [`heatmap_png`].
pub fn heatmap_svg(
    matrix: &Tensor,
    row_labels: &[String],
    col_labels: &[String],
    opts: &HeatmapOptions,
) -> Result<String> {
    let plot = Plot::new("heatmap_svg", &[matrix], &[], row_labels, col_labels, opts)?;
    Ok(plot.svg())
}

/// Several `(L, S)` matrices (e.g. the heads of `(H, L, S)` weights) as one RGB PNG: a grid of
/// ⌈√H⌉ panels across, every panel with its own labels and title, one colour scale and one
/// colour bar shared by all.
///
/// PyTorch equivalent: none; matplotlib's `subplots` + `imshow(vmin=…, vmax=…)` per head.
///
/// # Shapes
/// `matrices`: `H ≥ 1` tensors, all `(L, S)`; `titles`: `H` panel titles, or none (empty
/// slice) for no panel titles; `row_labels` `L`, `col_labels` `S`. To split `(H, L, S)`
/// weights: `(0..h).map(|i| w.get(i)).collect::<candle::Result<Vec<_>>>()?`.
///
/// # Errors
/// No matrix, matrices of different shapes, a `titles` count other than 0 or `H`, and every
/// error of [`heatmap_png`].
pub fn heatmap_grid_png(
    matrices: &[Tensor],
    titles: &[String],
    row_labels: &[String],
    col_labels: &[String],
    opts: &HeatmapOptions,
) -> Result<Vec<u8>> {
    grid_plot(
        "heatmap_grid_png",
        matrices,
        titles,
        row_labels,
        col_labels,
        opts,
    )?
    .png()
}

/// [`heatmap_grid_png`]'s layout as an SVG document (see [`heatmap_svg`]).
///
/// PyTorch equivalent: none; matplotlib's `subplots` + `savefig(…, format="svg")`.
///
/// # Shapes and errors
/// As [`heatmap_grid_png`].
pub fn heatmap_grid_svg(
    matrices: &[Tensor],
    titles: &[String],
    row_labels: &[String],
    col_labels: &[String],
    opts: &HeatmapOptions,
) -> Result<String> {
    Ok(grid_plot(
        "heatmap_grid_svg",
        matrices,
        titles,
        row_labels,
        col_labels,
        opts,
    )?
    .svg())
}

/// The grid functions' [`Plot`]: `matrices` as the panels; `func` names the caller in errors.
fn grid_plot(
    func: &str,
    matrices: &[Tensor],
    titles: &[String],
    row_labels: &[String],
    col_labels: &[String],
    opts: &HeatmapOptions,
) -> Result<Plot> {
    let refs: Vec<&Tensor> = matrices.iter().collect();
    Plot::new(func, &refs, titles, row_labels, col_labels, opts)
}
