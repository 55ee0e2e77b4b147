//! [`Session::start`]'s work once the directory is owned: the data, the model (new, from a
//! checkpoint, or a LoRA run on one) and the trainer, all checked before anything is written.

use super::*;

/// The checkpoint a new run starts from, and its weights.
struct Init {
    ckpt: crate::Checkpoint,
    weights: candle_mha::checkpoint::StateDict,
}

impl Init {
    fn load(dir: &Path, unverified: crate::Unverified) -> Result<Self> {
        let ckpt = crate::Checkpoint::open(dir, unverified)?;
        Ok(Self {
            weights: ckpt.weights()?,
            ckpt,
        })
    }
}

impl Session {
    pub(super) fn start_new(
        dir: &Path,
        mut run: NewRun,
        device: &Device,
        comm: &dyn Communicator,
        observer: &mut dyn SetupObserver,
        lock: Option<DirLock>,
    ) -> RunResult<Self> {
        if dir.join(STATE_FILE).exists() {
            return Err(RunError::RunExists {
                dir: dir.to_path_buf(),
            });
        }
        check_dtype(run.dtype)?;
        run.train.validate()?;
        if run.lora.is_some() && run.init_from.is_none() {
            return Err(candle::Error::Msg(
                "LoRA trains adapters on a model to start from: give init_from (--init-from)"
                    .into(),
            )
            .into());
        }
        if comm.rank() == 0 {
            check_fresh(dir, matches!(run.data, NewData::Text { .. }))?;
        }
        if let Some(init) = &run.init_from {
            run.data = run.data.encoded_for(init);
        }
        let (spec, data_lock) = new_spec(dir, run.data, comm, observer)?;
        if run.verify_data && comm.rank() == 0 {
            verify(&spec, observer)?;
        }
        let init = run
            .init_from
            .as_deref()
            .map(|d| Init::load(d, run.init_unverified))
            .transpose()?;
        let max_tokens = match &init {
            // Windows up to the checkpoint's context (shorter ones train its first positions).
            Some(i) => match run.max_len {
                Some(m) if m > i.ckpt.config.max_len => {
                    return Err(candle::Error::Msg(format!(
                        "max_len {m}: longer than the context of the checkpoint to start from ({})",
                        i.ckpt.config.max_len
                    ))
                    .into())
                }
                Some(m) => Some(m + 1),
                None => Some(i.ckpt.config.max_len + 1),
            },
            None => run.max_len.map(|m| m + 1),
        };
        // Data for a checkpoint's model must be in its tokenization (checked by the load).
        let data = spec.load(
            init.as_ref().map(|i| i.ckpt.codec.clone()),
            None,
            0,
            max_tokens,
        )?;
        let cfg = match &init {
            Some(i) => i.ckpt.config.clone(),
            None => (run.model)(data.codec.vocab_size(), data.longest),
        };
        cfg.validate()?;
        // A checkpoint fine-tuned on shorter windows than its context trains (and resumes) on
        // those: they, not the context, size a step.
        let window = max_tokens
            .filter(|&t| t <= cfg.max_len)
            .filter(|_| init.is_some());
        if let Some(limit) = run.memory_limit {
            let context = window.map_or(cfg.max_len, |t| t - 1);
            let step = (run.train.batch_size, context, run.lora.is_some());
            check_memory(&cfg, run.dtype, step, limit)?;
        }
        let seed = run.train.seed;
        let (model, varmap, lora) = match (init, &run.lora) {
            (Some(i), Some(lora)) => {
                let (model, varmap, record) = crate::run::lora::start_model(
                    &i.ckpt,
                    i.weights,
                    lora,
                    (run.dtype, device, seed),
                )?;
                (model, varmap, Some(record))
            }
            (init, _) => {
                let varmap = VarMap::new();
                // A checkpoint to start from fills every variable: no initialisation is
                // drawn, and each of its tensors is let go once copied.
                let vb = match &init {
                    Some(_) => zeroed_var_builder(&varmap, run.dtype, device),
                    None => seeded_var_builder(&varmap, seed, run.dtype, device),
                };
                let model = NextTokenPredictor::new(cfg.clone(), vb)?;
                if let Some(i) = init {
                    let opts = candle_mha::checkpoint::LoadOptions::new()
                        .with_module("NextTokenPredictor")
                        .with_source(&i.ckpt.weights_file.display().to_string());
                    candle_mha::checkpoint::load_into_varmap_owned(&varmap, i.weights, &opts)?;
                }
                (model, varmap, None)
            }
        };
        // Checks everything before anything is written into the directory.
        let mut trainer =
            Trainer::new(model, varmap, run.train, Some(spec.clone()))?.with_max_tokens(window);
        if let Some(record) = lora {
            trainer = trainer.with_lora_record(record);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            trainer: trainer.with_codec(data.codec.clone()),
            spec,
            data,
            model: cfg,
            resumed: false,
            _lock: lock,
            _data_lock: data_lock,
        })
    }
}

/// Errors, listing them, when the directory of a new run holds files a run does not write
/// (checked before any work): only its lock, the `data/` of text runs, a `best/` checkpoint
/// and a `metrics.jsonl` of an earlier attempt that stopped before its first checkpoint, and
/// temporary files may be there. A link at any of these names is refused too.
pub(crate) fn check_fresh(dir: &Path, text: bool) -> RunResult<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut stray = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if md.file_type().is_symlink() {
            refuse_link(&path)?;
        }
        let ours = match name.as_str() {
            crate::run_dir::LOCK_FILE => true,
            RUN_DATA_DIR => text && md.is_dir(),
            BEST_DIR => md.is_dir() && holds_only_checkpoint(&path),
            METRICS_FILE => read_metrics(&path).is_ok_and(|log| log.skipped.is_empty()),
            n => is_scratch(n),
        };
        if !ours {
            stray.push(name);
        }
    }
    if !stray.is_empty() {
        stray.sort();
        return Err(RunError::StrayFiles {
            dir: dir.to_path_buf(),
            files: stray,
        });
    }
    Ok(())
}

/// Whether directory `dir` holds nothing but a checkpoint's files (and its bookkeeping).
fn holds_only_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().all(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            CHECKPOINT_FILES.contains(&name.as_str())
                || name == crate::run_dir::MANIFEST_FILE
                || is_scratch(&name)
        })
    })
}

/// Whether `name` is a save's scratch file: a temporary (`.NAME.tmp-…`) or staged
/// (`.NAME.staged`) file.
fn is_scratch(name: &str) -> bool {
    name.starts_with('.') && (name.contains(".tmp-") || name.ends_with(".staged"))
}
