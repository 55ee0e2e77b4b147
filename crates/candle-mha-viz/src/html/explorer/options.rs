//! How the attention explorer page is built: [`ExplorerOptions`].

use candle::Tensor;

/// How the explorer page ([`attention_explorer`](super::attention_explorer)) is built.
///
/// PyTorch equivalent: none (bertviz's `head_view`/`model_view` take their options as
/// keyword arguments: `layer`, `heads`, `include_layers`).
#[derive(Clone, Debug)]
pub struct ExplorerOptions {
    /// Page title. Default None: "Attention".
    pub title: Option<String>,
    /// Decimals stored per weight (1..=6). Default 4.
    pub decimals: u32,
    /// Add the attention rollout over all layers (heads fused by mean, residual, as
    /// `mha inspect --rollout`) to the matrix view; only when L == S. Default true.
    pub rollout: bool,
    /// Add attention flow (same fusion and residual); only when L == S and
    /// L <= [`ATTENTION_FLOW_MAX_LEN`](crate::ATTENTION_FLOW_MAX_LEN). Default true.
    pub flow: bool,
    /// More named matrices for the matrix view (e.g. a user's own score), each `(L, S)`, any
    /// float dtype and device, finite. Default empty.
    pub matrices: Vec<(String, Tensor)>,
}

impl Default for ExplorerOptions {
    fn default() -> Self {
        Self {
            title: None,
            decimals: 4,
            rollout: true,
            flow: true,
            matrices: Vec::new(),
        }
    }
}

candle_mha::setters! {
    ExplorerOptions {
        with_title(title: Some(impl Into<String>));
        with_decimals(decimals: u32);
        with_rollout(rollout: bool);
        with_flow(flow: bool);
    }
}

impl ExplorerOptions {
    /// The options with one more named matrix for the matrix view.
    ///
    /// # Shapes
    /// `matrix`: `(L, S)`, the weights' query and key lengths (checked when the page is built).
    pub fn with_matrix(mut self, name: impl Into<String>, matrix: Tensor) -> Self {
        self.matrices.push((name.into(), matrix));
        self
    }
}
