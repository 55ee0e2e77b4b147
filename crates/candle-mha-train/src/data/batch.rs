//! Padding a few examples into one batch of tensors.

use candle::{Device, Result, Tensor};

use super::example::Example;
use super::vocab::PAD_ID;

/// A padded batch; all tensors are `(N, L)` with `L` the longest input in the batch, right-padded
/// with [`PAD_ID`]. Padded positions have `loss_mask` 0 and `key_padding_mask` 1, so the padding
/// id never matters (it stays 0 even when a tokenizer's own pad id differs).
///
/// PyTorch equivalent: the output of a `collate_fn` using
/// `torch.nn.utils.rnn.pad_sequence(..., batch_first=True)`.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The inputs `tokens[..n-1]`, `u32`, `(N, L)`.
    pub input: Tensor,
    /// The targets `tokens[1..]`, `u32`, `(N, L)`.
    pub targets: Tensor,
    /// 1 where a prediction counts in the loss, `u8`, `(N, L)`.
    pub loss_mask: Tensor,
    /// 1 at padded positions (PyTorch's `key_padding_mask` convention: true = ignore), `u8`,
    /// `(N, L)`.
    pub key_padding_mask: Tensor,
    /// The number of target positions that count (the sum of `loss_mask`).
    pub num_tokens: usize,
    /// Whether some sequence is shorter than `L` (when not, `key_padding_mask` is all zero
    /// and may be left out).
    pub padded: bool,
}

impl Batch {
    /// Pads `examples` into a batch on `device`.
    ///
    /// Errors on an empty slice, on an example with fewer than 2 tokens and on an example whose
    /// `loss_mask` length is not `tokens.len() - 1`.
    ///
    /// PyTorch equivalent: `pad_sequence([torch.tensor(e.tokens) for e in examples],
    /// batch_first=True, padding_value=0)` followed by slicing into inputs and targets.
    pub fn from_examples(examples: &[&Example], device: &Device) -> Result<Self> {
        Self::from_examples_padded_to(examples, 0, device)
    }

    /// [`from_examples`](Self::from_examples) padded to at least `min_len` positions: a part
    /// of a larger batch with that batch's length `L` (data-parallel ranks), so that its rows,
    /// masks and dropout are those of the whole batch.
    ///
    /// PyTorch equivalent: `pad_sequence` followed by `F.pad` to `min_len`.
    pub fn from_examples_padded_to(
        examples: &[&Example],
        min_len: usize,
        device: &Device,
    ) -> Result<Self> {
        if examples.is_empty() {
            return Err(candle::Error::Msg(
                "cannot build a batch from 0 examples; expected at least 1".into(),
            ));
        }
        for (i, e) in examples.iter().enumerate() {
            if e.tokens.len() < 2 {
                return Err(candle::Error::Msg(format!(
                    "example {i} of the batch has {} token(s); expected at least 2 (one input \
                     and one target)",
                    e.tokens.len()
                )));
            }
            if e.loss_mask.len() != e.tokens.len() - 1 {
                return Err(candle::Error::Msg(format!(
                    "example {i} of the batch has {} tokens and a loss mask of length {}; \
                     expected a loss mask of length {}",
                    e.tokens.len(),
                    e.loss_mask.len(),
                    e.tokens.len() - 1
                )));
            }
        }
        let n = examples.len();
        let l = examples
            .iter()
            .map(|e| e.tokens.len() - 1)
            .max()
            .unwrap_or(0)
            .max(min_len);
        let mut input = vec![PAD_ID; n * l];
        let mut targets = vec![PAD_ID; n * l];
        let mut loss_mask = vec![0u8; n * l];
        let mut key_padding_mask = vec![1u8; n * l];
        let mut num_tokens = 0;
        for (row, e) in examples.iter().enumerate() {
            let len = e.tokens.len() - 1;
            let base = row * l;
            input[base..base + len].copy_from_slice(&e.tokens[..len]);
            targets[base..base + len].copy_from_slice(&e.tokens[1..]);
            for (j, &m) in e.loss_mask.iter().enumerate() {
                loss_mask[base + j] = u8::from(m);
                num_tokens += usize::from(m);
            }
            key_padding_mask[base..base + len].fill(0);
        }
        Ok(Batch {
            input: Tensor::from_vec(input, (n, l), device)?,
            targets: Tensor::from_vec(targets, (n, l), device)?,
            loss_mask: Tensor::from_vec(loss_mask, (n, l), device)?,
            key_padding_mask: Tensor::from_vec(key_padding_mask, (n, l), device)?,
            num_tokens,
            padded: examples.iter().any(|e| e.tokens.len() - 1 < l),
        })
    }

    /// The number of sequences `N`.
    pub fn batch_size(&self) -> usize {
        self.input.dims().first().copied().unwrap_or(0)
    }

    /// The padded length `L`.
    pub fn seq_len(&self) -> usize {
        self.input.dims().get(1).copied().unwrap_or(0)
    }
}

/// `examples` in order, `batch_size` at a time, as batches on `device` (only one batch's
/// examples in memory at once); the stream's errors pass through. Errors on a `batch_size`
/// of 0.
///
/// PyTorch equivalent: `DataLoader(dataset, batch_size, shuffle=False)` over an
/// `IterableDataset`.
pub fn batches<'a>(
    examples: impl IntoIterator<Item = Result<Example>> + 'a,
    batch_size: usize,
    device: &'a Device,
) -> Result<impl Iterator<Item = Result<Batch>> + 'a> {
    if batch_size == 0 {
        candle::bail!("batch_size 0 is invalid; expected at least 1")
    }
    let mut examples = examples.into_iter();
    Ok(std::iter::from_fn(move || {
        let mut chunk = Vec::with_capacity(batch_size);
        for e in examples.by_ref() {
            match e {
                Ok(e) => chunk.push(e),
                Err(err) => return Some(Err(err)),
            }
            if chunk.len() == batch_size {
                break;
            }
        }
        if chunk.is_empty() {
            return None;
        }
        let refs: Vec<&Example> = chunk.iter().collect();
        Some(Batch::from_examples(&refs, device))
    }))
}
