//! Headless line charts (training curves: loss against step, …) as RGB PNG or SVG.
//!
//! Text is the crate's own 5×7 bitmap font at scale 2 (as in [`heatmap`](super::heatmap)),
//! lines are drawn without anti-aliasing, and ticks and pixel positions use only IEEE
//! arithmetic (see `axis.rs`), so a PNG is byte-for-byte the same on every machine. The SVG
//! uses the same layout with `monospace` text.
//!
//! # Data
//! Each [`Series`] is drawn in the order of its points (not sorted), a line through its
//! *drawable* points: both coordinates finite, and `y > 0` on a log-scale y axis. Other points
//! (NaN, ±inf, e.g. a diverged loss) are skipped, not errors: the line joins the drawable
//! points on either side. A series with one drawable point is drawn as a marker. Both axes
//! span the drawable points of all series (padded, and widened when degenerate; see `axis.rs`
//! for the rules and the 1-2-5 ticks), except for the ends given by [`LinePlot::y_min`] /
//! [`LinePlot::y_max`]; lines are clipped to the plot area.
//!
//! # Colours
//! Series `i` is drawn in its own [`Series::color`], else `PALETTE[i mod 10]` (matplotlib's
//! `tab10`); text and the frame in `#141414`, grid lines in `#e6e6e6`, on white.
//!
//! # Layout (in pixels)
//! Constants: a text character is `CW = 12` wide and `CH = 14` high (as in heatmaps);
//! `MARGIN = 8`, `GAP = 6`, `TICK = 4`, a legend row `LINE = 18` high, a legend swatch
//! `SWATCH = 24` wide, `ENTRY_GAP = 18` between legend entries, `RIGHT_PAD = 36`; lines are
//! 2 pixels wide, markers 7 × 7, dashes 8 on and 5 off.
//!
//! ```text
//! title         centred, top at MARGIN (cut to fit the width, at most 100 characters)
//! title_h       = CH + GAP with a title, else 0
//! legend        entries "swatch GAP name" (names cut to at most 40 characters and the width)
//!               left to right, ENTRY_GAP apart, a new row when the next one would pass
//!               width − 2·MARGIN; each row centred; rows·LINE high, its top at
//! legend_top    = height − MARGIN − rows·LINE
//! xlab_h        = CH + GAP with an x label, else 0;  ylab_w = CH + GAP with a y label, else 0
//! plot.y        = MARGIN + title_h + CH/2
//! plot.h        = legend_top − plot.y − (1 + TICK + GAP + CH + 2·GAP) − xlab_h   (≥ 32)
//! ytick_w       = the longest y tick label · CW
//! plot.x        = MARGIN + ylab_w + ytick_w + GAP + TICK + 1
//! plot.w        = width − RIGHT_PAD − 1 − plot.x                                  (≥ 32)
//! ```
//! The plot area is `[plot.x, plot.x + plot.w) × [plot.y, plot.y + plot.h)`, framed by a
//! 1-pixel line just outside it. A value at fraction `f` of an axis range lies at
//! `plot.x + round(f·(plot.w − 1))` across and `plot.y + round((1 − f)·(plot.h − 1))` down
//! (the pen's top-left pixel). Below the frame: ticks, x tick labels (centred, kept inside the
//! image), the x label centred under the plot area, a `GAP`, then the legend. The y label
//! reads bottom-to-top at x = MARGIN. About one y tick per 48 pixels (3 to 10) and one x tick
//! per 64 pixels, fewer when the x labels would touch; a label that would overlap the
//! previous one is left out.

mod axis;
mod layout;
mod png;
mod svg;

use candle::Result;

use layout::Layout;

/// The series colours, in order: matplotlib's `tab10` (the Tableau 10 palette), distinct
/// qualitative hues; series `i` gets entry `i mod 10` unless it sets its own colour.
///
/// PyTorch equivalent: none (matplotlib's default colour cycle, `plt.cm.tab10`).
pub const PALETTE: [[u8; 3]; 10] = [
    [0x1f, 0x77, 0xb4], // blue
    [0xff, 0x7f, 0x0e], // orange
    [0x2c, 0xa0, 0x2c], // green
    [0xd6, 0x27, 0x28], // red
    [0x94, 0x67, 0xbd], // purple
    [0x8c, 0x56, 0x4b], // brown
    [0xe3, 0x77, 0xc2], // pink
    [0x7f, 0x7f, 0x7f], // grey
    [0xbc, 0xbd, 0x22], // olive
    [0x17, 0xbe, 0xcf], // cyan
];

/// How a series' line is drawn.
///
/// PyTorch equivalent: none (matplotlib's `linestyle="-"` / `"--"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LineStyle {
    /// A continuous line.
    #[default]
    Solid,
    /// 8 pixels on, 5 off (SVG: `stroke-dasharray="8 5"`).
    Dashed,
}

/// One named line of a [`LinePlot`].
///
/// PyTorch equivalent: none (the arguments of one matplotlib `plt.plot(x, y, label=name)`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// `(x, y)` points, joined in this order; non-finite ones are skipped (module docs).
    pub points: Vec<(f64, f64)>,
    /// Solid or dashed.
    pub style: LineStyle,
    /// Draw a 7 × 7 square at each drawable point too.
    pub markers: bool,
    /// The colour; `None`: `PALETTE[i mod 10]` for the `i`-th series.
    pub color: Option<[u8; 3]>,
}

impl Series {
    /// A solid line without markers in the palette colour.
    ///
    /// PyTorch equivalent: none (matplotlib's `plt.plot(xs, ys, label=name)`).
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            ..Self::default()
        }
    }

    /// The same series, dashed.
    ///
    /// PyTorch equivalent: none (matplotlib's `linestyle="--"`).
    pub fn dashed(mut self) -> Self {
        self.style = LineStyle::Dashed;
        self
    }

    /// The same series with a marker at each point.
    ///
    /// PyTorch equivalent: none (matplotlib's `marker="s"`).
    pub fn with_markers(mut self) -> Self {
        self.markers = true;
        self
    }

    /// The same series in colour `rgb`.
    ///
    /// PyTorch equivalent: none (matplotlib's `color=`).
    pub fn with_color(mut self, rgb: [u8; 3]) -> Self {
        self.color = Some(rgb);
        self
    }
}

/// A line chart: series against shared x and y axes, with ticks, labels, a legend and a
/// title, rendered headless to PNG ([`to_png`](Self::to_png)) or SVG
/// ([`to_svg`](Self::to_svg)). Save either with [`heatmap::save`](super::heatmap::save).
///
/// PyTorch equivalent: none (matplotlib's `plt.plot` + `xlabel`/`ylabel`/`legend`/`savefig`).
///
/// ```
/// use candle_mha_viz::{LinePlot, Series};
/// # fn main() -> candle::Result<()> {
/// let mut plot = LinePlot::new(640, 400);
/// plot.title = Some("loss".into());
/// plot.x_label = "step".into();
/// plot.series.push(Series::new("train", vec![(1.0, 3.2), (2.0, 2.5), (3.0, 2.1)]));
/// plot.series.push(Series::new("val", vec![(2.0, 2.7)]).dashed().with_markers());
/// let png = plot.to_png()?;
/// assert_eq!(&png[1..4], b"PNG");
/// assert!(plot.to_svg()?.contains("<polyline"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LinePlot {
    /// A line centred above the chart (none when `None` or empty).
    pub title: Option<String>,
    /// Text under the x axis (none when empty).
    pub x_label: String,
    /// Text left of the y axis, reading upwards (none when empty).
    pub y_label: String,
    /// The lines, drawn in order (later ones on top) and listed in the legend in order.
    pub series: Vec<Series>,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// A log10 y axis (points with `y ≤ 0` are then skipped).
    pub log_y: bool,
    /// The bottom of the y axis; `None`: from the data.
    pub y_min: Option<f64>,
    /// The top of the y axis; `None`: from the data.
    pub y_max: Option<f64>,
}

impl Default for LinePlot {
    fn default() -> Self {
        Self::new(800, 500)
    }
}

impl LinePlot {
    /// An empty `width × height` chart: no title, labels or series, linear axes.
    ///
    /// PyTorch equivalent: none (matplotlib's `plt.figure(figsize=…)`).
    pub fn new(width: u32, height: u32) -> Self {
        Self {
            title: None,
            x_label: String::new(),
            y_label: String::new(),
            series: Vec::new(),
            width,
            height,
            log_y: false,
            y_min: None,
            y_max: None,
        }
    }

    /// The colour series `i` is drawn in: its own, else `PALETTE[i mod 10]`.
    ///
    /// PyTorch equivalent: none (matplotlib's `line.get_color()`).
    pub fn color_of(&self, i: usize) -> [u8; 3] {
        self.series
            .get(i)
            .and_then(|s| s.color)
            .unwrap_or(PALETTE[i % PALETTE.len()])
    }

    /// The chart as an RGB PNG of exactly `width × height` pixels (module docs for the
    /// layout).
    ///
    /// PyTorch equivalent: none (matplotlib's `savefig("x.png")`).
    ///
    /// # Errors
    /// No series, or no drawable point in any series; `y_min`/`y_max` not finite, not
    /// increasing, or `≤ 0` on a log axis; a `width` or `height` that leaves the plot area
    /// under 32 pixels (the message gives the smallest that fits) or an image above 64 Mpx;
    /// data spanning more than f64 can hold.
    pub fn to_png(&self) -> Result<Vec<u8>> {
        Layout::new("LinePlot::to_png", self)?.png(self)
    }

    /// The chart as an SVG document with [`to_png`](Self::to_png)'s layout: a
    /// `<g class="series">` per series holding its name as `<title>`, its clipped line as
    /// `<polyline>`s and its markers as `<rect class="marker">`s; `<text>` ticks, labels,
    /// legend and title; the root's `width`/`height` are the PNG's.
    ///
    /// PyTorch equivalent: none (matplotlib's `savefig("x.svg")`).
    ///
    /// # Errors
    /// As [`to_png`](Self::to_png).
    pub fn to_svg(&self) -> Result<String> {
        Ok(Layout::new("LinePlot::to_svg", self)?.svg(self))
    }
}
