//! The shell every interactive page shares: one self-contained HTML document (inline CSS, JS
//! and data, nothing fetched from the network), data embedded safely, numbers at a stated
//! precision, the heatmaps' colour map, and a summary line that states the file's own size.

use std::fmt::Write as _;

use super::super::escape::xml_escape;
use super::super::heatmap::colormap;

/// The largest number of decimals a page stores (integers above 2^53 lose precision in JS).
pub(crate) const MAX_DECIMALS: u32 = 6;

/// The largest integer a page stores exactly: JS numbers are f64 (a 53-bit mantissa), 2^53.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// Whether `v` is finite and `round(v · 10^decimals)` survives the trip through JS exactly
/// (`|v|·10^decimals < 2^53`).
pub(crate) fn storable(v: f64, decimals: u32) -> bool {
    v.is_finite() && (v * 10f64.powi(decimals as i32)).abs() < MAX_EXACT
}

/// Checks a `decimals` option: 1 to [`MAX_DECIMALS`].
pub(crate) fn check_decimals(decimals: u32) -> candle::Result<()> {
    if !(1..=MAX_DECIMALS).contains(&decimals) {
        candle::bail!("decimals = {decimals}; expected 1 to {MAX_DECIMALS}")
    }
    Ok(())
}

/// Writes `values` as a JSON array of integers `round(v · 10^decimals)`: the page divides by
/// `10^decimals`, so each number it shows is within `0.5 · 10^-decimals` of the input. Integers
/// are shorter than decimal fractions and parse faster. Values must be finite (checked by the
/// callers, which name the argument).
pub(crate) fn push_scaled_ints(out: &mut String, values: &[f64], decimals: u32) {
    let scale = 10f64.powi(decimals as i32);
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // `as i64` saturates; -0 prints as 0.
        let q = (v * scale).round() as i64;
        let _ = write!(out, "{q}");
    }
    out.push(']');
}

/// `s` as a JSON string literal.
pub(crate) fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

/// `labels` as a JSON array of strings.
pub(crate) fn json_strings(labels: &[String]) -> String {
    serde_json::to_string(labels).expect("strings always serialise")
}

/// JSON text made safe inside `<script type="application/json">`: `<`, `>` and `&` become
/// `\u003c`, `\u003e`, `\u0026` (so a label `</script>` cannot close the element), and U+2028 /
/// U+2029 are escaped. Outside strings JSON never holds these characters, so this only ever
/// rewrites string contents, which `JSON.parse` restores.
pub(crate) fn script_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The 256 colours of [`colormap`] (viridis, as the PNG and SVG heatmaps use) as a JSON array
/// of `"#rrggbb"`, for the page's canvases: entry `min(⌊t·256⌋, 255)` for `t` in `[0, 1]`.
pub(crate) fn viridis_json() -> String {
    let colours: Vec<String> = (0..256)
        .map(|i| {
            let [r, g, b] = colormap((i as f64 + 0.5) / 256.0);
            format!("#{r:02x}{g:02x}{b:02x}")
        })
        .collect();
    json_strings(&colours)
}

/// The parts of one page.
pub(crate) struct Page<'a> {
    /// The `<title>` and the heading (escaped here).
    pub title: &'a str,
    /// The summary line under the heading, plain text (escaped here). `{size}` is replaced by
    /// the size of the whole file.
    pub summary: &'a str,
    /// Inline CSS.
    pub css: &'a str,
    /// The body's HTML after the heading and summary (trusted: written by this crate; token
    /// text never goes here, the scripts insert it with `textContent`).
    pub body: &'a str,
    /// The data, JSON text; made [`script_safe`] here and placed in
    /// `<script type="application/json" id="mha-data">`.
    pub data_json: &'a str,
    /// Inline JS, run after the data element exists.
    pub js: &'a str,
}

impl Page<'_> {
    /// The whole document. The summary's `{size}` is the document's own length in bytes,
    /// found by re-rendering until the size text no longer changes it (two or three passes).
    pub(crate) fn render(&self) -> String {
        debug_assert!(!self.js.contains("</script") && !self.css.contains("</style"));
        let data = script_safe(self.data_json);
        let mut size = String::new();
        for _ in 0..8 {
            let doc = self.render_with(&data, &size);
            let next = candle_mha::io::human_size(doc.len() as u64);
            if next == size {
                return doc;
            }
            size = next;
        }
        self.render_with(&data, &size)
    }

    fn render_with(&self, data: &str, size: &str) -> String {
        let title = xml_escape(self.title);
        let summary = xml_escape(&self.summary.replace("{size}", size));
        let mut doc = String::with_capacity(data.len() + self.js.len() + self.css.len() + 4096);
        let _ = write!(
            doc,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <meta name=\"generator\" content=\"candle-mha {version}\">\n\
             <title>{title}</title>\n<style>\n{css}\n</style>\n</head>\n<body>\n\
             <header><h1 id=\"mha-title\">{title}</h1>\n<p id=\"mha-summary\">{summary}</p></header>\n\
             {body}\n<script type=\"application/json\" id=\"mha-data\">{data}</script>\n\
             <script type=\"application/json\" id=\"mha-viridis\">{viridis}</script>\n\
             <script>\n{js}\n</script>\n</body>\n</html>\n",
            version = env!("CARGO_PKG_VERSION"),
            css = self.css,
            body = self.body,
            viridis = viridis_json(),
            js = self.js,
        );
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_ints_round_half_away() {
        let mut s = String::new();
        push_scaled_ints(&mut s, &[0.0, 0.12345, 1.0, -0.00004, 0.99995], 4);
        assert_eq!(s, "[0,1235,10000,0,10000]");
    }

    #[test]
    fn script_safe_cannot_close_the_element() {
        let json = json_strings(&[
            "</script><script>alert(1)</script>".into(),
            "a&b\u{2028}".into(),
        ]);
        let safe = script_safe(&json);
        assert!(!safe.contains('<') && !safe.contains('&') && !safe.contains('\u{2028}'));
        let back: Vec<String> = serde_json::from_str(&safe).unwrap();
        assert_eq!(back[0], "</script><script>alert(1)</script>");
        assert_eq!(back[1], "a&b\u{2028}");
    }

    #[test]
    fn summary_states_the_real_size() {
        let page = Page {
            title: "t <b>",
            summary: "size {size}",
            css: "",
            body: "",
            data_json: "[1,2,3]",
            js: "",
        };
        let doc = page.render();
        assert!(doc.contains(&format!(
            "size {}",
            candle_mha::io::human_size(doc.len() as u64)
        )));
        assert!(doc.contains("<title>t &lt;b&gt;</title>"));
    }

    #[test]
    fn viridis_matches_the_png_colours() {
        let v: Vec<String> = serde_json::from_str(&viridis_json()).unwrap();
        assert_eq!(v.len(), 256);
        assert_eq!(v[0], "#440154");
        assert_eq!(v[255], "#fde725");
    }
}
