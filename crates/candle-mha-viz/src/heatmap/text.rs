//! How a heatmap writes numbers: colour-bar ticks, the short value text inside a cell, the
//! full value of an SVG `<title>`, and the text colour that reads on a cell's colour.

use crate::canvas::{BLACK, WHITE};

/// The colour-bar tick text for `v` on a scale whose largest magnitude is `m` (module docs).
pub(super) fn tick(v: f64, m: f64) -> String {
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

pub(super) fn plot_tick(v: f64, vmin: f64, vmax: f64) -> String {
    tick(v, vmin.abs().max(vmax.abs()))
}

/// A value short enough for a cell: ".45", "-.45", "3.4", "120", "1e3", "NaN".
pub(super) fn cell_text(v: f64) -> String {
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
pub(super) fn text_on(bg: [u8; 3]) -> [u8; 3] {
    let luma = 0.299 * bg[0] as f64 + 0.587 * bg[1] as f64 + 0.114 * bg[2] as f64;
    if luma < 128.0 {
        WHITE
    } else {
        BLACK
    }
}

/// A value for an SVG `<title>`: 4 decimals, or NaN / inf / -inf.
pub(super) fn full_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        cell_text(v)
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canvas::fit;

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
}
