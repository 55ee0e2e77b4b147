//! [`LinePlot::to_png`]: the layout rasterised with the crate's canvas and bitmap font.

use candle::Result;

use super::layout::{stroke, Layout, CH, CW, GAP, GRID, INK, MARGIN, MARKER, SCALE, SWATCH, TICK};
use super::LinePlot;
use crate::canvas::{chars, Canvas, Rect};

impl Layout {
    /// The PNG bytes of `p` drawn with this layout.
    pub(super) fn png(&self, p: &LinePlot) -> Result<Vec<u8>> {
        let mut c = Canvas::new(self.width as u32, self.height as u32);
        let r = self.plot;
        for (t, _) in &self.x.ticks {
            c.fill(self.x_tick(*t), r.y, 1, r.h, GRID);
        }
        for (t, _) in &self.y.ticks {
            c.fill(r.x, self.y_tick(*t), r.w, 1, GRID);
        }
        let h = MARKER / 2;
        for (i, s) in p.series.iter().enumerate() {
            let rgb = p.color_of(i);
            let pts = self.pixels(s, p.log_y);
            let mut phase = 0;
            for w in pts.windows(2) {
                c.line(w[0], w[1], r, stroke(s.style), rgb, &mut phase);
            }
            if s.markers || pts.len() == 1 {
                for &(x, y) in pts.iter().filter(|p| self.marker_visible(p.0, p.1)) {
                    let (x, y) = (x.round() as i64, y.round() as i64);
                    c.fill_in(x - h, y - h, MARKER, MARKER, rgb, r);
                }
            }
        }
        // The frame, just outside the plot area, and the ticks outside the frame.
        c.fill(r.x - 1, r.y - 1, r.w + 2, 1, INK);
        c.fill(r.x - 1, r.y + r.h, r.w + 2, 1, INK);
        c.fill(r.x - 1, r.y - 1, 1, r.h + 2, INK);
        c.fill(r.x + r.w, r.y - 1, 1, r.h + 2, INK);
        for (t, _) in &self.x.ticks {
            c.fill(self.x_tick(*t), r.y + r.h + 1, 1, TICK, INK);
        }
        for (t, _) in &self.y.ticks {
            c.fill(r.x - 1 - TICK, self.y_tick(*t), TICK, 1, INK);
        }
        let (tick_top, xlab_top) = self.below();
        for (left, label) in self.x_labels() {
            c.text(left, tick_top, label, SCALE, INK);
        }
        let right = r.x - 1 - TICK - GAP;
        for (row, label) in self.y_labels() {
            let w = chars(label) as i64 * CW;
            c.text(right - w, row - CH / 2, label, SCALE, INK);
        }
        if !self.x_label.is_empty() {
            let w = chars(&self.x_label) as i64 * CW;
            c.text(r.x + (r.w - w) / 2, xlab_top, &self.x_label, SCALE, INK);
        }
        if !self.y_label.is_empty() {
            let w = chars(&self.y_label) as i64 * CW;
            c.text_up(MARGIN, r.y + (r.h + w) / 2, &self.y_label, SCALE, INK);
        }
        let image = Rect {
            x: 0,
            y: 0,
            w: self.width,
            h: self.height,
        };
        for (i, (x, y, name)) in self.legend.iter().enumerate() {
            let s = &p.series[i];
            let rgb = p.color_of(i);
            let mid = y + CH / 2 - 1;
            let (a, b) = (
                (*x as f64, mid as f64),
                ((x + SWATCH - 1) as f64, mid as f64),
            );
            c.line(a, b, image, stroke(s.style), rgb, &mut 0);
            if s.markers {
                c.fill(x + SWATCH / 2 - h, mid - h, MARKER, MARKER, rgb);
            }
            c.text(x + SWATCH + GAP, *y, name, SCALE, INK);
        }
        if let Some(t) = &self.title {
            let w = chars(t) as i64 * CW;
            c.text((self.width - w) / 2, MARGIN, t, SCALE, INK);
        }
        c.encode()
    }
}
