//! [`SwiGlu`]: the gated MLP of Llama-family blocks.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::Linear;

/// `down(silu(gate(x)) · up(x))`, three bias-free linear layers named as Hugging Face's
/// (`gate_proj`, `up_proj`, `down_proj`).
///
/// PyTorch equivalent: transformers' `LlamaMLP` (`hidden_act="silu"`, `mlp_bias=False`).
///
/// # Shapes
/// `x (…, E)` → `(…, E)`; the hidden width is `I` (`intermediate_size`).
#[derive(Clone, Debug)]
pub struct SwiGlu {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl SwiGlu {
    /// Takes (or creates, with `nn.Linear`'s init) `gate_proj.weight [I, E]`,
    /// `up_proj.weight [I, E]` and `down_proj.weight [E, I]` under `vb`.
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            gate: Linear::new(dim, hidden, false, vb.pp("gate_proj"))?,
            up: Linear::new(dim, hidden, false, vb.pp("up_proj"))?,
            down: Linear::new(hidden, dim, false, vb.pp("down_proj"))?,
        })
    }

    /// The three layers: gate, up, down.
    pub fn layers(&self) -> [&Linear; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

impl Module for SwiGlu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = self.gate.forward(x)?.silu()?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }
}
