//! [`export_nanogpt`]: a run written back as nanoGPT's `ckpt.pt` (model, optimizer, step and
//! settings), which its `train.py` resumes.

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::{save_torch, PickleValue, StateDict};

use super::*;
use crate::formats::gpt2_names::{nanogpt_parameters, our_name, to_gpt2, Gpt2Format};
use crate::models::NextTokenPredictorConfig;
use crate::run::staged_dir::StagedDir;
use crate::run_dir::{CONFIG_FILE, OPTIMIZER_FILE, STATE_FILE};
use crate::{verify_checkpoint, TrainerState, Unverified};

fn s(v: &str) -> PickleValue {
    PickleValue::Str(v.to_string())
}

fn f(v: f64) -> PickleValue {
    PickleValue::Float(v)
}

fn n(v: u64) -> PickleValue {
    PickleValue::Int(v as i64)
}

/// A JSON value of [`ImportedRecord`](crate::ImportedRecord) as the pickle it came from.
fn from_json(v: &serde_json::Value) -> PickleValue {
    match v {
        serde_json::Value::Null => PickleValue::None,
        serde_json::Value::Bool(b) => PickleValue::Bool(*b),
        serde_json::Value::Number(x) => match x.as_i64() {
            Some(i) => PickleValue::Int(i),
            None => f(x.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(t) => s(t),
        serde_json::Value::Array(items) => PickleValue::List(items.iter().map(from_json).collect()),
        serde_json::Value::Object(_) => PickleValue::None,
    }
}

/// Writes the run (or checkpoint) directory `run` as nanoGPT's `out/ckpt.pt`: `model`
/// (nanoGPT's names, `lm_head.weight` the tied embedding), `model_args`, `optimizer` (AdamW's
/// `state_dict()` in nanoGPT's two groups: the ≥ 2-D tensors, then the rest), `iter_num`,
/// `best_val_loss` and `config`, so that `GPT(GPTConfig(**ckpt["model_args"]))` loads the
/// weights strictly and nanoGPT's `train.py` resumes it (`init_from="resume"`). Errors, before
/// anything is written, for a model nanoGPT cannot hold ([`NanoGptArgs::from_config`]).
///
/// PyTorch equivalent: nanoGPT's `torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))`.
pub fn export_nanogpt(run: &Path, out: &Path, unverified: Unverified) -> Result<()> {
    let staged = StagedDir::new(out, "mha export")?;
    let mut files = crate::run::state::model_files(run)?;
    files.extend([OPTIMIZER_FILE, STATE_FILE]);
    verify_checkpoint(run, &files, unverified)?;
    let cfg = NextTokenPredictorConfig::load(run.join(CONFIG_FILE))?;
    let args = NanoGptArgs::from_config(&cfg)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", run.display())))?;
    let ours = crate::run::lora::model_weights(run, &cfg)?;
    // A LoRA run's moments are its adapter's: the merged model goes without any.
    let lora = crate::run::lora::LoraRecord::load(run, &cfg)?.is_some();
    let theirs = to_gpt2(&ours, Gpt2Format::NanoGpt, &cfg)?;
    let state = TrainerState::load(run)?;
    let opt = StateDict::load(run.join(OPTIMIZER_FILE))?;
    let tc = &state.config;
    let meta = |k: &str, d: f64| {
        opt.metadata()
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(d)
    };
    // Parameter ids as nanoGPT's configure_optimizers numbers them.
    let order = nanogpt_parameters(&cfg);
    let (decay, rest): (Vec<_>, Vec<_>) = order.iter().partition(|(_, shape)| shape.len() >= 2);
    let mut moments = Vec::new();
    for (id, (name, _)) in decay.iter().chain(&rest).enumerate() {
        let ours = our_name(name)
            .ok_or_else(|| candle::Error::Msg(format!("{name}: no parameter of ours")))?;
        let get = |key: &str| {
            opt.get(&format!("{key}.{ours}")).cloned().ok_or_else(|| {
                candle::Error::Msg(format!(
                    "{}: no {key}.{ours}",
                    run.join(OPTIMIZER_FILE).display()
                ))
            })
        };
        let step = match lora {
            true => 0.0,
            false => get("step")?.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        };
        if step == 0.0 {
            continue; // PyTorch keeps no state for a parameter never stepped
        }
        moments.push((
            n(id as u64),
            PickleValue::Dict(vec![
                (
                    s("step"),
                    PickleValue::Tensor(Tensor::new(step as f32, &Device::Cpu)?),
                ),
                (
                    s("exp_avg"),
                    PickleValue::Tensor(get("exp_avg")?.to_dtype(DType::F32)?),
                ),
                (
                    s("exp_avg_sq"),
                    PickleValue::Tensor(get("exp_avg_sq")?.to_dtype(DType::F32)?),
                ),
            ]),
        ));
    }
    let wd = meta("weight_decay", tc.weight_decay);
    let group = |ids: std::ops::Range<usize>, weight_decay: f64| {
        PickleValue::Dict(vec![
            (s("lr"), f(meta("lr", tc.lr))),
            (
                s("betas"),
                PickleValue::Tuple(vec![f(meta("beta1", tc.beta1)), f(meta("beta2", tc.beta2))]),
            ),
            (s("eps"), f(meta("eps", 1e-8))),
            (s("weight_decay"), f(weight_decay)),
            (s("amsgrad"), PickleValue::Bool(false)),
            (s("foreach"), PickleValue::None),
            (s("maximize"), PickleValue::Bool(false)),
            (s("capturable"), PickleValue::Bool(false)),
            (s("differentiable"), PickleValue::Bool(false)),
            (s("fused"), PickleValue::None),
            (
                s("params"),
                PickleValue::List(ids.map(|i| n(i as u64)).collect()),
            ),
        ])
    };
    let rest_decay = if tc.decay_matrices_only { 0.0 } else { wd };
    let optimizer = PickleValue::Dict(vec![
        (s("state"), PickleValue::Dict(moments)),
        (
            s("param_groups"),
            PickleValue::List(vec![
                group(0..decay.len(), wd),
                group(decay.len()..order.len(), rest_decay),
            ]),
        ),
    ]);
    let model = PickleValue::Dict(
        theirs
            .tensors()
            .iter()
            .map(|(k, t)| (s(k), PickleValue::Tensor(t.clone())))
            .collect(),
    );
    let model_args = PickleValue::Dict(vec![
        (s("n_layer"), n(args.n_layer as u64)),
        (s("n_head"), n(args.n_head as u64)),
        (s("n_embd"), n(args.n_embd as u64)),
        (s("block_size"), n(args.block_size as u64)),
        (s("bias"), PickleValue::Bool(args.bias)),
        (s("vocab_size"), n(args.vocab_size as u64)),
        (s("dropout"), f(args.dropout)),
    ]);
    let ours = [
        ("learning_rate", f(tc.lr)),
        ("min_lr", f(tc.min_lr)),
        ("warmup_iters", n(tc.warmup_steps)),
        ("lr_decay_iters", n(tc.steps)),
        ("max_iters", n(tc.steps)),
        ("weight_decay", f(tc.weight_decay)),
        ("beta1", f(tc.beta1)),
        ("beta2", f(tc.beta2)),
        ("grad_clip", f(tc.clip_norm)),
        ("batch_size", n(tc.batch_size as u64)),
        ("gradient_accumulation_steps", n(tc.grad_accum as u64)),
        ("block_size", n(args.block_size as u64)),
        ("eval_interval", n(tc.eval_every)),
        ("dropout", f(args.dropout)),
        ("bias", PickleValue::Bool(args.bias)),
    ];
    // The imported checkpoint's config, every key in its order (its `dataset` tells nanoGPT's
    // sample.py where meta.pkl is), with the settings this run trains with in place.
    let imported = state.imported.as_ref();
    let mut config: Vec<(String, PickleValue)> = imported
        .map(|r| {
            r.nanogpt_config
                .iter()
                .map(|(k, v)| (k.clone(), from_json(v)))
                .collect()
        })
        .unwrap_or_default();
    for (key, value) in ours {
        match config.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => config.push((key.to_string(), value)),
        }
    }
    let config = PickleValue::Dict(config.into_iter().map(|(k, v)| (s(&k), v)).collect());
    // The lowest loss either run saw (nanoGPT's initial 1e9 when neither evaluated).
    let best = [
        state.best.as_ref().map(|b| b.eval.loss),
        imported.and_then(|r| r.best_val_loss),
    ]
    .into_iter()
    .flatten()
    .fold(1e9, f64::min);
    let checkpoint = PickleValue::Dict(vec![
        (s("model"), model),
        (s("optimizer"), optimizer),
        (s("model_args"), model_args),
        (s("iter_num"), n(state.step)),
        (s("best_val_loss"), f(best)),
        (s("config"), config),
    ]);
    save_torch(&staged.path().join("ckpt.pt"), &checkpoint)?;
    staged.finish()
}
