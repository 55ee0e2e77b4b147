//! LoRA adapters on a [`NextTokenPredictor`]'s layers ([`LoraSpec`]), and the model with them
//! merged back into its weights.

use candle::Result;
use candle_nn::VarBuilder;

use super::{Arch, Block, NextTokenPredictor};
use crate::models::lora::{adapters, LoraSpec};

impl NextTokenPredictor {
    /// The model with LoRA adapters on the layers `spec` names, taken (or created, as PEFT
    /// initialises them: A Kaiming-uniform, B zeros) under `vb` with our module names
    /// (`blocks.{i}.attn.in_proj.lora_A.weight`, …, see [`crate::models::lora`]). The
    /// model's own weights are used as they are: build it from plain tensors (not variables)
    /// to freeze them, and their weight gradients are not computed.
    ///
    /// PyTorch equivalent: `peft.get_peft_model(model, LoraConfig(...))`.
    pub fn with_lora(mut self, spec: &LoraSpec, vb: VarBuilder) -> Result<Self> {
        let mut found = adapters(&self.config, spec, &vb)?;
        let mut take = |m: String| found.remove(&m);
        match &mut self.arch {
            Arch::Gpt(g) => {
                for (i, block) in g.blocks.iter_mut().enumerate() {
                    let p = format!("blocks.{i}");
                    let (inp, out) = (
                        take(format!("{p}.attn.in_proj")),
                        take(format!("{p}.attn.out_proj")),
                    );
                    block.attn = block.attn.clone().with_lora(inp, out)?;
                    if let Some(l) = take(format!("{p}.mlp.fc1")) {
                        block.fc1 = block.fc1.clone().with_lora(l)?;
                    }
                    if let Some(l) = take(format!("{p}.mlp.fc2")) {
                        block.fc2 = block.fc2.clone().with_lora(l)?;
                    }
                }
            }
            Arch::Llama(m) => **m = m.as_ref().clone().with_lora(&mut take)?,
        }
        Ok(self)
    }

    /// Whether any layer has an adapter.
    pub fn has_lora(&self) -> bool {
        match &self.arch {
            Arch::Gpt(g) => g.blocks.iter().any(Block::has_lora),
            Arch::Llama(m) => m.has_lora(),
        }
    }

    /// The model with every adapter merged into its layer's weight (`W + s·B·A`): the same
    /// outputs from plain weights, for the key/value cache and export.
    ///
    /// PyTorch equivalent: `peft_model.merge_and_unload()`.
    pub fn merged(&self) -> Result<Self> {
        let mut m = self.clone();
        match &mut m.arch {
            Arch::Gpt(g) => {
                for b in &mut g.blocks {
                    b.attn = b.attn.merged()?;
                    b.fc1 = b.fc1.merged()?;
                    b.fc2 = b.fc2.merged()?;
                }
            }
            Arch::Llama(l) => **l = l.merged()?,
        }
        Ok(m)
    }
}

impl Block {
    fn has_lora(&self) -> bool {
        self.attn.has_lora() || self.fc1.lora().is_some() || self.fc2.lora().is_some()
    }
}
