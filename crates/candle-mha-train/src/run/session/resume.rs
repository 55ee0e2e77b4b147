//! [`Session::resume`]: a saved run continued with its data, model, dtype and configuration.

use super::*;

impl Session {
    /// Continues the run saved in `dir` with its data, tokenizer, model, dtype and
    /// configuration; `steps` replaces its total when given. Finishes a save that a kill
    /// interrupted first. The data must be the run's: the same tokenizer, number of ids and
    /// recorded SHA-256 (a data directory inside the run is found wherever the run was moved).
    ///
    /// PyTorch equivalent: `model.load_state_dict(...)`, `optimizer.load_state_dict(...)` and
    /// the script's own step counter.
    pub fn resume(
        dir: &Path,
        how: ResumeRun,
        device: &Device,
        comm: &dyn Communicator,
        observer: &mut dyn SetupObserver,
    ) -> RunResult<Self> {
        let lock = own(dir, comm)?;
        if !dir.join(STATE_FILE).exists() {
            return Err(RunError::NoRun {
                dir: dir.to_path_buf(),
            });
        }
        // The model's files (a LoRA run's lora.json among them), the optimizer and the state.
        let mut read = crate::run::state::model_files(dir)?;
        read.extend([STATE_FILE, OPTIMIZER_FILE]);
        let files = SetFiles {
            allowed: &CHECKPOINT_FILES,
            read: &read,
        };
        match comm.rank() {
            0 => recover_file_set(dir, files)?,
            _ => verify_file_set(dir, files)?,
        };
        let state = TrainerState::load(dir)?;
        let dtype = state.dtype()?;
        match how.dtype {
            Some(d) if d != dtype => {
                return Err(candle::Error::Msg(format!(
                    "dtype {}: the run in {} trains in {} (a resumed run keeps its dtype)",
                    d.as_str(),
                    dir.display(),
                    dtype.as_str()
                ))
                .into())
            }
            _ => {}
        }
        check_dtype(dtype)?;
        let (spec, new_lock) = match (state.data.clone(), how.data) {
            (Some(spec), _) => (spec, None),
            (None, Some(data)) => new_spec(dir, data.encoded_for(dir), comm, observer)?,
            (None, None) => return Err(candle::Error::Msg(format!(
                "{} does not say what the run trains on (an imported checkpoint, or a trainer given its data directly): give its data",
                dir.join(STATE_FILE).display()
            )).into()),
        };
        if let Some(kind) = state.device.as_deref() {
            if kind != device_kind(device) && comm.rank() == 0 {
                observer.notice(&format!(
                    "the run trained on {kind} and continues on {}: its numbers will differ from an uninterrupted run's in the last bits",
                    device_kind(device)
                ));
            }
        }
        // The run's own data directory is the run's: no `mha prepare` may change it meanwhile.
        let data_lock = match (&spec, comm.rank(), new_lock) {
            (_, _, Some(lock)) => Some(lock),
            (DataSpec::Prepared { dir: data, .. }, 0, None) if inside(data, dir) => {
                Some(DirLock::acquire(data, "training (its data)")?)
            }
            _ => None,
        };
        if how.verify_data && comm.rank() == 0 {
            verify(&spec, observer)?;
        }
        let cfg = NextTokenPredictorConfig::load(dir.join(CONFIG_FILE))?;
        let max_tokens = match state.max_tokens {
            None => cfg.max_len + 1,
            Some(t) if (2..=cfg.max_len).contains(&t) => t,
            Some(t) => {
                return Err(candle::Error::Msg(format!(
                    "{}: max_tokens {t}, expected 2..={} (shorter than the model's context + 1)",
                    dir.join(STATE_FILE).display(),
                    cfg.max_len
                ))
                .into())
            }
        };
        if let Some(limit) = how.memory_limit {
            let lora = read.contains(&crate::run_dir::LORA_FILE);
            let step = (state.config.batch_size, max_tokens - 1, lora);
            check_memory(&cfg, dtype, step, limit)?;
        }
        let codec = Codec::load_dir(dir)?;
        let data = spec.load(Some(codec), None, 0, Some(max_tokens))?;
        // The checkpoint fills every variable (checked strictly): no initialisation drawn.
        let (model, varmap) = crate::run::lora::resume_model(dir, &cfg, dtype, device)?;
        // The files were recovered (or verified) above: not hashed again. A run that recorded
        // no data records the data it was given from now on.
        let mut state = state;
        state.data = Some(spec.clone());
        let trainer = Trainer::resume_loaded(model, varmap, dir, state, how.steps)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            trainer: trainer.with_codec(data.codec.clone()),
            spec,
            data,
            model: cfg,
            resumed: true,
            _lock: lock,
            _data_lock: data_lock,
        })
    }
}
