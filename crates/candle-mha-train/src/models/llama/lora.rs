//! LoRA adapters on a [`Llama`]'s projections (Hugging Face's module names), and the model
//! with them merged.

use candle::Result;
use candle_mha::nn::{Linear, Lora};

use super::{Llama, LlamaBlock};

impl Llama {
    /// The model with the adapter `take(module)` gives on each projection, by Hugging Face's
    /// module name (`model.layers.{i}.self_attn.q_proj`, …, `model.layers.{i}.mlp.down_proj`).
    pub(crate) fn with_lora(
        mut self,
        take: &mut dyn FnMut(String) -> Option<Lora>,
    ) -> Result<Self> {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            let a = &mut layer.attn;
            for (name, l) in [
                ("q_proj", &mut a.q),
                ("k_proj", &mut a.k),
                ("v_proj", &mut a.v),
                ("o_proj", &mut a.o),
            ] {
                if let Some(lora) = take(format!("{p}.self_attn.{name}")) {
                    *l = l.clone().with_lora(lora)?;
                }
            }
            let mlp = ["gate_proj", "up_proj", "down_proj"].map(|n| take(format!("{p}.mlp.{n}")));
            layer.mlp = layer.mlp.clone().with_lora(mlp)?;
        }
        Ok(self)
    }

    /// Whether any projection has an adapter.
    pub fn has_lora(&self) -> bool {
        self.layers.iter().any(LlamaBlock::has_lora)
    }

    /// The model with every adapter merged into its projection's weight.
    ///
    /// PyTorch equivalent: `peft_model.merge_and_unload()`.
    pub fn merged(&self) -> Result<Self> {
        let mut m = self.clone();
        for layer in &mut m.layers {
            let a = &mut layer.attn;
            for l in [&mut a.q, &mut a.k, &mut a.v, &mut a.o] {
                *l = l.merged()?;
            }
            layer.mlp = layer.mlp.merged()?;
        }
        Ok(m)
    }
}

impl LlamaBlock {
    pub(super) fn has_lora(&self) -> bool {
        let adapted = |l: &Linear| l.lora().is_some();
        self.attn.projections().into_iter().any(adapted)
            || self.mlp.layers().into_iter().any(adapted)
    }
}
