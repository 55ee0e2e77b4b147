//! [`SwiGlu`]: the gated MLP of Llama-family blocks.

use candle::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::{Linear, Lora};

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

    /// The MLP with LoRA adapters on the layers given (`[gate, up, down]`).
    ///
    /// PyTorch equivalent: PEFT's `lora.Linear` around `gate_proj`, `up_proj`, `down_proj`.
    pub fn with_lora(mut self, [gate, up, down]: [Option<Lora>; 3]) -> Result<Self> {
        for (layer, lora) in [
            (&mut self.gate, gate),
            (&mut self.up, up),
            (&mut self.down, down),
        ] {
            if let Some(l) = lora {
                *layer = layer.clone().with_lora(l)?;
            }
        }
        Ok(self)
    }

    /// The MLP with its adapters merged into the weights.
    pub fn merged(&self) -> Result<Self> {
        Ok(Self {
            gate: self.gate.merged()?,
            up: self.up.merged()?,
            down: self.down.merged()?,
        })
    }

    /// The output in training mode: each adapter's dropout drawn from `seeds` (`[gate, up,
    /// down]`) and the rows' `first_row` (see [`Linear::forward_train`]).
    pub fn forward_train(&self, x: &Tensor, seeds: [u64; 3], first_row: usize) -> Result<Tensor> {
        let offset =
            |t: &Tensor| (first_row * t.elem_count() / t.dim(0).unwrap_or(1).max(1)) as u64;
        let g = self.gate.forward_train(x, (seeds[0], offset(x)))?.silu()?;
        let h = (g * self.up.forward_train(x, (seeds[1], offset(x)))?)?;
        self.down.forward_train(&h, (seeds[2], offset(&h)))
    }
}

impl Module for SwiGlu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = self.gate.forward(x)?.silu()?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }
}
