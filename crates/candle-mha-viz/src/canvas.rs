//! The raster and text helpers shared by the PNG/SVG renderers ([`heatmap`](super::heatmap),
//! [`line_plot`](super::line_plot)): an RGB canvas with clipped drawing, text in the crate's
//! 5×7 bitmap font (`font.rs`), lines (Bresenham, thick, dashed, clipped to a rectangle), PNG
//! encoding, and label fitting. Pixels are set by integer arithmetic and IEEE `+ − × ÷` (no
//! libm, no anti-aliasing), so a PNG is byte-for-byte the same on every machine.

use candle::Result;

use super::font::{self, ADVANCE, DESCENT, GLYPH_H};

/// Refuse images above 64 Mpx (192 MiB of RGB) rather than exhaust memory on a typo.
pub(crate) const MAX_PIXELS: u64 = 1 << 26;

/// The page colour of every chart: what [`Canvas::new`] starts from.
pub(crate) const WHITE: [u8; 3] = [255, 255, 255];
/// Text, frames and outlines, on heatmaps and line charts alike (`#141414`).
pub(crate) const INK: [u8; 3] = [20, 20, 20];
/// Text on light cells of a heatmap.
pub(crate) const BLACK: [u8; 3] = [0, 0, 0];

/// `s` cut to at most `max` characters: the first `max − 1` and a `~` (empty for `max = 0`).
pub(crate) fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else if max == 0 {
        String::new()
    } else {
        s.chars().take(max - 1).chain(['~']).collect()
    }
}

/// The number of characters of `s` (each one glyph wide).
pub(crate) fn chars(s: &str) -> u32 {
    s.chars().count() as u32
}

/// `#rrggbb`.
pub(crate) fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2])
}

/// A half-open pixel rectangle `[x, x + w) × [y, y + h)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) x: i64,
    pub(crate) y: i64,
    pub(crate) w: i64,
    pub(crate) h: i64,
}

/// How [`Canvas::line`] strokes: a square pen `width` pixels wide and, for a dashed line,
/// `dash = (on, off)` pixels along the line's major axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stroke {
    pub(crate) width: i64,
    pub(crate) dash: Option<(u32, u32)>,
}

/// The part of the segment `a`–`b` inside the closed box `[x0, x1] × [y0, y1]`
/// (Liang–Barsky), or `None` when it misses the box. Non-finite coordinates give `None`.
pub(crate) fn clip_segment(
    a: (f64, f64),
    b: (f64, f64),
    (x0, y0, x1, y1): (f64, f64, f64, f64),
) -> Option<((f64, f64), (f64, f64))> {
    if ![a.0, a.1, b.0, b.1].iter().all(|v| v.is_finite()) {
        return None;
    }
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    if !dx.is_finite() || !dy.is_finite() {
        return None;
    }
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - x0),
        (dx, x1 - a.0),
        (-dy, a.1 - y0),
        (dy, y1 - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let t = q / p;
            if p < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
        }
    }
    (t0 <= t1).then_some((
        (a.0 + t0 * dx, a.1 + t0 * dy),
        (a.0 + t1 * dx, a.1 + t1 * dy),
    ))
}

/// An RGB raster with clipped drawing: anything outside the image is silently dropped.
pub(crate) struct Canvas {
    pub(crate) w: u32,
    pub(crate) h: u32,
    px: Vec<u8>,
}

impl Canvas {
    pub(crate) fn new(w: u32, h: u32) -> Self {
        Self {
            w,
            h,
            px: WHITE.repeat(w as usize * h as usize),
        }
    }

    pub(crate) fn set(&mut self, x: i64, y: i64, rgb: [u8; 3]) {
        if x >= 0 && y >= 0 && x < self.w as i64 && y < self.h as i64 {
            let i = (y as usize * self.w as usize + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&rgb);
        }
    }

    pub(crate) fn fill(&mut self, x: i64, y: i64, w: i64, h: i64, rgb: [u8; 3]) {
        for yy in y.max(0)..y.saturating_add(h).min(self.h as i64) {
            for xx in x.max(0)..x.saturating_add(w).min(self.w as i64) {
                self.set(xx, yy, rgb);
            }
        }
    }

    /// `s` with its top-left at (`x`, `y`), each font pixel a `scale`×`scale` square.
    pub(crate) fn text(&mut self, x: i64, y: i64, s: &str, scale: u32, rgb: [u8; 3]) {
        let sc = scale as i64;
        for (k, ch) in s.chars().enumerate() {
            let gx = x + k as i64 * (ADVANCE as i64) * sc;
            for fy in 0..GLYPH_H + DESCENT {
                for fx in 0..font::GLYPH_W {
                    if font::ink(ch, fx, fy) {
                        self.fill(gx + fx as i64 * sc, y + fy as i64 * sc, sc, sc, rgb);
                    }
                }
            }
        }
    }

    /// `s` rotated 90° anticlockwise (reading bottom to top): its first character's bottom-left
    /// corner at (`x`, `y_bottom`), the line extending upwards and `GLYPH_H·scale` to the right.
    pub(crate) fn text_up(&mut self, x: i64, y_bottom: i64, s: &str, scale: u32, rgb: [u8; 3]) {
        let sc = scale as i64;
        for (k, ch) in s.chars().enumerate() {
            let along = k as i64 * ADVANCE as i64 * sc;
            for fy in 0..GLYPH_H + DESCENT {
                for fx in 0..font::GLYPH_W {
                    if font::ink(ch, fx, fy) {
                        // Unrotated (u, v) = (along + fx, fy) → (x + v, y_bottom − u).
                        let u = along + fx as i64 * sc;
                        let v = fy as i64 * sc;
                        self.fill(x + v, y_bottom - u - (sc - 1), sc, sc, rgb);
                    }
                }
            }
        }
    }

    /// A filled `w × h` rectangle at (`x`, `y`), only where it overlaps `clip`.
    pub(crate) fn fill_in(&mut self, x: i64, y: i64, w: i64, h: i64, rgb: [u8; 3], clip: Rect) {
        let (x0, y0) = (x.max(clip.x), y.max(clip.y));
        let x1 = x.saturating_add(w).min(clip.x + clip.w);
        let y1 = y.saturating_add(h).min(clip.y + clip.h);
        self.fill(x0, y0, x1 - x0, y1 - y0, rgb);
    }

    /// A line from `a` to `b` (pixel coordinates, any finite or infinite values) drawn only
    /// inside `clip`: clipped first, then rounded to pixels and walked with Bresenham's
    /// algorithm, the pen's top-left corner at each pixel (shifted left/up by
    /// `(width − 1) / 2`). `phase` counts the pixels walked so far, so a dash pattern runs on
    /// across the segments of one polyline; pass the same counter to every segment.
    pub(crate) fn line(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        clip: Rect,
        stroke: Stroke,
        rgb: [u8; 3],
        phase: &mut u32,
    ) {
        let bounds = (
            clip.x as f64 - 1.0,
            clip.y as f64 - 1.0,
            (clip.x + clip.w) as f64,
            (clip.y + clip.h) as f64,
        );
        let Some((a, b)) = clip_segment(a, b, bounds) else {
            return;
        };
        let (mut x, mut y) = (a.0.round() as i64, a.1.round() as i64);
        let (x1, y1) = (b.0.round() as i64, b.1.round() as i64);
        let (dx, dy) = ((x1 - x).abs(), -(y1 - y).abs());
        let (sx, sy) = (if x < x1 { 1 } else { -1 }, if y < y1 { 1 } else { -1 });
        let mut err = dx + dy;
        let off = (stroke.width - 1) / 2;
        loop {
            let on = match stroke.dash {
                Some((on, gap)) => *phase % (on + gap).max(1) < on,
                None => true,
            };
            *phase = phase.wrapping_add(1);
            if on {
                self.fill_in(x - off, y - off, stroke.width, stroke.width, rgb, clip);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let err = |e: png::EncodingError| candle::Error::Msg(format!("PNG encoding failed: {e}"));
        {
            let mut enc = png::Encoder::new(&mut out, self.w, self.h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().map_err(err)?;
            writer.write_image_data(&self.px).map_err(err)?;
            writer.finish().map_err(err)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_cuts_with_a_tilde() {
        assert_eq!(fit("abcdefghijklmnopq", 16), "abcdefghijklmno~");
        assert_eq!(fit("abc", 3), "abc");
        assert_eq!(fit("abc", 0), "");
        assert_eq!(hex([255, 0, 16]), "#ff0010");
    }

    #[test]
    fn segments_are_clipped_to_the_box() {
        let b = (0.0, 0.0, 10.0, 10.0);
        assert_eq!(
            clip_segment((-10.0, 5.0), (20.0, 5.0), b),
            Some(((0.0, 5.0), (10.0, 5.0)))
        );
        assert_eq!(clip_segment((-10.0, -5.0), (20.0, -5.0), b), None);
        assert_eq!(clip_segment((f64::NAN, 0.0), (1.0, 1.0), b), None);
        assert_eq!(
            clip_segment((2.0, 2.0), (2.0, 2.0), b),
            Some(((2.0, 2.0), (2.0, 2.0)))
        );
        // A far-away endpoint is clipped before any pixel is walked.
        let ((_, _), (x, y)) = clip_segment((5.0, 5.0), (5.0, 1e300), b).unwrap();
        assert_eq!((x, y), (5.0, 10.0));
    }

    #[test]
    fn lines_stay_inside_the_clip_rectangle() {
        let mut c = Canvas::new(20, 20);
        let clip = Rect {
            x: 5,
            y: 5,
            w: 10,
            h: 10,
        };
        let stroke = Stroke {
            width: 2,
            dash: None,
        };
        let mut phase = 0;
        c.line(
            (0.0, 0.0),
            (1e300, 1e300),
            clip,
            stroke,
            [0, 0, 0],
            &mut phase,
        );
        for y in 0..20 {
            for x in 0..20 {
                let i = (y * 20 + x) * 3;
                let ink = c.px[i] == 0;
                assert!(
                    !ink || ((5..15).contains(&x) && (5..15).contains(&y)),
                    "({x}, {y})"
                );
                // The diagonal inside the box is drawn.
                if (5..15).contains(&x) && x == y {
                    assert!(ink, "({x}, {y})");
                }
            }
        }
        // A dashed horizontal line: 3 on, 2 off.
        let mut c = Canvas::new(20, 1);
        let (clip, mut phase) = (
            Rect {
                x: 0,
                y: 0,
                w: 20,
                h: 1,
            },
            0,
        );
        let dashed = Stroke {
            width: 1,
            dash: Some((3, 2)),
        };
        c.line((0.0, 0.0), (9.0, 0.0), clip, dashed, [0, 0, 0], &mut phase);
        let row: String = (0..10)
            .map(|x| if c.px[x * 3] == 0 { '#' } else { '.' })
            .collect();
        assert_eq!(row, "###..###..");
        assert_eq!(phase, 10);
    }
}
