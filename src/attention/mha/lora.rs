//! LoRA adapters on the module's two projections: the packed input projection as one layer
//! `E → 3E` (how PEFT adapts GPT-2's `c_attn`) and the output projection.

use candle::{Result, Tensor, D};

use super::projection::Projected;
use super::{InProjWeight, MultiheadAttention};
use crate::attention::AttentionOptions;
use crate::nn::Lora;
use crate::rng::derive_seed;

impl MultiheadAttention {
    /// The module with LoRA adapters: `in_proj` on the packed input projection (`E → 3E`,
    /// q | k | v rows of its `lora_B`), `out_proj` on the output projection. Errors when the
    /// projections are separate (`kdim`/`vdim` ≠ `E`) and `in_proj` is given, or when an
    /// adapter's features are not its projection's.
    ///
    /// PyTorch equivalent: PEFT's `lora.Linear` around GPT-2's `c_attn` and `c_proj`
    /// (PEFT's own `nn.MultiheadAttention` adapter merges into the weights on every call
    /// instead; the outputs are the same).
    pub fn with_lora(mut self, in_proj: Option<Lora>, out_proj: Option<Lora>) -> Result<Self> {
        if let Some(l) = &in_proj {
            let InProjWeight::Packed(w) = &self.in_proj_weight else {
                candle::bail!(
                    "LoRA on in_proj needs the packed in_proj_weight (kdim = vdim = embed_dim)"
                )
            };
            let (out, inp) = w.dims2()?;
            if l.features()? != (inp, out) {
                candle::bail!(
                    "LoRA: an adapter of {:?} features (in, out) on in_proj_weight {:?}",
                    l.features()?,
                    w.dims()
                )
            }
        }
        self.in_proj_lora = in_proj;
        if let Some(l) = out_proj {
            self.out_proj = self.out_proj.clone().with_lora(l)?;
        }
        Ok(self)
    }

    /// The input projection's adapter, if any (the output projection's is
    /// [`out_proj`](Self::out_proj)`().lora()`).
    pub fn in_proj_lora(&self) -> Option<&Lora> {
        self.in_proj_lora.as_ref()
    }

    /// Whether either projection has an adapter.
    pub fn has_lora(&self) -> bool {
        self.in_proj_lora.is_some() || self.out_proj.lora().is_some()
    }

    /// The module with its adapters merged into `in_proj_weight` and `out_proj.weight`: the
    /// same outputs from plain weights (what the key/value cache paths take).
    ///
    /// PyTorch equivalent: `merge_and_unload()`.
    pub fn merged(&self) -> Result<Self> {
        let mut m = self.clone();
        if let (Some(l), InProjWeight::Packed(w)) = (&self.in_proj_lora, &self.in_proj_weight) {
            m.in_proj_weight = InProjWeight::Packed(l.merge(w)?);
        }
        m.in_proj_lora = None;
        m.out_proj = self.out_proj.merged()?;
        Ok(m)
    }

    /// The packed input and the output projection's weights with their adapters folded in
    /// (`W + s·B·A`, differentiable in A and B), for the op that keeps both projections
    /// inside: taking them out of it would cost more than the one weight-sized product the
    /// fold adds to each backward pass. `None` when an adapter drops its input in this call
    /// (its dropout touches the adapter's path only, which a folded weight cannot).
    pub(super) fn folded_weights(
        &self,
        opts: &AttentionOptions,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let InProjWeight::Packed(w) = &self.in_proj_weight else {
            return Ok(None);
        };
        let lora = [self.in_proj_lora.as_ref(), self.out_proj.lora()];
        if opts.train && lora.iter().flatten().any(|l| l.dropout() > 0.0) {
            return Ok(None);
        }
        let fold = |l: Option<&Lora>, w: &Tensor| match l {
            Some(l) => l.adapted_weight(w),
            None => Ok(w.clone()),
        };
        Ok(Some((
            fold(lora[0], w)?,
            fold(lora[1], self.out_proj.weight())?,
        )))
    }

    /// Errors when the module has adapters: `what` computes from the weights alone.
    pub(super) fn check_no_lora(&self, what: &str) -> Result<()> {
        if self.has_lora() {
            candle::bail!("{what}: this module has LoRA adapters; call it on `merged()`")
        }
        Ok(())
    }

    /// The adapters' dropout `(seed, offset)` of one call in training mode (from the call's
    /// seed, or the module's, and `label`), `None` in evaluation.
    fn lora_dropout(&self, opts: &AttentionOptions, x: &Tensor, label: &str) -> Option<(u64, u64)> {
        if !opts.train {
            return None;
        }
        let seed = opts.dropout_seed.unwrap_or(self.config.dropout_seed);
        let per_row = match x.dims() {
            [_, rest @ ..] if self.config.batch_first => rest.iter().product::<usize>(),
            _ => 0,
        };
        Some((
            derive_seed(seed, label),
            (opts.dropout_first_row * per_row) as u64,
        ))
    }

    /// The input projections plus the input adapter's update (the q, k and v parts of it
    /// for separate inputs).
    pub(super) fn add_in_proj_lora(
        &self,
        projected: Projected,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        opts: &AttentionOptions,
    ) -> Result<Projected> {
        let Some(l) = &self.in_proj_lora else {
            return Ok(projected);
        };
        let e = self.config.embed_dim;
        let part = |x: &Tensor, i: usize, label: &str| -> Result<Tensor> {
            l.delta(x, self.lora_dropout(opts, x, label))?
                .narrow(D::Minus1, i * e, e)
        };
        Ok(match projected {
            Projected::Packed(qkv) => {
                Projected::Packed((qkv + l.delta(q, self.lora_dropout(opts, q, "lora/in_proj"))?)?)
            }
            Projected::Separate(pq, pk, pv) => Projected::Separate(
                (pq + part(q, 0, "lora/in_proj/q")?)?,
                (pk + part(k, 1, "lora/in_proj/k")?)?,
                (pv + part(v, 2, "lora/in_proj/v")?)?,
            ),
        })
    }

    /// The output projection's result plus its adapter's update of the context.
    pub(super) fn add_out_proj_lora(
        &self,
        output: Tensor,
        ctx: &Tensor,
        opts: &AttentionOptions,
    ) -> Result<Tensor> {
        match self.out_proj.lora() {
            Some(l) => output + l.delta(ctx, self.lora_dropout(opts, ctx, "lora/out_proj"))?,
            None => Ok(output),
        }
    }
}
