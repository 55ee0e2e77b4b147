//! Drawing a heatmap's layout as an RGB PNG with the crate's bitmap font.

use candle::Result;

use super::colormap;
use super::layout::{Plot, BAR_W, CH, CW, GAP, INK, MARGIN, SCALE};
use super::text::text_on;
use crate::canvas::{chars, Canvas};
use crate::font::{ADVANCE, GLYPH_H};

impl Plot {
    pub(super) fn png(&self) -> Result<Vec<u8>> {
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
}
