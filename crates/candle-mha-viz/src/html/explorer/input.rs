//! The explorer's inputs checked and read into f64 (weights, labels, extra matrices), with
//! errors that name the argument, what was received and what was expected.

use candle::{DType, Device, Result, Tensor};

use super::super::page::storable;

/// The weights as `(layers, heads, rows, cols)` row-major f64 values.
pub(super) struct Weights {
    pub layers: usize,
    pub heads: usize,
    pub rows: usize,
    pub cols: usize,
    pub values: Vec<f64>,
}

impl Weights {
    /// Layer `l` as an `(H, L, S)` f64 tensor on the CPU (for rollout and flow).
    pub fn layer(&self, l: usize) -> Result<Tensor> {
        let n = self.heads * self.rows * self.cols;
        Tensor::from_slice(
            &self.values[l * n..(l + 1) * n],
            (self.heads, self.rows, self.cols),
            &Device::Cpu,
        )
    }
}

/// What is wrong with a value that is not [`storable`].
fn problem(v: f64, decimals: u32) -> String {
    match v.is_finite() {
        false => format!("the non-finite value {v}"),
        true => format!(
            "the value {v}, too large to store with {decimals} decimals (|v|·10^{decimals} must \
             be below 2^53)"
        ),
    }
}

/// Reads `weights`, `(H, L, S)` or `(layers, H, L, S)`: float, no empty dimension, finite and
/// storable with `decimals`.
pub(super) fn read_weights(weights: &Tensor, decimals: u32) -> Result<Weights> {
    let (layers, heads, rows, cols) = match *weights.dims() {
        [h, l, s] => (1, h, l, s),
        [n, h, l, s] => (n, h, l, s),
        ref d => candle::bail!(
            "attention_explorer: weights has shape {d:?} (rank {}); expected (H, L, S) or \
             (layers, H, L, S)",
            d.len()
        ),
    };
    for (name, v) in [("layers", layers), ("H", heads), ("L", rows), ("S", cols)] {
        if v == 0 {
            candle::bail!(
                "attention_explorer: weights has shape {:?} with {name} = 0; expected every \
                 dimension at least 1",
                weights.dims()
            )
        }
    }
    let values = read_finite(weights, "weights")?;
    if let Some(p) = values.iter().position(|&v| !storable(v, decimals)) {
        let (key, rest) = (p % cols, p / cols);
        let (query, rest) = (rest % rows, rest / rows);
        let (head, layer) = (rest % heads, rest / heads);
        candle::bail!(
            "attention_explorer: weights has {} at layer {layer}, head {head}, query {query}, \
             key {key}; expected finite attention weights",
            problem(values[p], decimals)
        )
    }
    Ok(Weights {
        layers,
        heads,
        rows,
        cols,
        values,
    })
}

/// `t` as f64 values on the CPU; errors on a non-float dtype.
fn read_finite(t: &Tensor, what: &str) -> Result<Vec<f64>> {
    if !t.dtype().is_float() {
        candle::bail!(
            "attention_explorer: {what} has dtype {:?}; expected a float tensor",
            t.dtype()
        )
    }
    t.to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1()
}

/// Checks that `labels` (named `what`) has `expected` entries, the weights' `dim`.
pub(super) fn check_labels(
    labels: &[String],
    what: &str,
    dim: &str,
    expected: usize,
    shape: &[usize],
) -> Result<()> {
    if labels.len() != expected {
        candle::bail!(
            "attention_explorer: {what} has {} entries; expected {dim} = {expected} (weights \
             shape {shape:?})",
            labels.len()
        )
    }
    Ok(())
}

/// Reads the extra matrix `opts.matrices[idx]` named `name`: `(rows, cols)`, float, finite
/// and storable with `decimals`.
pub(super) fn read_matrix(
    idx: usize,
    name: &str,
    m: &Tensor,
    (rows, cols): (usize, usize),
    decimals: u32,
) -> Result<Vec<f64>> {
    let what = format!("opts.matrices[{idx}] ({name:?})");
    if m.dims() != [rows, cols] {
        candle::bail!(
            "attention_explorer: {what} has shape {:?}; expected (L, S) = ({rows}, {cols})",
            m.dims()
        )
    }
    let values = read_finite(m, &what)?;
    check_storable(&values, cols, decimals, &what)?;
    Ok(values)
}

/// Checks that every value of a `(_, cols)` matrix named `what` is [`storable`].
pub(super) fn check_storable(values: &[f64], cols: usize, decimals: u32, what: &str) -> Result<()> {
    if let Some(p) = values.iter().position(|&v| !storable(v, decimals)) {
        candle::bail!(
            "attention_explorer: {what} has {} at row {}, column {}; expected finite values",
            problem(values[p], decimals),
            p / cols,
            p % cols
        )
    }
    Ok(())
}
