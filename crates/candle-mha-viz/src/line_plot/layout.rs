//! Where everything of a [`LinePlot`] goes (the layout in the module docs), validated once and
//! shared by the PNG and SVG writers.

use candle::Result;

use super::axis::Axis;
use super::{LinePlot, LineStyle, Series};
use crate::canvas::{chars, fit, Rect, Stroke, MAX_PIXELS};
pub(super) use crate::canvas::{INK, WHITE};
use crate::font::{ADVANCE, DESCENT, GLYPH_H};

/// Text scale: the 5×7 font at ×2.
pub(super) const SCALE: u32 = 2;
/// Width of one text character, in pixels.
pub(super) const CW: i64 = (ADVANCE * SCALE) as i64;
/// Height of one text line, in pixels.
pub(super) const CH: i64 = (GLYPH_H * SCALE) as i64;
pub(super) const MARGIN: i64 = 8;
pub(super) const GAP: i64 = 6;
/// Length of a tick mark outside the frame.
pub(super) const TICK: i64 = 4;
/// A legend row: a text line and its descenders.
pub(super) const LINE: i64 = CH + (DESCENT * SCALE) as i64;
/// Length of the line sample before a legend name.
pub(super) const SWATCH: i64 = 24;
const ENTRY_GAP: i64 = 18;
/// Room right of the plot area for the last x tick label.
const RIGHT_PAD: i64 = 3 * CW;
/// The smallest plot area side, in pixels.
const MIN_PLOT: i64 = 32;
/// Side of a square marker.
pub(super) const MARKER: i64 = 7;
/// Pen width of a series line.
pub(super) const LINE_W: i64 = 2;
/// Dash pattern of [`LineStyle::Dashed`]: pixels on, pixels off.
pub(super) const DASH: (u32, u32) = (8, 5);
const MAX_TITLE: usize = 100;
const MAX_NAME: usize = 40;
/// About one y tick per this many pixels (3 to 10 ticks).
const Y_TICK_PX: i64 = 48;
/// About one x tick per this many pixels, fewer when the labels would touch.
const X_TICK_PX: i64 = 64;
pub(super) const GRID: [u8; 3] = [230, 230, 230];

/// Everything placed.
pub(super) struct Layout {
    pub(super) width: i64,
    pub(super) height: i64,
    /// The fitted title, if drawn.
    pub(super) title: Option<String>,
    /// (x, top y, fitted name) of each legend entry, one per series.
    pub(super) legend: Vec<(i64, i64, String)>,
    pub(super) plot: Rect,
    pub(super) x: Axis,
    pub(super) y: Axis,
    /// The fitted axis labels (empty: not drawn).
    pub(super) x_label: String,
    pub(super) y_label: String,
}

impl Layout {
    /// Validates `p` and places everything; `func` names the caller in errors.
    pub(super) fn new(func: &str, p: &LinePlot) -> Result<Self> {
        if p.series.is_empty() {
            candle::bail!(
                "{func}: `series` is empty; expected at least one series with a finite point"
            )
        }
        for (name, v) in [("y_min", p.y_min), ("y_max", p.y_max)] {
            match v {
                Some(v) if !v.is_finite() => {
                    candle::bail!("{func}: `{name}` is {v}; expected a finite number or None")
                }
                Some(v) if p.log_y && v <= 0.0 => candle::bail!(
                    "{func}: `{name}` is {v} on a log-scale y axis; expected a positive number or None"
                ),
                _ => {}
            }
        }
        if let (Some(lo), Some(hi)) = (p.y_min, p.y_max) {
            if lo >= hi {
                candle::bail!(
                    "{func}: `y_min` = {lo} is not below `y_max` = {hi}; expected y_min < y_max"
                )
            }
        }
        let mut xr = (f64::INFINITY, f64::NEG_INFINITY);
        let mut yr = xr;
        for (x, y) in p.series.iter().flat_map(|s| drawable(s, p.log_y)) {
            xr = (xr.0.min(x), xr.1.max(x));
            yr = (yr.0.min(y), yr.1.max(y));
        }
        if xr.0 > xr.1 {
            let names: Vec<&str> = p.series.iter().map(|s| s.name.as_str()).collect();
            let need = match p.log_y {
                true => "a finite x and a finite positive y (log-scale y)",
                false => "a finite x and y",
            };
            candle::bail!(
                "{func}: no point of `series` ({} series: {names:?}) has {need}; non-finite points are skipped, so there is nothing to draw",
                p.series.len()
            )
        }
        let (width, height) = (p.width as i64, p.height as i64);
        if width as u64 * height as u64 > MAX_PIXELS {
            candle::bail!(
                "{func}: `width` × `height` = {width}×{height} pixels is above the {MAX_PIXELS}-pixel limit"
            )
        }

        let room = (width - 2 * MARGIN).max(0);
        let title = p
            .title
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| fit(t, MAX_TITLE.min((room / CW) as usize)));
        let title_h = if title.is_some() { CH + GAP } else { 0 };
        let (legend, rows) = legend(p, room);
        let legend_top = height - MARGIN - rows * LINE;
        let legend = legend
            .into_iter()
            .map(|(x, r, name)| (x, legend_top + r * LINE, name))
            .collect();
        let xlab_h = if p.x_label.is_empty() { 0 } else { CH + GAP };
        let ylab_w = if p.y_label.is_empty() { 0 } else { CH + GAP };
        let plot_y = MARGIN + title_h + CH / 2;
        let plot_h = legend_top - plot_y - (1 + TICK + GAP + CH + 2 * GAP) - xlab_h;
        if plot_h < MIN_PLOT {
            candle::bail!(
                "{func}: `height` {height} leaves a plot area {plot_h} pixels high beside the title, axis labels and {rows} legend row(s); expected height ≥ {}",
                height + MIN_PLOT - plot_h
            )
        }
        let y_target = (plot_h / Y_TICK_PX).clamp(3, 10) as u32;
        let y = Axis::new(yr.0, yr.1, (p.y_min, p.y_max), p.log_y, y_target)
            .map_err(|e| candle::Error::Msg(format!("{func}: the y values of `series`: {e}")))?;
        let ytick_w = longest(&y) * CW;
        let plot_x = MARGIN + ylab_w + ytick_w + GAP + TICK + 1;
        let plot_w = width - RIGHT_PAD - 1 - plot_x;
        if plot_w < MIN_PLOT {
            candle::bail!(
                "{func}: `width` {width} leaves a plot area {plot_w} pixels wide beside the y tick labels; expected width ≥ {}",
                width + MIN_PLOT - plot_w
            )
        }
        let mut target = (plot_w / X_TICK_PX).max(1) as u32;
        let x = loop {
            let x = Axis::new(xr.0, xr.1, (None, None), false, target).map_err(|e| {
                candle::Error::Msg(format!("{func}: the x values of `series`: {e}"))
            })?;
            let spacing = x.step / (x.hi - x.lo) * (plot_w - 1) as f64;
            if target == 1 || ((longest(&x) * CW + 2 * GAP) as f64) <= spacing {
                break x;
            }
            target -= 1;
        };
        let plot = Rect {
            x: plot_x,
            y: plot_y,
            w: plot_w,
            h: plot_h,
        };
        Ok(Self {
            width,
            height,
            title,
            legend,
            plot,
            x,
            y,
            x_label: fit(&p.x_label, (plot_w / CW) as usize),
            y_label: fit(&p.y_label, (plot_h / CW) as usize),
        })
    }

    /// The pixel column of axis fraction `f`, unrounded (unbounded for points outside the
    /// range); the PNG rounds it.
    fn px(&self, f: f64) -> f64 {
        self.plot.x as f64 + f * (self.plot.w - 1) as f64
    }

    /// The pixel row of axis fraction `f`, unrounded.
    fn py(&self, f: f64) -> f64 {
        self.plot.y as f64 + (1.0 - f) * (self.plot.h - 1) as f64
    }

    /// The pixel column of the x tick at axis-space `t`.
    pub(super) fn x_tick(&self, t: f64) -> i64 {
        self.px(self.x.frac_space(t)).round() as i64
    }

    /// The pixel row of the y tick at axis-space `t`.
    pub(super) fn y_tick(&self, t: f64) -> i64 {
        self.py(self.y.frac_space(t)).round() as i64
    }

    /// The (unrounded) pixel position of each drawable point of `s`.
    pub(super) fn pixels(&self, s: &Series, log_y: bool) -> Vec<(f64, f64)> {
        drawable(s, log_y)
            .map(|(x, y)| (self.px(self.x.frac_space(x)), self.py(self.y.frac_space(y))))
            .collect()
    }

    /// Whether a marker centred at pixel (`x`, `y`) can touch the plot area (markers far
    /// outside, even at infinite pixel positions, are not drawn).
    pub(super) fn marker_visible(&self, x: f64, y: f64) -> bool {
        let (r, m) = (self.plot, MARKER as f64);
        x > r.x as f64 - m
            && x < (r.x + r.w) as f64 + m
            && y > r.y as f64 - m
            && y < (r.y + r.h) as f64 + m
    }

    /// (left x, label) of the x tick labels drawn: centred on their tick, kept inside the
    /// image, none overlapping the previous one.
    pub(super) fn x_labels(&self) -> Vec<(i64, &str)> {
        let mut out: Vec<(i64, &str)> = Vec::new();
        for (t, label) in &self.x.ticks {
            let w = chars(label) as i64 * CW;
            let left = (self.x_tick(*t) - w / 2)
                .min(self.width - MARGIN - w)
                .max(0);
            if out
                .last()
                .is_none_or(|&(l, prev)| left >= l + chars(prev) as i64 * CW + GAP)
            {
                out.push((left, label));
            }
        }
        out
    }

    /// (pixel row, label) of the y tick labels drawn, bottom up, none overlapping.
    pub(super) fn y_labels(&self) -> Vec<(i64, &str)> {
        let mut out: Vec<(i64, &str)> = Vec::new();
        for (t, label) in &self.y.ticks {
            let row = self.y_tick(*t);
            if out.last().is_none_or(|&(prev, _)| prev - row >= LINE) {
                out.push((row, label));
            }
        }
        out
    }

    /// The tops of the x tick labels and of the x label.
    pub(super) fn below(&self) -> (i64, i64) {
        let ticks = self.plot.y + self.plot.h + 1 + TICK + GAP;
        (ticks, ticks + CH + GAP)
    }
}

/// The legend entries as (x, row, fitted name), each row centred in `room` pixels from
/// `MARGIN`, and the number of rows.
fn legend(p: &LinePlot, room: i64) -> (Vec<(i64, i64, String)>, i64) {
    let name_max = MAX_NAME.min(((room - SWATCH - GAP).max(0) / CW) as usize);
    // (x from the row's start, row, name), and each row's width.
    let mut entries = Vec::with_capacity(p.series.len());
    let mut row_w = vec![0i64];
    for s in &p.series {
        let name = fit(&s.name, name_max);
        let w = SWATCH + GAP + chars(&name) as i64 * CW;
        let mut used = *row_w.last().unwrap_or(&0);
        if used > 0 && used + ENTRY_GAP + w > room {
            row_w.push(0);
            used = 0;
        }
        let x = if used > 0 { used + ENTRY_GAP } else { 0 };
        entries.push((x, row_w.len() - 1, name));
        if let Some(last) = row_w.last_mut() {
            *last = x + w;
        }
    }
    let placed = entries
        .into_iter()
        .map(|(x, r, name)| {
            let left = MARGIN + (room - row_w[r]).max(0) / 2;
            (left + x, r as i64, name)
        })
        .collect();
    (placed, row_w.len() as i64)
}

/// The most characters of a tick label of `axis`.
fn longest(axis: &Axis) -> i64 {
    axis.ticks
        .iter()
        .map(|(_, l)| chars(l) as i64)
        .max()
        .unwrap_or(0)
}

/// The points of `s` that are drawn, in axis space (x, and y or log10 y).
pub(super) fn drawable(s: &Series, log_y: bool) -> impl Iterator<Item = (f64, f64)> + '_ {
    s.points
        .iter()
        .filter_map(move |&(x, y)| Some((Axis::space(false, x)?, Axis::space(log_y, y)?)))
}

/// The pen of a series line.
pub(super) fn stroke(style: LineStyle) -> Stroke {
    Stroke {
        width: LINE_W,
        dash: match style {
            LineStyle::Solid => None,
            LineStyle::Dashed => Some(DASH),
        },
    }
}
