//! A heatmap's input validated and its layout computed once (the module docs of
//! [`heatmap`](super) give every size), shared by the PNG and SVG writers.

use candle::{DType, Result, Tensor};

use super::text::{cell_text, plot_tick};
use super::{colormap, HeatmapOptions};
pub(super) use crate::canvas::INK;
use crate::canvas::{chars, fit, MAX_PIXELS};
use crate::font::{ADVANCE, DESCENT, GLYPH_H};

/// Text scale for labels, titles and ticks: the 5×7 font at ×2.
pub(super) const SCALE: u32 = 2;
/// Width of one label character, in pixels.
pub(super) const CW: u32 = ADVANCE * SCALE;
/// Height of one label line, in pixels.
pub(super) const CH: u32 = GLYPH_H * SCALE;
pub(super) const MARGIN: u32 = 8;
pub(super) const GAP: u32 = 6;
pub(super) const BAR_GAP: u32 = 12;
pub(super) const BAR_W: u32 = 16;
pub(super) const PANEL_GAP: u32 = 16;
/// Pixels a label needs across its line: the line and the descenders.
pub(super) const LINE: u32 = CH + DESCENT * SCALE;
/// Tall enough for the min and max ticks not to overlap on a one-row matrix.
pub(super) const MIN_BAR_H: u32 = 2 * CH + 8;
pub(super) const MAX_LABEL: usize = 16;
pub(super) const MAX_PANEL_TITLE: usize = 24;
pub(super) const MAX_TITLE: usize = 100;
/// Values are printed in matrices up to this many rows and columns.
pub(super) const MAX_VALUES_SIDE: usize = 16;
pub(super) const GREY: [u8; 3] = [128, 128, 128];

/// Everything needed to draw, validated once and shared by the PNG and SVG writers.
pub(super) struct Plot {
    pub(super) l: usize,
    pub(super) s: usize,
    /// One row-major `L·S` buffer per panel.
    pub(super) panels: Vec<Vec<f64>>,
    /// Full labels (for SVG `<title>`s) and their fitted forms (drawn).
    pub(super) rows: Vec<String>,
    pub(super) cols: Vec<String>,
    pub(super) rows_fit: Vec<String>,
    pub(super) cols_fit: Vec<String>,
    pub(super) titles_fit: Vec<String>,
    pub(super) title_fit: Option<String>,
    pub(super) vmin: f64,
    pub(super) vmax: f64,
    pub(super) show_values: bool,
    pub(super) cell: u32,
    // Layout (module docs).
    pub(super) ncols: u32,
    pub(super) rotated: bool,
    pub(super) col_label_h: u32,
    pub(super) panel_title_h: u32,
    pub(super) cells_x: u32,
    pub(super) cells_y: u32,
    pub(super) panel_w: u32,
    pub(super) panel_h: u32,
    pub(super) block_w: u32,
    pub(super) title_h: u32,
    pub(super) bar_h: u32,
    pub(super) width: u32,
    pub(super) height: u32,
}

impl Plot {
    pub(super) fn new(
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
    pub(super) fn panel_xy(&self, p: usize) -> (u32, u32) {
        let (col, row) = (p as u32 % self.ncols, p as u32 / self.ncols);
        (
            MARGIN + col * (self.panel_w + PANEL_GAP),
            MARGIN + self.title_h + row * (self.panel_h + PANEL_GAP),
        )
    }

    pub(super) fn bar_xy(&self) -> (u32, u32) {
        (
            MARGIN + self.block_w + BAR_GAP,
            MARGIN + self.title_h + self.cells_y,
        )
    }

    /// Draw every k-th row label and rotated column label, so labels on narrow cells do not
    /// overlap (module docs).
    pub(super) fn label_stride(&self) -> usize {
        LINE.div_ceil(self.cell).max(1) as usize
    }

    pub(super) fn tick(&self, v: f64) -> String {
        plot_tick(v, self.vmin, self.vmax)
    }

    pub(super) fn color(&self, v: f64) -> [u8; 3] {
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
    pub(super) fn value_text(&self, v: f64) -> Option<String> {
        if !self.show_values {
            return None;
        }
        let text = cell_text(v);
        let fits = chars(&text) * ADVANCE <= self.cell.saturating_sub(4)
            && GLYPH_H <= self.cell.saturating_sub(4);
        fits.then_some(text)
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
