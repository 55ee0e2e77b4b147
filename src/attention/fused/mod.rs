//! Fused attention on the CPU: scores, masks, softmax, dropout and the value product in one
//! pass over tiles, forward and backward, without an `L × S` buffer.
//!
//! The scheme is FlashAttention-2's (Dao, 2023): each task takes a tile of queries of one
//! (batch, head), runs over tiles of keys keeping a running row maximum and sum (online
//! softmax), and stores only the output and the row log-sum-exp. The backward pass recomputes
//! the probabilities of each tile from that log-sum-exp; dropout is a counter-based function
//! of the element index ([`DropoutMask`](crate::nn::dropout::DropoutMask)), so the
//! forward and backward passes draw the same mask without storing it. The weights, when asked
//! for, are written in a second pass from the same log-sum-exp.
//!
//! Files: `kernel/` holds the kernels over slices (`forward`, `backward`, `weights`, `decode`,
//! their tiles); each `*_op.rs` here wraps one as a candle op on tensors (`op.rs`: the
//! attention with its backward, `weights_op.rs`, `decode_op.rs`); `projected.rs` fuses the
//! input and output projections around them; `cuda/` is the GPU kernel.
//!
//! PyTorch equivalent: the math of `F.multi_head_attention_forward` (what
//! `F.scaled_dot_product_attention`'s CPU flash kernel computes), with the module's
//! fully-masked-row rule (zeros, finite gradients) and its `bias_k` / zero-attention columns.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod decode_op;
pub(crate) mod kernel;
mod op;
mod projected;
mod sdpa_op;
mod weights_op;

/// The fused linear is the CPU layer's (`crate::cpu::linear`); kept here for the module's
/// imports.
pub(crate) use crate::cpu::linear;
pub(crate) use decode_op::decode_attention;
pub(crate) use kernel::Geom;
pub(crate) use op::FusedAttention;
pub(crate) use projected::{projected_self_attention, projected_self_attention_output};
pub(crate) use sdpa_op::FusedSdpa;
pub(crate) use weights_op::FusedWeights;
