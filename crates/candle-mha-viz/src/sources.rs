//! Which of several stacked inputs a query attends to: the keys are consecutive [`Segments`]
//! (e.g. three embeddings of one graph node stacked as a 3-token sequence, or a prompt
//! followed by retrieved passages), and [`source_mass`] sums each query's weight per segment.
//!
//! Keys that [`MultiheadAttention`](candle_mha::MultiheadAttention) appends itself (`add_bias_kv`,
//! `add_zero_attn`) come after the segments and are reported as one extra column,
//! [`OTHER_LABEL`].

use std::ops::Range;

use candle::{DType, Result, Tensor, D};

use super::heads::check_float;

/// The label of the extra column for keys after the last segment (the `bias_k` and zero keys
/// that `add_bias_kv` and `add_zero_attn` append).
pub const OTHER_LABEL: &str = "(other)";

/// Named, consecutive key ranges: the first segment covers keys `0..len₀`, the next
/// `len₀..len₀+len₁`, and so on.
///
/// ```
/// use candle_mha_viz::sources::Segments;
/// # fn main() -> candle::Result<()> {
/// let seg = Segments::new(&[("prompt", 3), ("passage", 5)])?;
/// assert_eq!((seg.total_len(), seg.range(1)), (8, 3..8));
/// assert_eq!(seg.column_labels(9)?, ["prompt", "passage", "(other)"]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segments {
    labels: Vec<String>,
    starts: Vec<usize>,
    lengths: Vec<usize>,
}

impl Segments {
    /// Segments from `(label, length)` pairs, in key order.
    ///
    /// # Errors
    /// No segment, a segment of length 0 (it could never receive weight), a repeated label, or
    /// the reserved label [`OTHER_LABEL`].
    pub fn new(labels_and_lengths: &[(&str, usize)]) -> Result<Self> {
        if labels_and_lengths.is_empty() {
            candle::bail!("Segments::new: labels_and_lengths is empty; expected at least one (label, length) pair")
        }
        let mut segments = Self {
            labels: Vec::new(),
            starts: Vec::new(),
            lengths: Vec::new(),
        };
        let mut start = 0;
        for &(label, len) in labels_and_lengths {
            if len == 0 {
                candle::bail!(
                    "Segments::new: segment {label:?} has length 0; expected every length >= 1"
                )
            }
            if label == OTHER_LABEL || segments.labels.iter().any(|l| l == label) {
                candle::bail!(
                    "Segments::new: label {label:?} is repeated or reserved ({OTHER_LABEL:?} names the keys after the segments); expected distinct labels"
                )
            }
            segments.labels.push(label.to_string());
            segments.starts.push(start);
            segments.lengths.push(len);
            start += len;
        }
        Ok(segments)
    }

    /// The segment labels, in key order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The number of segments.
    pub fn num_segments(&self) -> usize {
        self.labels.len()
    }

    /// The number of keys the segments cover (the sum of their lengths).
    pub fn total_len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0) + self.lengths.last().copied().unwrap_or(0)
    }

    /// The key range of segment `i` (an empty range past the last segment).
    pub fn range(&self, i: usize) -> Range<usize> {
        match (self.starts.get(i), self.lengths.get(i)) {
            (Some(&s), Some(&l)) => s..s + l,
            _ => self.total_len()..self.total_len(),
        }
    }

    /// The column labels of [`source_mass`] for `s` keys: the segment labels, then
    /// [`OTHER_LABEL`] when `s > total_len`.
    ///
    /// # Errors
    /// `s < total_len`.
    pub fn column_labels(&self, s: usize) -> Result<Vec<String>> {
        self.check_keys(s, "Segments::column_labels")?;
        let mut labels = self.labels.clone();
        if s > self.total_len() {
            labels.push(OTHER_LABEL.to_string());
        }
        Ok(labels)
    }

    fn check_keys(&self, s: usize, what: &str) -> Result<()> {
        if s < self.total_len() {
            candle::bail!(
                "{what}: {s} keys, but the segments {:?} cover {} keys; expected S >= {} (extra keys from add_bias_kv/add_zero_attn go to {OTHER_LABEL:?})",
                self.labels,
                self.total_len(),
                self.total_len()
            )
        }
        Ok(())
    }
}

/// The weight each query gives each segment: the sum of its weights over the segment's keys.
///
/// For softmax weights each row of the result sums to one (with the [`OTHER_LABEL`] column,
/// when there is one). Per-head weights `(N, H, L, S)` give per-head masses `(N, H, L, n)`.
///
/// PyTorch equivalent: `torch.stack([w[..., a:b].sum(-1) for a, b in ranges], -1)`.
///
/// # Shapes
/// `weights (…, L, S)` with `S ≥ segments.total_len()` → `(…, L, n)`, same dtype, where
/// `n = segments.num_segments()`, plus one ([`OTHER_LABEL`], the sum of keys
/// `total_len..S`) when `S > total_len`. Column labels: [`Segments::column_labels`].
///
/// # Errors
/// `weights` of rank below 2 or not float, or `S < total_len`.
pub fn source_mass(weights: &Tensor, segments: &Segments) -> Result<Tensor> {
    check_weights(weights, segments, "source_mass")?;
    let s = weights.dim(D::Minus1)?;
    let total = segments.total_len();
    let mut ranges: Vec<Range<usize>> = (0..segments.num_segments())
        .map(|i| segments.range(i))
        .collect();
    if s > total {
        ranges.push(total..s);
    }
    let masses = ranges
        .iter()
        .map(|r| {
            weights
                .narrow(D::Minus1, r.start, r.len())?
                .sum_keepdim(D::Minus1)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&masses, D::Minus1)
}

/// For each query, the index of the column of [`source_mass`] with the most weight (an index
/// into [`Segments::column_labels`], so `num_segments()` means [`OTHER_LABEL`]).
///
/// Ties go to the lowest index on the CPU (candle's `argmax`).
///
/// PyTorch equivalent: `source_mass(weights, segments).argmax(-1)` (as `u32`).
///
/// # Shapes
/// `weights (…, L, S)` → `(…, L)` u32.
///
/// # Errors
/// As [`source_mass`].
pub fn dominant_source(weights: &Tensor, segments: &Segments) -> Result<Tensor> {
    let mass = source_mass(weights, segments)?;
    if mass.elem_count() == 0 {
        // candle's argmax refuses empty tensors.
        let mut dims = mass.dims().to_vec();
        dims.pop();
        return Tensor::zeros(dims, DType::U32, mass.device());
    }
    mass.argmax(D::Minus1)
}

fn check_weights(weights: &Tensor, segments: &Segments, what: &str) -> Result<()> {
    if weights.rank() < 2 {
        candle::bail!(
            "{what}: weights must have shape (…, L, S) (rank >= 2), got shape {:?}",
            weights.dims()
        )
    }
    check_float(weights, what)?;
    segments.check_keys(weights.dim(D::Minus1)?, what)
}
