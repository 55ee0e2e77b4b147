//! Writing a heatmap's layout as an SVG document (the PNG's layout, `monospace` text).

use std::fmt::Write as _;

use super::colormap;
use super::layout::{Plot, BAR_W, CH, CW, GAP, INK, MARGIN};
use super::text::{full_value, text_on};
use crate::canvas::{chars, hex};
use crate::escape::xml_escape;

impl Plot {
    pub(super) fn svg(&self) -> String {
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
