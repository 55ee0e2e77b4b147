//! [`evaluate`]: loss, perplexity, accuracy and bits per byte of a model on a dataset or on a
//! stream of examples.

use candle::{Device, Result};
use serde::{Deserialize, Serialize};

use crate::data::{Batch, Dataset, Example};
use crate::models::NextTokenPredictor;

/// Evaluation metrics over the counted (loss-masked) positions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Mean cross-entropy (nats per token).
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Fraction of positions whose argmax prediction is the target.
    pub accuracy: f64,
    /// Number of positions counted.
    pub tokens: usize,
    /// Bits per byte of text: the summed loss in bits over the UTF-8 bytes the predicted
    /// tokens stand for (comparable across tokenizers); `None` when the data is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_byte: Option<f64>,
}

/// A perplexity for people: three decimals up to a million, exponent form above (a diverged
/// run's `exp(loss)` has hundreds of digits), `inf` past f64.
fn format_perplexity(p: f64) -> String {
    if p.is_finite() && p.abs() < 1e6 {
        format!("{p:.3}")
    } else if p.is_finite() {
        format!("{p:.3e}")
    } else {
        format!("{p}")
    }
}

impl std::fmt::Display for Evaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss {:.4}, perplexity {}, accuracy {:.2}%",
            self.loss,
            format_perplexity(self.perplexity),
            100.0 * self.accuracy,
        )?;
        if let Some(bpb) = self.bits_per_byte {
            write!(f, ", {bpb:.4} bits/byte")?;
        }
        write!(f, " over {} tokens", self.tokens)
    }
}

/// Evaluates `model` (evaluation mode, no dropout) on every example of `dataset`, without
/// bits per byte.
///
/// PyTorch equivalent: a `torch.no_grad()` loop summing `cross_entropy(..., reduction="sum")`
/// and correct argmax predictions over the masked positions.
pub fn evaluate(
    model: &NextTokenPredictor,
    dataset: &Dataset,
    batch_size: usize,
    device: &Device,
) -> Result<Evaluation> {
    evaluate_examples(
        model,
        dataset.examples.iter().cloned().map(Ok),
        batch_size,
        device,
        None,
    )
}

/// Evaluates `model` on a stream of examples, `batch_size` at a time (only one batch in
/// memory), with bits per byte when `text_bytes` (the bytes the predicted tokens stand for)
/// is given. Errors on a `batch_size` of 0, on the stream's first error, and when no
/// position counts.
///
/// PyTorch equivalent: as [`evaluate`], over an iterable dataset.
pub fn evaluate_examples(
    model: &NextTokenPredictor,
    examples: impl Iterator<Item = Result<Example>>,
    batch_size: usize,
    device: &Device,
    text_bytes: Option<u64>,
) -> Result<Evaluation> {
    if batch_size == 0 {
        candle::bail!("batch size 0 is invalid; expected at least 1")
    }
    let (mut loss_sum, mut correct, mut count) = (0f64, 0f64, 0usize);
    let mut pending: Vec<Example> = Vec::with_capacity(batch_size);
    let mut examples = examples.peekable();
    while let Some(e) = examples.next() {
        pending.push(e?);
        if pending.len() < batch_size && examples.peek().is_some() {
            continue;
        }
        let refs: Vec<&Example> = pending.iter().collect();
        let batch = Batch::from_examples(&refs, device)?;
        pending.clear();
        if batch.num_tokens == 0 {
            continue;
        }
        let (loss, hits) = model.eval_sums(
            &batch.input,
            Some(&batch.key_padding_mask),
            &batch.targets,
            &batch.loss_mask,
        )?;
        loss_sum += loss;
        correct += hits;
        count += batch.num_tokens;
    }
    if count == 0 {
        candle::bail!("evaluation set has no position to predict")
    }
    let loss = loss_sum / count as f64;
    Ok(Evaluation {
        loss,
        perplexity: loss.exp(),
        accuracy: correct / count as f64,
        tokens: count,
        bits_per_byte: text_bytes
            .filter(|&b| b > 0)
            .map(|b| loss_sum / std::f64::consts::LN_2 / b as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::format_perplexity;

    #[test]
    fn perplexities_stay_readable() {
        assert_eq!(format_perplexity(12.34567), "12.346");
        assert_eq!(format_perplexity(1e308), "1.000e308");
        assert_eq!(format_perplexity(f64::INFINITY), "inf");
        assert_eq!(format_perplexity(f64::NAN), "NaN");
    }
}
