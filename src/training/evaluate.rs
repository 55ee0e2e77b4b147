//! [`evaluate`]: loss, perplexity and accuracy of a model on a dataset.

use candle::{DType, Device, Result, D};
use serde::{Deserialize, Serialize};

use crate::data::Dataset;
use crate::models::{masked_cross_entropy, NextTokenPredictor};

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
}

impl std::fmt::Display for Evaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss {:.4}, perplexity {:.3}, accuracy {:.2}% over {} tokens",
            self.loss,
            self.perplexity,
            100.0 * self.accuracy,
            self.tokens
        )
    }
}

/// Evaluates `model` (evaluation mode, no dropout) on every example of `dataset`.
///
/// PyTorch equivalent: a `torch.no_grad()` loop summing `cross_entropy(..., reduction="sum")`
/// and correct argmax predictions over the masked positions.
pub fn evaluate(
    model: &NextTokenPredictor,
    dataset: &Dataset,
    batch_size: usize,
    device: &Device,
) -> Result<Evaluation> {
    let (mut loss_sum, mut correct, mut count) = (0f64, 0f64, 0usize);
    for batch in dataset.eval_batches(batch_size, device)? {
        if batch.num_tokens == 0 {
            continue;
        }
        let logits = model
            .forward(&batch.input, Some(&batch.key_padding_mask))?
            .detach();
        let loss = masked_cross_entropy(&logits, &batch.targets, &batch.loss_mask)?;
        loss_sum += loss.to_dtype(DType::F64)?.to_scalar::<f64>()? * batch.num_tokens as f64;
        let hits = logits
            .argmax(D::Minus1)?
            .eq(&batch.targets)?
            .to_dtype(DType::F64)?;
        let mask = batch.loss_mask.to_dtype(DType::F64)?;
        correct += (hits * mask)?.sum_all()?.to_scalar::<f64>()?;
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
    })
}
