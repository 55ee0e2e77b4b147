//! Decoded RGB PNGs (what the crate's heatmaps and charts write), read pixel by pixel.

use std::path::Path;

use anyhow::Result;

/// A decoded 8-bit RGB image.
pub struct Image {
    pub w: usize,
    pub h: usize,
    /// Row-major RGB bytes.
    pub px: Vec<u8>,
}

impl Image {
    /// Decodes PNG bytes; panics unless they are 8-bit RGB (what the crate writes).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        Self::read(std::io::Cursor::new(bytes))
    }

    /// Decodes the PNG file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::read(std::io::BufReader::new(std::fs::File::open(path)?))
    }

    fn read(r: impl std::io::BufRead + std::io::Seek) -> Result<Self> {
        let mut reader = png::Decoder::new(r).read_info()?;
        let mut px = vec![0; reader.output_buffer_size().expect("buffer size")];
        let info = reader.next_frame(&mut px)?;
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        px.truncate(info.buffer_size());
        Ok(Self {
            w: info.width as usize,
            h: info.height as usize,
            px,
        })
    }

    /// `(width, height)`.
    pub fn size(&self) -> (usize, usize) {
        (self.w, self.h)
    }

    pub fn at(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.w + x) * 3;
        [self.px[i], self.px[i + 1], self.px[i + 2]]
    }

    /// How many pixels have colour `rgb`.
    pub fn count(&self, rgb: [u8; 3]) -> usize {
        self.px.chunks(3).filter(|p| *p == rgb).count()
    }

    /// Every pixel of colour `rgb` in rows `0..max_y`.
    pub fn pixels(&self, rgb: [u8; 3], max_y: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for y in 0..max_y.min(self.h) {
            for x in 0..self.w {
                if self.at(x, y) == rgb {
                    out.push((x, y));
                }
            }
        }
        out
    }

    /// Top-left corners of full `side × side` squares of `rgb` in rows `0..max_y`, grouped:
    /// corners closer than `side` to a group's first corner belong to it.
    pub fn squares(&self, rgb: [u8; 3], side: usize, max_y: usize) -> Vec<(usize, usize)> {
        let mut groups: Vec<(usize, usize)> = Vec::new();
        for (x, y) in self.pixels(rgb, max_y) {
            let full = x + side <= self.w
                && y + side <= max_y
                && (0..side).all(|dy| (0..side).all(|dx| self.at(x + dx, y + dy) == rgb));
            let near = |&(gx, gy): &(usize, usize)| x.abs_diff(gx) < side && y.abs_diff(gy) < side;
            if full && !groups.iter().any(near) {
                groups.push((x, y));
            }
        }
        groups
    }

    /// The smallest rectangle `(x0, y0, x1, y1)` (inclusive) holding every pixel that is not
    /// `background`, or `None` for a blank image.
    pub fn ink_box(&self, background: [u8; 3]) -> Option<(usize, usize, usize, usize)> {
        let mut bbox: Option<(usize, usize, usize, usize)> = None;
        for y in 0..self.h {
            for x in 0..self.w {
                if self.at(x, y) != background {
                    bbox = Some(match bbox {
                        None => (x, y, x, y),
                        Some((x0, y0, x1, y1)) => (x0.min(x), y0.min(y), x1.max(x), y1.max(y)),
                    });
                }
            }
        }
        bbox
    }
}
