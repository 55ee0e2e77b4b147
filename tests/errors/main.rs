//! Invalid calls return an `Err` (never panic, never `Ok`) whose message names the argument,
//! what was received and what was expected.
//!
//! One table, run in full: every case that does not fail as expected is listed in a single
//! report at the end. PyTorch's messages (spec §7) are used where PyTorch has one.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_mha::candle::{self, DType, Device, ModuleT, Tensor};
use candle_mha::{
    seeded_var_builder, AttentionOptions, MultiheadAttention, MultiheadAttentionConfig,
};
use candle_nn::{VarBuilder, VarMap};

mod config;
mod inputs;
mod kv_cache;
mod loading;
mod masks;
mod ranks;

/// Embedding size, heads, target length, source length and batch of the default calls.
const E: usize = 8;
const H: usize = 2;
const L: usize = 3;
const S: usize = 4;
const N: usize = 2;

pub struct Case {
    pub name: &'static str,
    /// Builds what it needs and makes one invalid call; setup must not fail.
    pub run: fn() -> candle::Result<()>,
    /// Substrings the error message must contain.
    pub expect: &'static [&'static str],
}

fn dev() -> Device {
    Device::Cpu
}

/// A fresh seeded module in f32 on the CPU.
fn module(cfg: MultiheadAttentionConfig) -> candle::Result<MultiheadAttention> {
    MultiheadAttention::new(
        cfg,
        seeded_var_builder(&VarMap::new(), 0, DType::F32, &dev()),
    )
}

/// The default module: `E = 8`, `H = 2`, seq-first.
fn default_module() -> candle::Result<MultiheadAttention> {
    module(MultiheadAttentionConfig::new(E, H))
}

/// An f32 tensor of `shape` (values do not matter: every call here is rejected).
fn t(shape: &[usize]) -> candle::Result<Tensor> {
    Tensor::randn(0f32, 1., shape, &dev())
}

/// A tensor of `shape` in `dtype`.
fn td(shape: &[usize], dtype: DType) -> candle::Result<Tensor> {
    Tensor::zeros(shape, dtype, &dev())
}

/// A forward call whose result is dropped.
fn call(
    m: &MultiheadAttention,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttentionOptions,
) -> candle::Result<()> {
    m.forward(q, k, v, opts).map(|_| ())
}

/// Default module, batched seq-first q `(L, N, E)`, k and v `(S, N, E)`, with `opts`.
fn batched_with(opts: AttentionOptions) -> candle::Result<()> {
    let m = default_module()?;
    call(&m, &t(&[L, N, E])?, &t(&[S, N, E])?, &t(&[S, N, E])?, &opts)
}

/// Default module, unbatched q `(L, E)`, k and v `(S, E)`, with `opts`.
fn unbatched_with(opts: AttentionOptions) -> candle::Result<()> {
    let m = default_module()?;
    call(&m, &t(&[L, E])?, &t(&[S, E])?, &t(&[S, E])?, &opts)
}

fn attn_mask(mask: Tensor) -> AttentionOptions {
    AttentionOptions::new().with_attn_mask(mask)
}

fn kpm(mask: Tensor) -> AttentionOptions {
    AttentionOptions::new().with_key_padding_mask(mask)
}

/// The parameters of a valid module for `cfg`, by state_dict name.
fn state_dict(cfg: &MultiheadAttentionConfig) -> candle::Result<HashMap<String, Tensor>> {
    Ok(module(cfg.clone())?
        .named_parameters()
        .into_iter()
        .collect())
}

/// Loads a module for `cfg` from `tensors`.
fn load(
    cfg: MultiheadAttentionConfig,
    tensors: HashMap<String, Tensor>,
) -> candle::Result<MultiheadAttention> {
    MultiheadAttention::new(cfg, VarBuilder::from_tensors(tensors, DType::F32, &dev()))
}
/// Every case, in the order of the modules: configuration, ranks, masks, inputs, loading.
fn cases() -> Vec<Case> {
    [
        config::cases(),
        ranks::cases(),
        masks::cases(),
        inputs::cases(),
        loading::cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The error's message without the backtrace candle attaches when `RUST_BACKTRACE` is set.
fn message(mut e: candle::Error) -> String {
    while let candle::Error::WithBacktrace { inner, .. } = e {
        e = *inner;
    }
    e.to_string()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_string()
    }
}

#[test]
fn invalid_calls_return_descriptive_errors() -> anyhow::Result<()> {
    let cases = cases();
    anyhow::ensure!(cases.len() >= 35, "only {} cases", cases.len());
    let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    anyhow::ensure!(names.len() == cases.len(), "case names are not unique");

    let mut failures = Vec::new();
    for case in &cases {
        let outcome = catch_unwind(AssertUnwindSafe(case.run));
        let problem = match outcome {
            Err(payload) => Some(format!("panicked: {}", panic_message(payload.as_ref()))),
            Ok(Ok(())) => Some("returned Ok instead of Err".to_string()),
            Ok(Err(e)) => {
                let msg = message(e);
                let missing: Vec<_> = case.expect.iter().filter(|s| !msg.contains(**s)).collect();
                (!missing.is_empty()).then(|| format!("message {msg:?} lacks {missing:?}"))
            }
        };
        if let Some(problem) = problem {
            failures.push(format!("- {}: {problem}", case.name));
        }
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} invalid calls did not fail as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}
