//! A sequence the reference path cannot hold in a small memory budget: L = 4096 causal
//! self-attention, forward and backward through the fused kernel, in this test binary's own
//! process so that its peak RSS is the measure.
//!
//! The reference path materialises `(N, H, L, L)` scores, probabilities and their gradients:
//! 4 heads × 4096² × 4 bytes = 256 MiB per tensor, over 1 GiB for a training step. The fused
//! path keeps O(L·E): the test allows 96 MiB of growth for everything.

use anyhow::Result;
use candle_mha::candle::{DType, Device, IndexOp, Tensor, Var};
use candle_mha::rng::normal;
use candle_mha::{
    seeded_var_builder, AttentionKernel, AttentionOptions, MultiheadAttention,
    MultiheadAttentionConfig,
};
use candle_nn::VarMap;

/// (`VmRSS`, `VmHWM`) in bytes; `None` where /proc is not there.
fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[test]
fn causal_l4096_forward_and_backward_in_small_memory() -> Result<()> {
    let (l, e, h) = (4096, 64, 4);
    let dev = Device::Cpu;
    let cfg = MultiheadAttentionConfig::new(e, h).with_batch_first(true);
    let varmap = VarMap::new();
    let mha = MultiheadAttention::new(cfg, seeded_var_builder(&varmap, 3, DType::F32, &dev))?;
    let x = Var::from_tensor(&normal(0.0, 1.0, (1, l, e), DType::F32, &dev, 4)?)?;
    let opts = AttentionOptions::new()
        .with_need_weights(false)
        .with_is_causal(true)
        .with_kernel(AttentionKernel::Fused);
    let before = rss();
    let out = mha.forward(&x, &x, &x, &opts)?.output;
    let grads = out.sqr()?.sum_all()?.backward()?;
    let after = rss();
    let gx = grads.get(&x).expect("input gradient");
    assert!(gx.abs()?.sum_all()?.to_scalar::<f32>()?.is_finite());
    for (_, p) in mha.named_parameters() {
        let g = grads.get(&p).expect("every parameter gets a gradient");
        assert!(g.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
    }
    if let (Some((rss0, _)), Some((_, peak))) = (before, after) {
        let growth = peak.saturating_sub(rss0) as f64 / 1048576.0;
        println!("L={l}: peak RSS grew by {growth:.1} MiB");
        assert!(growth < 96.0, "peak RSS grew by {growth:.1} MiB");
    }

    // Causal attention of a prefix sees only the prefix: the first 64 rows must equal the
    // reference path run on the first 64 tokens.
    let prefix = x.as_tensor().i((.., ..64, ..))?.contiguous()?;
    let reference = mha.forward(
        &prefix,
        &prefix,
        &prefix,
        &opts.clone().with_kernel(AttentionKernel::Reference),
    )?;
    let ours: Tensor = out.i((.., ..64, ..))?;
    let diff = (ours - reference.output)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(
        diff < 1e-5,
        "prefix rows differ from the reference by {diff}"
    );
    Ok(())
}
