//! One training sequence with its loss mask.

/// One training sequence: the model reads `tokens[..n-1]` and predicts `tokens[1..]`;
/// `loss_mask[i]` says whether predicting `tokens[i+1]` counts (`len = tokens.len() - 1`).
///
/// PyTorch equivalent: one item of a `torch.utils.data.Dataset` returning `(input, target,
/// mask)` for next-token prediction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The token ids, including any BOS/EOS.
    pub tokens: Vec<u32>,
    /// One flag per predicted position (`tokens.len() - 1` of them): whether it counts in the
    /// loss.
    pub loss_mask: Vec<bool>,
}

impl Example {
    /// An example in which every prediction counts.
    pub fn full(tokens: Vec<u32>) -> Self {
        let loss_mask = vec![true; tokens.len().saturating_sub(1)];
        Example { tokens, loss_mask }
    }

    /// The number of predicted positions (`tokens.len() - 1`, or 0).
    pub fn num_predictions(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }
}
