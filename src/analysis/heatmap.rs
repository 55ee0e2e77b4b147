//! Headless heatmaps of `(L, S)` matrices (attention weights, cosine tables, …) as RGB PNG or
//! SVG, one panel or a grid of panels (one per head) sharing one colour scale.
//!
//! Text is drawn with the crate's own 5×7 bitmap font (see `font.rs`) at scale 2, so the
//! PNGs are byte-for-byte the same on every machine: no system fonts, no font rasteriser. The
//! SVGs use the same layout with `monospace` text.
//!
//! # Layout (in pixels; the tests recompute it from this description)
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
//! [`save`] writes the bytes atomically (`crate::checkpoint::write_atomic`); for SVG pass
//! `svg.as_bytes()`.

use std::fmt::Write as _;
use std::path::Path;

use candle::{DType, Result, Tensor};

use super::canvas::{chars, fit, hex, Canvas};
use super::font::{ADVANCE, DESCENT, GLYPH_H};
use super::graph::xml_escape;

/// Text scale for labels, titles and ticks: the 5×7 font at ×2.
const SCALE: u32 = 2;
/// Width of one label character, in pixels.
const CW: u32 = ADVANCE * SCALE;
/// Height of one label line, in pixels.
const CH: u32 = GLYPH_H * SCALE;
const MARGIN: u32 = 8;
const GAP: u32 = 6;
const BAR_GAP: u32 = 12;
const BAR_W: u32 = 16;
const PANEL_GAP: u32 = 16;
/// Pixels a label needs across its line: the line and the descenders.
const LINE: u32 = CH + DESCENT * SCALE;
/// Tall enough for the min and max ticks not to overlap on a one-row matrix.
const MIN_BAR_H: u32 = 2 * CH + 8;
const MAX_LABEL: usize = 16;
const MAX_PANEL_TITLE: usize = 24;
const MAX_TITLE: usize = 100;
/// Values are printed in matrices up to this many rows and columns.
const MAX_VALUES_SIDE: usize = 16;
/// Refuse images above 64 Mpx (192 MiB of RGB) rather than exhaust memory on a typo.
pub(crate) const MAX_PIXELS: u64 = 1 << 26;
const GREY: [u8; 3] = [128, 128, 128];
const WHITE: [u8; 3] = [255, 255, 255];
const INK: [u8; 3] = [20, 20, 20];
const BLACK: [u8; 3] = [0, 0, 0];

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

/// Matplotlib's viridis, its 256 entries as `0xRRGGBB` (viridis is CC0, by Stéfan van der Walt
/// and Nathaniel Smith): perceptually uniform and readable in grey and by colour-blind readers.
#[rustfmt::skip]
const VIRIDIS: [u32; 256] = [
    0x440154, 0x440256, 0x450457, 0x450559, 0x46075a, 0x46085c, 0x460a5d, 0x460b5e,
    0x470d60, 0x470e61, 0x471063, 0x471164, 0x471365, 0x481467, 0x481668, 0x481769,
    0x48186a, 0x481a6c, 0x481b6d, 0x481c6e, 0x481d6f, 0x481f70, 0x482071, 0x482173,
    0x482374, 0x482475, 0x482576, 0x482677, 0x482878, 0x482979, 0x472a7a, 0x472c7a,
    0x472d7b, 0x472e7c, 0x472f7d, 0x46307e, 0x46327e, 0x46337f, 0x463480, 0x453581,
    0x453781, 0x453882, 0x443983, 0x443a83, 0x443b84, 0x433d84, 0x433e85, 0x423f85,
    0x424086, 0x424186, 0x414287, 0x414487, 0x404588, 0x404688, 0x3f4788, 0x3f4889,
    0x3e4989, 0x3e4a89, 0x3e4c8a, 0x3d4d8a, 0x3d4e8a, 0x3c4f8a, 0x3c508b, 0x3b518b,
    0x3b528b, 0x3a538b, 0x3a548c, 0x39558c, 0x39568c, 0x38588c, 0x38598c, 0x375a8c,
    0x375b8d, 0x365c8d, 0x365d8d, 0x355e8d, 0x355f8d, 0x34608d, 0x34618d, 0x33628d,
    0x33638d, 0x32648e, 0x32658e, 0x31668e, 0x31678e, 0x31688e, 0x30698e, 0x306a8e,
    0x2f6b8e, 0x2f6c8e, 0x2e6d8e, 0x2e6e8e, 0x2e6f8e, 0x2d708e, 0x2d718e, 0x2c718e,
    0x2c728e, 0x2c738e, 0x2b748e, 0x2b758e, 0x2a768e, 0x2a778e, 0x2a788e, 0x29798e,
    0x297a8e, 0x297b8e, 0x287c8e, 0x287d8e, 0x277e8e, 0x277f8e, 0x27808e, 0x26818e,
    0x26828e, 0x26828e, 0x25838e, 0x25848e, 0x25858e, 0x24868e, 0x24878e, 0x23888e,
    0x23898e, 0x238a8d, 0x228b8d, 0x228c8d, 0x228d8d, 0x218e8d, 0x218f8d, 0x21908d,
    0x21918c, 0x20928c, 0x20928c, 0x20938c, 0x1f948c, 0x1f958b, 0x1f968b, 0x1f978b,
    0x1f988b, 0x1f998a, 0x1f9a8a, 0x1e9b8a, 0x1e9c89, 0x1e9d89, 0x1f9e89, 0x1f9f88,
    0x1fa088, 0x1fa188, 0x1fa187, 0x1fa287, 0x20a386, 0x20a486, 0x21a585, 0x21a685,
    0x22a785, 0x22a884, 0x23a983, 0x24aa83, 0x25ab82, 0x25ac82, 0x26ad81, 0x27ad81,
    0x28ae80, 0x29af7f, 0x2ab07f, 0x2cb17e, 0x2db27d, 0x2eb37c, 0x2fb47c, 0x31b57b,
    0x32b67a, 0x34b679, 0x35b779, 0x37b878, 0x38b977, 0x3aba76, 0x3bbb75, 0x3dbc74,
    0x3fbc73, 0x40bd72, 0x42be71, 0x44bf70, 0x46c06f, 0x48c16e, 0x4ac16d, 0x4cc26c,
    0x4ec36b, 0x50c46a, 0x52c569, 0x54c568, 0x56c667, 0x58c765, 0x5ac864, 0x5cc863,
    0x5ec962, 0x60ca60, 0x63cb5f, 0x65cb5e, 0x67cc5c, 0x69cd5b, 0x6ccd5a, 0x6ece58,
    0x70cf57, 0x73d056, 0x75d054, 0x77d153, 0x7ad151, 0x7cd250, 0x7fd34e, 0x81d34d,
    0x84d44b, 0x86d549, 0x89d548, 0x8bd646, 0x8ed645, 0x90d743, 0x93d741, 0x95d840,
    0x98d83e, 0x9bd93c, 0x9dd93b, 0xa0da39, 0xa2da37, 0xa5db36, 0xa8db34, 0xaadc32,
    0xaddc30, 0xb0dd2f, 0xb2dd2d, 0xb5de2b, 0xb8de29, 0xbade28, 0xbddf26, 0xc0df25,
    0xc2df23, 0xc5e021, 0xc8e020, 0xcae11f, 0xcde11d, 0xd0e11c, 0xd2e21b, 0xd5e21a,
    0xd8e219, 0xdae319, 0xdde318, 0xdfe318, 0xe2e418, 0xe5e419, 0xe7e419, 0xeae51a,
    0xece51b, 0xefe51c, 0xf1e51d, 0xf4e61e, 0xf6e620, 0xf8e621, 0xfbe723, 0xfde725,
];

/// The viridis colour of `t`: entry `min(⌊t·256⌋, 255)` of matplotlib's 256-entry table (the
/// index matplotlib's `Colormap.__call__` picks), `t` clamped to `[0, 1]`; NaN gives entry 0.
///
/// PyTorch equivalent: none; matplotlib's `(np.array(cm.viridis(t))[:3] * 255).round()`.
pub fn colormap(t: f64) -> [u8; 3] {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let rgb = VIRIDIS[((t * 256.0) as usize).min(255)];
    [(rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8]
}

/// Writes a heatmap (PNG bytes, or an SVG's `as_bytes()`) to `path` atomically, so a reader
/// never sees a half-written image.
///
/// PyTorch equivalent: none (matplotlib's `savefig`).
///
/// # Errors
/// The file cannot be written; the message names the path.
pub fn save(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::checkpoint::write_atomic(path, bytes)
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
/// use candle_mha::analysis::heatmap::{heatmap_png, HeatmapOptions};
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
    let refs: Vec<&Tensor> = matrices.iter().collect();
    let plot = Plot::new(
        "heatmap_grid_png",
        &refs,
        titles,
        row_labels,
        col_labels,
        opts,
    )?;
    plot.png()
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
    let refs: Vec<&Tensor> = matrices.iter().collect();
    let plot = Plot::new(
        "heatmap_grid_svg",
        &refs,
        titles,
        row_labels,
        col_labels,
        opts,
    )?;
    Ok(plot.svg())
}

/// The colour-bar tick text for `v` on a scale whose largest magnitude is `m` (module docs).
fn tick(v: f64, m: f64) -> String {
    if m == 0.0 || (1e-3..1e5).contains(&m) {
        let text = format!("{v:.3}");
        match text.strip_prefix('-') {
            Some(rest) if rest == "0.000" => rest.to_string(),
            _ => text,
        }
    } else {
        format!("{v:.2e}")
    }
}

fn plot_tick(v: f64, vmin: f64, vmax: f64) -> String {
    tick(v, vmin.abs().max(vmax.abs()))
}

/// A value short enough for a cell: ".45", "-.45", "3.4", "120", "1e3", "NaN".
fn cell_text(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = v.abs();
    let text = if a < 0.995 {
        let s = format!("{v:.2}");
        let s = s.replacen("0.", ".", 1);
        if s == ".00" || s == "-.00" {
            "0".to_string()
        } else {
            s
        }
    } else if a < 9.95 {
        format!("{v:.1}")
    } else if a < 999.5 {
        format!("{v:.0}")
    } else {
        format!("{v:.0e}")
    };
    text
}

/// Black text on light colours, white on dark ones (ITU-R 601 luma).
fn text_on(bg: [u8; 3]) -> [u8; 3] {
    let luma = 0.299 * bg[0] as f64 + 0.587 * bg[1] as f64 + 0.114 * bg[2] as f64;
    if luma < 128.0 {
        WHITE
    } else {
        BLACK
    }
}

/// Everything needed to draw, validated once and shared by the PNG and SVG writers.
struct Plot {
    l: usize,
    s: usize,
    /// One row-major `L·S` buffer per panel.
    panels: Vec<Vec<f64>>,
    /// Full labels (for SVG `<title>`s) and their fitted forms (drawn).
    rows: Vec<String>,
    cols: Vec<String>,
    rows_fit: Vec<String>,
    cols_fit: Vec<String>,
    titles_fit: Vec<String>,
    title_fit: Option<String>,
    vmin: f64,
    vmax: f64,
    show_values: bool,
    cell: u32,
    // Layout (module docs).
    ncols: u32,
    rotated: bool,
    col_label_h: u32,
    panel_title_h: u32,
    cells_x: u32,
    cells_y: u32,
    panel_w: u32,
    panel_h: u32,
    block_w: u32,
    title_h: u32,
    bar_h: u32,
    width: u32,
    height: u32,
}

impl Plot {
    fn new(
        func: &str,
        matrices: &[&Tensor],
        titles: &[String],
        row_labels: &[String],
        col_labels: &[String],
        opts: &HeatmapOptions,
    ) -> Result<Self> {
        let single = func == "heatmap_png" || func == "heatmap_svg";
        let name = |i: usize| match single {
            true => "matrix".to_string(),
            false => format!("matrices[{i}]"),
        };
        if matrices.is_empty() {
            candle::bail!("{func}: `matrices` is empty; expected at least one (L, S) matrix")
        }
        if opts.cell == 0 {
            candle::bail!("{func}: opts.cell is 0; expected a cell size of at least 1 pixel")
        }
        let (l, s) = match matrices[0].dims() {
            &[l, s] => (l, s),
            dims => candle::bail!(
                "{func}: {} must be 2-D (L, S), got shape {dims:?}; select one map first (e.g. weights.get(n)?.get(h)?)",
                name(0)
            ),
        };
        if l == 0 || s == 0 {
            candle::bail!(
                "{func}: {} is empty (shape [{l}, {s}]); expected at least one row and one column",
                name(0)
            )
        }
        let mut panels = Vec::with_capacity(matrices.len());
        for (i, m) in matrices.iter().enumerate() {
            if m.dims() != [l, s] {
                candle::bail!(
                    "{func}: {} has shape {:?} but {} has [{l}, {s}]; every panel must have the same shape",
                    name(i),
                    m.dims(),
                    name(0)
                )
            }
            let rows = m.to_dtype(DType::F64)?.to_vec2::<f64>()?;
            panels.push(rows.into_iter().flatten().collect::<Vec<f64>>());
        }
        if row_labels.len() != l || col_labels.len() != s {
            candle::bail!(
                "{func}: {} has shape [{l}, {s}] but got {} row labels and {} column labels; expected {l} and {s}",
                name(0),
                row_labels.len(),
                col_labels.len()
            )
        }
        if !titles.is_empty() && titles.len() != matrices.len() {
            candle::bail!(
                "{func}: got {} titles for {} matrices; expected one per matrix or none",
                titles.len(),
                matrices.len()
            )
        }
        let (vmin, vmax) = value_range(func, &panels, opts)?;

        let rows_fit: Vec<String> = row_labels.iter().map(|r| fit(r, MAX_LABEL)).collect();
        let cols_fit: Vec<String> = col_labels.iter().map(|c| fit(c, MAX_LABEL)).collect();
        let titles_fit: Vec<String> = titles.iter().map(|t| fit(t, MAX_PANEL_TITLE)).collect();
        let title_fit = opts.title.as_ref().map(|t| fit(t, MAX_TITLE));

        // All sizes in u64 first: a huge cell or matrix must give an error, not an overflow.
        let longest = |v: &[String]| v.iter().map(|x| chars(x) as u64).max().unwrap_or(0);
        let (cw, ch, gap) = (CW as u64, CH as u64, GAP as u64);
        let cell = opts.cell as u64;
        let (rl, cl, pt) = (longest(&rows_fit), longest(&cols_fit), longest(&titles_fit));
        let rotated = cl * cw > cell;
        let col_label_h = match (cl, rotated) {
            (0, _) => 0,
            (_, false) => ch,
            (_, true) => cl * cw,
        };
        let panel_title_h = if titles.is_empty() { 0 } else { ch + gap };
        let cells_x = rl * cw + gap;
        let cells_y = panel_title_h + col_label_h + gap;
        let panel_w = (cells_x + s as u64 * cell).max(pt * cw);
        let panel_h = cells_y + l as u64 * cell;
        let h = matrices.len() as u64;
        let ncols = (1..=h).find(|c| c * c >= h).unwrap_or(1);
        let nrows = h.div_ceil(ncols);
        let block_w = ncols * panel_w + (ncols - 1) * PANEL_GAP as u64;
        let block_h = nrows * panel_h + (nrows - 1) * PANEL_GAP as u64;
        let bar_h = (block_h - cells_y).max(MIN_BAR_H as u64);
        let tick_w = chars(&plot_tick(vmin, vmin, vmax)).max(chars(&plot_tick(vmax, vmin, vmax)))
            as u64
            * cw;
        let title_h = if title_fit.is_some() { ch + gap } else { 0 };
        let tw = title_fit.as_deref().map_or(0, chars) as u64 * cw;
        let m = MARGIN as u64;
        let width = (m + block_w + (BAR_GAP + BAR_W + GAP) as u64 + tick_w + m).max(2 * m + tw);
        let height = m + title_h + block_h.max(cells_y + bar_h) + m;
        if width * height > MAX_PIXELS || width > u32::MAX as u64 || height > u32::MAX as u64 {
            candle::bail!(
                "{func}: the image would be {width}×{height} pixels, above the {MAX_PIXELS}-pixel limit; use a smaller opts.cell (got {}) or fewer rows/columns",
                opts.cell
            )
        }
        let show_values = opts.show_values && l <= MAX_VALUES_SIDE && s <= MAX_VALUES_SIDE;
        Ok(Self {
            l,
            s,
            panels,
            rows: row_labels.to_vec(),
            cols: col_labels.to_vec(),
            rows_fit,
            cols_fit,
            titles_fit,
            title_fit,
            vmin,
            vmax,
            show_values,
            cell: opts.cell,
            ncols: ncols as u32,
            rotated,
            col_label_h: col_label_h as u32,
            panel_title_h: panel_title_h as u32,
            cells_x: cells_x as u32,
            cells_y: cells_y as u32,
            panel_w: panel_w as u32,
            panel_h: panel_h as u32,
            block_w: block_w as u32,
            title_h: title_h as u32,
            bar_h: bar_h as u32,
            width: width as u32,
            height: height as u32,
        })
    }

    /// Top-left corner of panel `p`.
    fn panel_xy(&self, p: usize) -> (u32, u32) {
        let (col, row) = (p as u32 % self.ncols, p as u32 / self.ncols);
        (
            MARGIN + col * (self.panel_w + PANEL_GAP),
            MARGIN + self.title_h + row * (self.panel_h + PANEL_GAP),
        )
    }

    fn bar_xy(&self) -> (u32, u32) {
        (
            MARGIN + self.block_w + BAR_GAP,
            MARGIN + self.title_h + self.cells_y,
        )
    }

    /// Draw every k-th row label and rotated column label, so labels on narrow cells do not
    /// overlap (module docs).
    fn label_stride(&self) -> usize {
        LINE.div_ceil(self.cell).max(1) as usize
    }

    fn tick(&self, v: f64) -> String {
        plot_tick(v, self.vmin, self.vmax)
    }

    fn color(&self, v: f64) -> [u8; 3] {
        if !v.is_finite() {
            return GREY;
        }
        let t = if self.vmax > self.vmin {
            (v - self.vmin) / (self.vmax - self.vmin)
        } else {
            0.5
        };
        colormap(t)
    }

    /// The value text for `v` if it is printed in its cell (it fits with a 2-px border).
    fn value_text(&self, v: f64) -> Option<String> {
        if !self.show_values {
            return None;
        }
        let text = cell_text(v);
        let fits = chars(&text) * ADVANCE <= self.cell.saturating_sub(4)
            && GLYPH_H <= self.cell.saturating_sub(4);
        fits.then_some(text)
    }

    fn png(&self) -> Result<Vec<u8>> {
        let mut c = Canvas::new(self.width, self.height);
        let (cell, cw) = (self.cell as i64, CW as i64);
        if let Some(t) = &self.title_fit {
            let x = (self.width as i64 - chars(t) as i64 * cw) / 2;
            c.text(x, MARGIN as i64, t, SCALE, INK);
        }
        for (p, values) in self.panels.iter().enumerate() {
            let (px, py) = self.panel_xy(p);
            let (px, py) = (px as i64, py as i64);
            let (x0, y0) = (px + self.cells_x as i64, py + self.cells_y as i64);
            if let Some(t) = self.titles_fit.get(p) {
                let x = x0.min(px + self.panel_w as i64 - chars(t) as i64 * cw);
                c.text(x, py, t, SCALE, INK);
            }
            let stride = self.label_stride();
            for (i, label) in self.rows_fit.iter().enumerate().step_by(stride) {
                let x = x0 - GAP as i64 - chars(label) as i64 * cw;
                let y = y0 + i as i64 * cell + (cell - CH as i64) / 2;
                c.text(x, y, label, SCALE, INK);
            }
            let col_stride = if self.rotated { stride } else { 1 };
            for (j, label) in self.cols_fit.iter().enumerate().step_by(col_stride) {
                let centre = x0 + j as i64 * cell + cell / 2;
                let top = py + self.panel_title_h as i64;
                if self.rotated {
                    // Read bottom-to-top, starting just above the cells.
                    c.text_up(
                        centre - CH as i64 / 2,
                        y0 - GAP as i64 - 1,
                        label,
                        SCALE,
                        INK,
                    );
                } else {
                    let x = centre - chars(label) as i64 * cw / 2;
                    c.text(
                        x,
                        top + self.col_label_h as i64 - CH as i64,
                        label,
                        SCALE,
                        INK,
                    );
                }
            }
            for i in 0..self.l {
                for j in 0..self.s {
                    let v = values[i * self.s + j];
                    let bg = self.color(v);
                    let (x, y) = (x0 + j as i64 * cell, y0 + i as i64 * cell);
                    c.fill(x, y, cell, cell, bg);
                    if let Some(text) = self.value_text(v) {
                        let tw = chars(&text) as i64 * ADVANCE as i64 - 1;
                        let tx = x + (cell - tw) / 2;
                        let ty = y + (cell - GLYPH_H as i64) / 2;
                        c.text(tx, ty, &text, 1, text_on(bg));
                    }
                }
            }
        }
        let (bx, by) = self.bar_xy();
        let (bx, by, bh) = (bx as i64, by as i64, self.bar_h as i64);
        // A 1-px outline just outside the bar, so its ends read against the white page.
        c.fill(bx - 1, by - 1, BAR_W as i64 + 2, bh + 2, INK);
        for k in 0..bh {
            // Top row = vmax (t = 1), bottom row = vmin (t = 0).
            let t = if bh > 1 {
                1.0 - k as f64 / (bh - 1) as f64
            } else {
                0.5
            };
            c.fill(bx, by + k, BAR_W as i64, 1, colormap(t));
        }
        let tx = bx + (BAR_W + GAP) as i64;
        c.text(tx, by, &self.tick(self.vmax), SCALE, INK);
        c.text(tx, by + bh - CH as i64, &self.tick(self.vmin), SCALE, INK);
        c.encode()
    }

    fn svg(&self) -> String {
        let (w, h, cell) = (self.width, self.height, self.cell);
        let mut o = String::new();
        // `write!` to a String cannot fail.
        let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="monospace">"#
        );
        let _ = writeln!(o, "<defs>");
        let _ = writeln!(
            o,
            r#"<linearGradient id="colorbar" x1="0" y1="1" x2="0" y2="0">"#
        );
        for k in 0..=16 {
            let t = k as f64 / 16.0;
            let _ = writeln!(
                o,
                r#"<stop offset="{t}" stop-color="{}"/>"#,
                hex(colormap(t))
            );
        }
        let _ = writeln!(o, "</linearGradient>\n</defs>");
        let _ = writeln!(
            o,
            r##"<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##
        );
        let ink = hex(INK);
        // Baseline 11 px below a text line's top: the 14-px line of the PNG.
        let text = |o: &mut String, x: i64, y: i64, anchor: &str, s: &str| {
            let _ = writeln!(
                o,
                r#"<text x="{x}" y="{}" font-size="14" text-anchor="{anchor}" fill="{ink}">{}</text>"#,
                y + 11,
                xml_escape(s)
            );
        };
        let (cell_i, cw) = (cell as i64, CW as i64);
        if let Some(t) = &self.title_fit {
            text(&mut o, w as i64 / 2, MARGIN as i64, "middle", t);
        }
        for (p, values) in self.panels.iter().enumerate() {
            let (px, py) = self.panel_xy(p);
            let (px, py) = (px as i64, py as i64);
            let (x0, y0) = (px + self.cells_x as i64, py + self.cells_y as i64);
            let _ = writeln!(o, r#"<g class="panel">"#);
            if let Some(t) = self.titles_fit.get(p) {
                let x = x0.min(px + self.panel_w as i64 - chars(t) as i64 * cw);
                text(&mut o, x, py, "start", t);
            }
            let stride = self.label_stride();
            for (i, label) in self.rows_fit.iter().enumerate().step_by(stride) {
                let y = y0 + i as i64 * cell_i + (cell_i - CH as i64) / 2;
                text(&mut o, x0 - GAP as i64, y, "end", label);
            }
            let col_stride = if self.rotated { stride } else { 1 };
            for (j, label) in self.cols_fit.iter().enumerate().step_by(col_stride) {
                let centre = x0 + j as i64 * cell_i + cell_i / 2;
                if self.rotated {
                    // rotate(-90) turns the text to read upwards from (x, y); its glyphs then lie
                    // left of the baseline, so the baseline sits 4 px right of the column centre.
                    let (x, y) = (centre + 4, y0 - GAP as i64);
                    let _ = writeln!(
                        o,
                        r#"<text transform="translate({x},{y}) rotate(-90)" font-size="14" fill="{ink}">{}</text>"#,
                        xml_escape(label)
                    );
                } else {
                    let top = py + (self.panel_title_h + self.col_label_h) as i64 - CH as i64;
                    text(&mut o, centre, top, "middle", label);
                }
            }
            for i in 0..self.l {
                for j in 0..self.s {
                    let v = values[i * self.s + j];
                    let bg = self.color(v);
                    let (x, y) = (x0 + j as i64 * cell_i, y0 + i as i64 * cell_i);
                    let _ = writeln!(
                        o,
                        r#"<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{}"><title>{} → {}: {}</title></rect>"#,
                        hex(bg),
                        xml_escape(&self.rows[i]),
                        xml_escape(&self.cols[j]),
                        full_value(v)
                    );
                    if let Some(t) = self.value_text(v) {
                        let _ = writeln!(
                            o,
                            r#"<text x="{}" y="{}" font-size="9" text-anchor="middle" fill="{}">{}</text>"#,
                            x + cell_i / 2,
                            y + cell_i / 2 + 3,
                            hex(text_on(bg)),
                            xml_escape(&t)
                        );
                    }
                }
            }
            let _ = writeln!(o, "</g>");
        }
        let (bx, by) = self.bar_xy();
        let _ = writeln!(
            o,
            r##"<rect class="colorbar" x="{bx}" y="{by}" width="{BAR_W}" height="{}" fill="url(#colorbar)" stroke="{ink}" stroke-width="1"/>"##,
            self.bar_h
        );
        let tx = (bx + BAR_W + GAP) as i64;
        text(&mut o, tx, by as i64, "start", &self.tick(self.vmax));
        let bottom = (by + self.bar_h) as i64 - CH as i64;
        text(&mut o, tx, bottom, "start", &self.tick(self.vmin));
        let _ = writeln!(o, "</svg>");
        o
    }
}

/// A value for an SVG `<title>`: 4 decimals, or NaN / inf / -inf.
fn full_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        cell_text(v)
    } else {
        format!("{v:.4}")
    }
}

/// `opts.vmin`/`opts.vmax`, or the finite data range; 0..1 when no value is finite.
fn value_range(func: &str, panels: &[Vec<f64>], opts: &HeatmapOptions) -> Result<(f64, f64)> {
    for (name, v) in [("vmin", opts.vmin), ("vmax", opts.vmax)] {
        if let Some(v) = v.filter(|v| !v.is_finite()) {
            candle::bail!("{func}: opts.{name} is {v}; expected a finite number or None")
        }
    }
    let finite = panels.iter().flatten().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
    let (vmin, vmax) = (opts.vmin.unwrap_or(lo), opts.vmax.unwrap_or(hi));
    if vmin > vmax {
        candle::bail!(
            "{func}: the colour range is empty: vmin = {vmin} > vmax = {vmax} (opts.vmin {:?}, opts.vmax {:?}); expected vmin ≤ vmax",
            opts.vmin,
            opts.vmax
        )
    }
    Ok((vmin, vmax))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts() {
        assert_eq!(cell_text(0.4519), ".45");
        assert_eq!(cell_text(-0.4519), "-.45");
        assert_eq!(cell_text(0.001), "0");
        assert_eq!(cell_text(0.999), "1.0");
        assert_eq!(cell_text(12.4), "12");
        assert_eq!(cell_text(12345.0), "1e4");
        assert_eq!(tick(-0.0, 1.0), "0.000");
        assert_eq!(tick(-0.0001, 1.0), "0.000");
        assert_eq!(tick(5e-8, 1.0), "0.000");
        assert_eq!(tick(0.5, 1.0), "0.500");
        assert_eq!(tick(1e-5, 1e-5), "1.00e-5");
        assert_eq!(tick(0.0, 0.0), "0.000");
        assert_eq!(fit("abcdefghijklmnopq", 16), "abcdefghijklmno~");
    }

    #[test]
    fn colormap_ends() {
        assert_eq!(colormap(0.0), [0x44, 0x01, 0x54]);
        assert_eq!(colormap(1.0), [0xfd, 0xe7, 0x25]);
        assert_eq!(colormap(2.0), colormap(1.0));
        assert_eq!(colormap(-1.0), colormap(0.0));
    }
}
