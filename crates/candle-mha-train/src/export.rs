//! A run handed back to PyTorch users (`mha export`): a Hugging Face `GPT2LMHeadModel`
//! directory, which `GPT2LMHeadModel.from_pretrained(dir)` loads with no missing or
//! unexpected key, or nanoGPT's `ckpt.pt`, which its `train.py` resumes.

use std::path::Path;

use candle::{DType, Device, Result, Tensor};
use candle_mha::checkpoint::{save_torch, PickleValue, StateDict};

use crate::data::Codec;
use crate::models::gpt2::{self, Gpt2Format, NanoGptArgs};
use crate::models::NextTokenPredictorConfig;
use crate::run_dir::{CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE};
use crate::staged_dir::StagedDir;
use crate::{verify_checkpoint, verify_model_files, TrainerState, Unverified};

/// Writes the model of the run (or checkpoint) directory `run` into `out` as a Hugging Face
/// GPT-2 directory: `config.json` ([`gpt2::config_to_hf`]), `model.safetensors` (GPT-2's
/// names, `Conv1D` weights stored `(in, out)`, the tied head left to `tie_word_embeddings`
/// as `save_pretrained` does; an untied one written as `lm_head.weight`) and the run's
/// `tokenizer.json` when it has one. A model without biases (nanoGPT's `bias=False`) is
/// written with zero biases, which GPT-2 always has: the same function, exactly. Errors,
/// before anything is written, for a model with an untied head that has a bias (GPT-2's
/// `lm_head` has none).
///
/// A Llama-family run is written as its Hugging Face class (`LlamaForCausalLM`, …): the
/// source's `config.json` and `generation_config.json`, the weights under their names in
/// their source dtypes ([`write_hf_dir`](crate::models::llama::write_hf_dir)), the tokenizer.
///
/// Returns the transformers class written (`GPT2LMHeadModel`, `LlamaForCausalLM`, …).
///
/// PyTorch equivalent: `model.save_pretrained(out)`.
pub fn export_hugging_face(run: &Path, out: &Path, unverified: Unverified) -> Result<&'static str> {
    let staged = StagedDir::new(out, "mha export")?;
    verify_model_files(run, unverified)?;
    let cfg = NextTokenPredictorConfig::load(run.join(CONFIG_FILE))?;
    if let (Some(llama), Some(record)) = (cfg.llama_config()?, &cfg.llama) {
        // The names are Hugging Face's already; each weight goes back in its source dtype.
        let ours = StateDict::load(run.join(MODEL_FILE))?;
        let weights = crate::models::llama::parameter_shapes(&llama)
            .into_iter()
            .map(|(name, _)| match ours.get(&name) {
                Some(t) => Ok((name, t.clone())),
                None => candle::bail!("{}: model.safetensors lacks {name}", run.display()),
            })
            .collect::<Result<Vec<_>>>()?;
        let dtypes: Vec<(String, DType)> = record
            .dtypes
            .iter()
            .map(|(n, d)| {
                let d = match d.as_str() {
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    _ => DType::F32,
                };
                (n.clone(), d)
            })
            .collect();
        let dir = staged.path();
        crate::models::llama::write_hf_files(
            dir,
            &llama,
            Some(&record.hf_config),
            record.generation_config.as_ref(),
            &weights,
            &dtypes,
        )?;
        let codec = Codec::load_dir(run)?;
        if let Codec::Text(_) = codec {
            codec.save_dir(dir)?;
        }
        staged.finish()?;
        return Ok(llama.family.architecture());
    }
    if cfg.head_has_bias() {
        candle::bail!(
            "{}: the model's head is not tied to the token embedding and has a bias (a run made before heads lost theirs by default); GPT2LMHeadModel's lm_head has none",
            run.display()
        )
    }
    let ours = StateDict::load(run.join(MODEL_FILE))?;
    let theirs = gpt2::to_gpt2(&ours, Gpt2Format::HuggingFace, &cfg)?;
    // GPT-2 has a bias in every Conv1D and LayerNorm: zeros add nothing.
    let with_biases = NextTokenPredictorConfig {
        bias: true,
        ..cfg.clone()
    };
    let zero_biases = match cfg.bias {
        true => Vec::new(),
        false => gpt2::nanogpt_parameters(&with_biases)
            .into_iter()
            .filter(|(name, _)| name.ends_with(".bias"))
            .map(|(name, shape)| Ok((name, Tensor::zeros(shape, DType::F32, &Device::Cpu)?)))
            .collect::<Result<Vec<_>>>()?,
    };
    let weights = StateDict::from_tensors(
        theirs
            .tensors()
            .iter()
            .filter(|(n, _)| !cfg.tie_embeddings || n != "lm_head.weight")
            .cloned()
            .chain(zero_biases),
    );
    let mut config = gpt2::config_to_hf(&cfg);
    let codec = Codec::load_dir(run)?;
    // Written even when unknown (null): GPT2Config's defaults (50256) lie outside a smaller
    // vocabulary, which transformers warns about.
    config["bos_token_id"] = codec.bos_id().into();
    config["eos_token_id"] = codec.eos_id().into();
    let config = serde_json::to_string_pretty(&config)
        .map_err(|e| candle::Error::Msg(format!("serializing config.json: {e}")))?;
    let dir = staged.path();
    candle_mha::io::write_atomic(&dir.join("config.json"), config.as_bytes())?;
    weights.save_safetensors(dir.join("model.safetensors"))?;
    if let Codec::Text(_) = codec {
        codec.save_dir(dir)?;
    }
    staged.finish()?;
    Ok("GPT2LMHeadModel")
}

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
    let files = [CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];
    verify_checkpoint(run, &files, unverified)?;
    let cfg = NextTokenPredictorConfig::load(run.join(CONFIG_FILE))?;
    let args = NanoGptArgs::from_config(&cfg)
        .map_err(|e| candle::Error::Msg(format!("{}: {e}", run.display())))?;
    let ours = StateDict::load(run.join(MODEL_FILE))?;
    let theirs = gpt2::to_gpt2(&ours, Gpt2Format::NanoGpt, &cfg)?;
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
    let order = gpt2::nanogpt_parameters(&cfg);
    let (decay, rest): (Vec<_>, Vec<_>) = order.iter().partition(|(_, shape)| shape.len() >= 2);
    let mut moments = Vec::new();
    for (id, (name, _)) in decay.iter().chain(&rest).enumerate() {
        let ours = gpt2::our_name(name)
            .ok_or_else(|| candle::Error::Msg(format!("{name}: no parameter of ours")))?;
        let get = |key: &str| {
            opt.get(&format!("{key}.{ours}")).cloned().ok_or_else(|| {
                candle::Error::Msg(format!(
                    "{}: no {key}.{ours}",
                    run.join(OPTIMIZER_FILE).display()
                ))
            })
        };
        let step = get("step")?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
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
