//! [`format_table`]: any `(L, S)` matrix (attention weights, source masses, …) as a labelled,
//! fixed-width text table, optionally shaded with ANSI 256-colour backgrounds.

use candle::{DType, Result, Tensor};

/// How [`format_table`] prints a matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Digits after the decimal point. Default 3.
    pub decimals: usize,
    /// Shade each value cell with an ANSI 256-colour grey background, darker for smaller and
    /// lighter for larger values (min–max over the matrix). Default `false`: plain text.
    pub color: bool,
    /// A line printed above the table. Default `None`.
    pub title: Option<String>,
}

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            decimals: 3,
            color: false,
            title: None,
        }
    }
}

/// Formats a matrix with row and column labels.
///
/// Layout (every line ends with `\n`):
/// - the title, if any, on its own line;
/// - a header: blanks as wide as the longest row label, then each column label;
/// - one line per row: its label, left-aligned and padded to the longest row label, then its
///   values with `decimals` digits (a value that rounds to zero prints without a minus sign).
///
/// Every value column is right-aligned to one common width (the widest value or column label)
/// and preceded by two spaces, so the output is deterministic and can be compared as text.
/// Widths count characters, not bytes. NaN and infinities print as `NaN`, `inf`, `-inf`.
///
/// PyTorch equivalent: none (`print(tensor)` has no labels); pandas'
/// `DataFrame(m, index=rows, columns=cols).round(decimals).to_string()` is the closest.
///
/// # Shapes
/// `matrix (L, S)`, any numeric dtype; `row_labels` has `L` entries, `col_labels` has `S`.
///
/// # Errors
/// `matrix` not 2-D, or a label count that does not match its shape.
///
/// ```
/// use candle::{Device, Tensor};
/// use candle_mha_viz::table::{format_table, TableOptions};
/// # fn main() -> candle::Result<()> {
/// let m = Tensor::new(&[[0.5f32, 0.25], [1.0, 0.0]], &Device::Cpu)?;
/// let labels = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
/// let text = format_table(&m, &labels(&["the", "cat"]), &labels(&["k0", "k1"]), &TableOptions::default())?;
/// assert_eq!(text, "        k0     k1\nthe  0.500  0.250\ncat  1.000  0.000\n");
/// # Ok(())
/// # }
/// ```
pub fn format_table(
    matrix: &Tensor,
    row_labels: &[String],
    col_labels: &[String],
    opts: &TableOptions,
) -> Result<String> {
    let (l, s) = match matrix.dims() {
        &[l, s] => (l, s),
        dims => candle::bail!(
            "format_table: matrix must be 2-D (L, S), got shape {dims:?}; select one map first (e.g. weights.get(n)?.get(h)?)"
        ),
    };
    if row_labels.len() != l || col_labels.len() != s {
        candle::bail!(
            "format_table: matrix has shape [{l}, {s}] but got {} row labels and {} column labels; expected {l} and {s}",
            row_labels.len(),
            col_labels.len()
        )
    }
    let values = matrix.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let cells: Vec<Vec<String>> = values
        .iter()
        .map(|row| {
            row.iter()
                .map(|&v| format_value(v, opts.decimals))
                .collect()
        })
        .collect();

    let width = |text: &str| text.chars().count();
    let label_width = row_labels.iter().map(|r| width(r)).max().unwrap_or(0);
    let cell_width = cells
        .iter()
        .flatten()
        .chain(col_labels)
        .map(|c| width(c))
        .max()
        .unwrap_or(0);
    let shade = opts.color.then(|| Shading::new(&values));

    let mut out = String::new();
    if let Some(title) = &opts.title {
        out.push_str(title);
        out.push('\n');
    }
    out.push_str(&" ".repeat(label_width));
    for c in col_labels {
        out.push_str(&format!("  {c:>cell_width$}"));
    }
    out.push('\n');
    for ((label, row), raw) in row_labels.iter().zip(&cells).zip(&values) {
        out.push_str(&format!("{label:<label_width$}"));
        for (cell, &v) in row.iter().zip(raw) {
            let padded = format!("{cell:>cell_width$}");
            out.push_str("  ");
            match &shade {
                Some(shade) => out.push_str(&shade.paint(&padded, v)),
                None => out.push_str(&padded),
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// `v` with `decimals` digits; "-0.000" becomes "0.000" (a sign on a zero only distracts).
fn format_value(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    let text = format!("{v:.decimals$}");
    match text.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => text,
    }
}

/// Min–max grey shading: ANSI 256-colour codes 232 (near black) to 255 (near white).
struct Shading {
    lo: f64,
    hi: f64,
}

impl Shading {
    fn new(values: &[Vec<f64>]) -> Self {
        let finite = values.iter().flatten().copied().filter(|v| v.is_finite());
        let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        Self { lo, hi }
    }

    fn paint(&self, text: &str, v: f64) -> String {
        if !v.is_finite() {
            return text.to_string();
        }
        // A constant matrix has no range: shade it mid-grey.
        let t = if self.hi > self.lo {
            (v - self.lo) / (self.hi - self.lo)
        } else {
            0.5
        };
        let grey = 232 + (t * 23.0).round() as u8;
        // Black text on the light half, white on the dark half, so the digits stay readable.
        let fg = if grey >= 244 { 16 } else { 231 };
        format!("\x1b[48;5;{grey}m\x1b[38;5;{fg}m{text}\x1b[0m")
    }
}
