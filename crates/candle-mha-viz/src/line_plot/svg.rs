//! [`LinePlot::to_svg`]: the layout as an SVG document. Lines keep their sub-pixel positions
//! (the PNG rounds them) and are clipped to the plot area before they are written.

use std::fmt::Write as _;

use super::layout::{
    Layout, CH, CW, DASH, GAP, GRID, INK, LINE_W, MARGIN, MARKER, SWATCH, TICK, WHITE,
};
use super::{LinePlot, LineStyle};
use crate::canvas::{chars, clip_segment, hex};
use crate::escape::xml_escape;

impl Layout {
    /// The SVG document of `p` drawn with this layout.
    pub(super) fn svg(&self, p: &LinePlot) -> String {
        let (w, h, r) = (self.width, self.height, self.plot);
        let ink = hex(INK);
        let mut o = String::new();
        // `write!` to a String cannot fail.
        let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="monospace">"#
        );
        let _ = writeln!(
            o,
            r#"<defs><clipPath id="plot-area"><rect x="{}" y="{}" width="{}" height="{}"/></clipPath></defs>"#,
            r.x, r.y, r.w, r.h
        );
        let _ = writeln!(
            o,
            r#"<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="{}"/>"#,
            hex(WHITE)
        );
        // Baseline 11 px below a text line's top: the 14-px line of the PNG.
        let text = |o: &mut String, x: i64, y: i64, anchor: &str, s: &str| {
            let _ = writeln!(
                o,
                r#"<text x="{x}" y="{}" font-size="14" text-anchor="{anchor}" fill="{ink}">{}</text>"#,
                y + 11,
                xml_escape(s)
            );
        };
        // 1-px lines through pixel centres.
        let hline = |o: &mut String, class: &str, x: i64, y: i64, len: i64, rgb: [u8; 3]| {
            let _ = writeln!(
                o,
                r#"<line class="{class}" x1="{x}" y1="{y}.5" x2="{}" y2="{y}.5" stroke="{}" stroke-width="1"/>"#,
                x + len,
                hex(rgb)
            );
        };
        let vline = |o: &mut String, class: &str, x: i64, y: i64, len: i64, rgb: [u8; 3]| {
            let _ = writeln!(
                o,
                r#"<line class="{class}" x1="{x}.5" y1="{y}" x2="{x}.5" y2="{}" stroke="{}" stroke-width="1"/>"#,
                y + len,
                hex(rgb)
            );
        };
        for (t, _) in &self.x.ticks {
            vline(&mut o, "grid", self.x_tick(*t), r.y, r.h, GRID);
        }
        for (t, _) in &self.y.ticks {
            hline(&mut o, "grid", r.x, self.y_tick(*t), r.w, GRID);
        }
        let bounds = (
            r.x as f64 - 1.0,
            r.y as f64 - 1.0,
            (r.x + r.w) as f64,
            (r.y + r.h) as f64,
        );
        // The PNG's 2-pixel pen covers [x, x + 2): the SVG stroke is centred on x + 1, and so
        // are the markers.
        let half = MARKER as f64 / 2.0;
        for (i, s) in p.series.iter().enumerate() {
            let color = hex(p.color_of(i));
            let _ = writeln!(
                o,
                r#"<g class="series" clip-path="url(#plot-area)"><title>{}</title>"#,
                xml_escape(&s.name)
            );
            let pts = self.pixels(s, p.log_y);
            for line in clipped_polylines(&pts, bounds) {
                let coords: Vec<String> = line
                    .iter()
                    .map(|(x, y)| format!("{:.2},{:.2}", x + 1.0, y + 1.0))
                    .collect();
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="{LINE_W}"{} stroke-linejoin="round" points="{}"/>"#,
                    dash(s.style),
                    coords.join(" ")
                );
            }
            if s.markers || pts.len() == 1 {
                for &(x, y) in pts.iter().filter(|p| self.marker_visible(p.0, p.1)) {
                    let _ = writeln!(
                        o,
                        r#"<rect class="marker" x="{:.2}" y="{:.2}" width="{MARKER}" height="{MARKER}" fill="{color}"/>"#,
                        x + 1.0 - half,
                        y + 1.0 - half
                    );
                }
            }
            let _ = writeln!(o, "</g>");
        }
        let _ = writeln!(
            o,
            r#"<rect class="frame" x="{}.5" y="{}.5" width="{}" height="{}" fill="none" stroke="{ink}" stroke-width="1"/>"#,
            r.x - 1,
            r.y - 1,
            r.w + 1,
            r.h + 1
        );
        for (t, _) in &self.x.ticks {
            vline(&mut o, "tick", self.x_tick(*t), r.y + r.h + 1, TICK, INK);
        }
        for (t, _) in &self.y.ticks {
            hline(&mut o, "tick", r.x - 1 - TICK, self.y_tick(*t), TICK, INK);
        }
        let (tick_top, xlab_top) = self.below();
        for (left, label) in self.x_labels() {
            // Centred where the PNG's label is (monospace fonts differ in width).
            let centre = left + chars(label) as i64 * CW / 2;
            text(&mut o, centre, tick_top, "middle", label);
        }
        for (row, label) in self.y_labels() {
            text(&mut o, r.x - 1 - TICK - GAP, row - CH / 2, "end", label);
        }
        if !self.x_label.is_empty() {
            text(&mut o, r.x + r.w / 2, xlab_top, "middle", &self.x_label);
        }
        if !self.y_label.is_empty() {
            // rotate(-90) turns the text to read upwards; its baseline 11 px right of MARGIN
            // puts the glyphs where the PNG's are.
            let _ = writeln!(
                o,
                r#"<text transform="translate({},{}) rotate(-90)" font-size="14" text-anchor="middle" fill="{ink}">{}</text>"#,
                MARGIN + 11,
                r.y + r.h / 2,
                xml_escape(&self.y_label)
            );
        }
        let _ = writeln!(o, r#"<g class="legend">"#);
        for (i, (x, y, name)) in self.legend.iter().enumerate() {
            let s = &p.series[i];
            let color = hex(p.color_of(i));
            let mid = y + CH / 2;
            let _ = writeln!(
                o,
                r#"<line x1="{x}" y1="{mid}" x2="{}" y2="{mid}" stroke="{color}" stroke-width="{LINE_W}"{}/>"#,
                x + SWATCH,
                dash(s.style)
            );
            if s.markers {
                let _ = writeln!(
                    o,
                    r#"<rect class="marker" x="{}" y="{}" width="{MARKER}" height="{MARKER}" fill="{color}"/>"#,
                    x + SWATCH / 2 - MARKER / 2,
                    mid - 1 - MARKER / 2
                );
            }
            text(&mut o, x + SWATCH + GAP, *y, "start", name);
        }
        let _ = writeln!(o, "</g>");
        if let Some(t) = &self.title {
            text(&mut o, w / 2, MARGIN, "middle", t);
        }
        let _ = writeln!(o, "</svg>");
        o
    }
}

/// The `stroke-dasharray` attribute of a style (with its leading space), or nothing.
fn dash(style: LineStyle) -> String {
    match style {
        LineStyle::Solid => String::new(),
        LineStyle::Dashed => format!(r#" stroke-dasharray="{} {}""#, DASH.0, DASH.1),
    }
}

/// The parts of the polyline through `pts` inside `bounds`: each segment clipped, consecutive
/// clipped segments that meet joined into one polyline.
fn clipped_polylines(pts: &[(f64, f64)], bounds: (f64, f64, f64, f64)) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    for w in pts.windows(2) {
        let Some((a, b)) = clip_segment(w[0], w[1], bounds) else {
            continue;
        };
        match out.last_mut() {
            Some(line) if line.last() == Some(&a) => line.push(b),
            _ => out.push(vec![a, b]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polylines_split_where_the_line_leaves_the_box() {
        let b = (0.0, 0.0, 10.0, 10.0);
        let pts = [(1.0, 1.0), (5.0, 5.0), (5.0, 20.0), (8.0, 20.0), (8.0, 5.0)];
        let lines = clipped_polylines(&pts, b);
        assert_eq!(
            lines,
            vec![
                vec![(1.0, 1.0), (5.0, 5.0), (5.0, 10.0)],
                vec![(8.0, 10.0), (8.0, 5.0)]
            ]
        );
        assert!(clipped_polylines(&[(1.0, 1.0)], b).is_empty());
    }
}
