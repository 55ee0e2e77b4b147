//! `Session`: the one call behind `mha train`, from Rust. A new run in a directory, the
//! directory refused to a second new run, the run resumed further with the same data, the
//! checkpoint recording its data, and the options checked before anything is written.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha_train::data::{DataSpec, PrepareJob};
use candle_mha_train::distributed::SingleProcess;
use candle_mha_train::models::NextTokenPredictorConfig;
use candle_mha_train::run::run_data_spec;
use candle_mha_train::run_dir::STATE_FILE;
use candle_mha_train::{NewData, NewRun, ResumeRun, RunError, Session, TrainConfig};

fn synthetic() -> NewData {
    NewData::Spec(DataSpec::Synthetic {
        num_keys: 6,
        num_values: 6,
        pairs: 3,
        train_examples: 64,
        val_examples: 16,
        seed: 3,
    })
}

/// The GPL's text with a BPE of 300 ids, four validation windows.
fn gpl_text_data() -> NewData {
    let mut job = PrepareJob::text(vec![common::gpl_text().into()]);
    job.vocab_size = 300;
    NewData::Text {
        job,
        eval_windows: 4,
    }
}

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 8,
        eval_every: 0,
        save_every: 0,
        ..TrainConfig::default()
    }
}

#[test]
fn a_run_starts_saves_and_resumes_in_its_directory() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let run = NewRun::new(synthetic(), config(6));
    let mut session = Session::start(&dir, run, &Device::Cpu, &SingleProcess, &mut ())?;
    assert!(!session.resumed);
    let eval = session
        .run(&SingleProcess, &mut ())?
        .expect("one process reports");
    assert!(eval.loss.is_finite());
    assert_eq!(session.trainer.state().step, 6);
    assert_eq!(run_data_spec(&dir)?, session.spec);
    drop(session);

    // The directory holds a run: a new one is refused and nothing changes.
    let before = std::fs::read(dir.join(STATE_FILE))?;
    // A new 6-step run of the synthetic task in `d`.
    let start_in = |d: &std::path::Path| {
        Session::start(
            d,
            NewRun::new(synthetic(), config(6)),
            &Device::Cpu,
            &SingleProcess,
            &mut (),
        )
    };
    let again = start_in(&dir);
    // A variant a program can match, not only a message.
    match again {
        Err(RunError::RunExists { dir: d }) => assert_eq!(d, dir),
        Err(e) => panic!("expected RunExists, got {e}"),
        Ok(_) => panic!("a second new run in the same directory started"),
    }
    assert_eq!(std::fs::read(dir.join(STATE_FILE))?, before);
    // Resuming an empty directory, and a new run beside a stray file, are variants too.
    let empty = tmp.path().join("empty");
    let resumed = Session::resume(
        &empty,
        ResumeRun::default(),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    );
    assert!(
        matches!(resumed, Err(RunError::NoRun { .. })),
        "{:?}",
        resumed.err()
    );
    let stray = tmp.path().join("stray");
    std::fs::create_dir_all(&stray)?;
    std::fs::write(stray.join("notes.txt"), "mine")?;
    let started = start_in(&stray);
    match started {
        Err(RunError::StrayFiles { files, .. }) => assert_eq!(files, ["notes.txt"]),
        other => panic!("expected StrayFiles, got {:?}", other.err()),
    }
    // Another owner's lock.
    let held = candle_mha_train::run::lock::DirLock::acquire(&stray, "a test")?;
    let locked = start_in(&stray);
    assert!(
        matches!(locked, Err(RunError::Locked { .. })) || cfg!(not(unix)),
        "{:?}",
        locked.err()
    );
    drop(held);
    // A text run whose data directory another process is preparing: the same variant.
    let texts = tmp.path().join("texts");
    let held = candle_mha_train::run::lock::DirLock::acquire(&texts.join("data"), "a test")?;
    let locked = Session::start(
        &texts,
        NewRun::new(gpl_text_data(), config(6)),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    );
    assert!(
        matches!(&locked, Err(RunError::Locked { dir, .. }) if dir.ends_with("data")),
        "{:?}",
        locked.err()
    );
    drop(held);

    // Resumed to 10 steps: the same data and model, four more steps.
    let how = ResumeRun {
        steps: Some(10),
        ..ResumeRun::default()
    };
    let mut session = Session::resume(&dir, how, &Device::Cpu, &SingleProcess, &mut ())?;
    assert!(session.resumed);
    assert_eq!(session.trainer.state().step, 6);
    session.run(&SingleProcess, &mut ())?;
    assert_eq!(session.trainer.state().step, 10);
    assert_eq!(session.trainer.state().losses.len(), 10);
    Ok(())
}

#[test]
fn bad_options_fail_before_anything_is_written() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let half = NewRun::new(synthetic(), config(6)).with_dtype(DType::BF16);
    let e = Session::start(&dir, half, &Device::Cpu, &SingleProcess, &mut ())
        .err()
        .expect("bf16 training")
        .to_string();
    assert!(e.contains("training runs in f32 or f64"), "{e}");
    let empty = NewRun::new(
        synthetic(),
        TrainConfig {
            batch_size: 0,
            ..config(6)
        },
    );
    let e = Session::start(&dir, empty, &Device::Cpu, &SingleProcess, &mut ())
        .err()
        .expect("batch size 0")
        .to_string();
    assert!(e.contains("batch_size"), "{e}");
    assert!(!dir.join(STATE_FILE).exists());
    let e = Session::resume(
        &dir,
        ResumeRun::default(),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    )
    .err()
    .expect("nothing to resume")
    .to_string();
    assert!(e.contains("to resume from"), "{e}");
    Ok(())
}

/// Text with nothing but the defaults: prepared into the run's `data/`, the text model's
/// context, a BPE of the asked size.
#[test]
fn text_starts_with_the_text_defaults() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let data = gpl_text_data();
    let session = Session::start(
        &dir,
        NewRun::new(data, config(1)),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    )?;
    assert_eq!(
        session.model.max_len,
        NextTokenPredictorConfig::for_text(0).max_len
    );
    assert_eq!(session.data.longest, session.model.max_len + 1);
    assert_eq!(session.data.codec.vocab_size(), 300);
    assert!(matches!(session.spec, DataSpec::Prepared { .. }));
    assert!(dir.join("data/tokens.bin").exists());
    Ok(())
}

/// Stops a run after `at` steps (as Ctrl-C would: the loop saves, then returns).
struct StopAt(u64, u64);

impl candle_mha_train::TrainObserver for StopAt {
    fn on_step(&mut self, step: u64, _: &candle_mha_train::StepStats) {
        self.1 = step;
    }
    fn should_stop(&self) -> bool {
        self.1 >= self.0
    }
}

/// An f64 run resumed with the defaults (no dtype given) continues in f64 and ends bit for bit
/// where the uninterrupted run ends; a contradicting dtype is refused; the state records the
/// dtype, the device and its format.
#[test]
fn a_resumed_run_keeps_its_dtype() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let run = |dir: &std::path::Path, stop: Option<u64>| -> Result<()> {
        let new = NewRun::new(synthetic(), config(8)).with_dtype(DType::F64);
        let mut session = Session::start(dir, new, &Device::Cpu, &SingleProcess, &mut ())?;
        match stop {
            Some(at) => session.run(&SingleProcess, &mut StopAt(at, 0))?,
            None => session.run(&SingleProcess, &mut ())?,
        };
        Ok(())
    };
    let whole = tmp.path().join("whole");
    run(&whole, None)?;
    let parts = tmp.path().join("parts");
    run(&parts, Some(3))?;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(parts.join(STATE_FILE))?)?;
    assert_eq!(state["step"], 3);
    assert_eq!(state["dtype"], "f64");
    assert_eq!(state["device"], "cpu");
    assert_eq!(state["version"], 2);

    let f32 = ResumeRun {
        dtype: Some(DType::F32),
        ..ResumeRun::default()
    };
    let e = Session::resume(&parts, f32, &Device::Cpu, &SingleProcess, &mut ())
        .err()
        .expect("f32 on an f64 run")
        .to_string();
    assert!(
        e.contains("dtype f32") && e.contains("trains in f64"),
        "{e}"
    );

    let mut session = Session::resume(
        &parts,
        ResumeRun::default(),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    )?;
    assert_eq!(session.trainer.varmap().all_vars()[0].dtype(), DType::F64);
    session.run(&SingleProcess, &mut ())?;
    drop(session);
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let same = std::fs::read(whole.join(f))? == std::fs::read(parts.join(f))?;
        assert!(
            same,
            "{f}: the resumed f64 run differs from the uninterrupted one"
        );
    }
    Ok(())
}

/// A text run records its data directory relative to each checkpoint (`data`, and `../data`
/// from `best/`), so that the run moved elsewhere reopens it; the data's count and SHA-256
/// are recorded too.
#[test]
fn a_text_run_records_its_data_relative_to_the_run() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let data = gpl_text_data();
    let train = TrainConfig {
        eval_every: 1,
        ..config(2)
    };
    let mut session = Session::start(
        &dir,
        NewRun::new(data, train)
            .with_model(Box::new(|vocab, _| NextTokenPredictorConfig {
                max_len: 16,
                embed_dim: 16,
                num_heads: 2,
                num_layers: 1,
                ff_dim: 32,
                ..NextTokenPredictorConfig::for_text(vocab)
            }))
            .with_max_len(16),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    )?;
    session.run(&SingleProcess, &mut ())?;
    drop(session);
    for (ckpt, want) in [(dir.clone(), "data"), (dir.join("best"), "../data")] {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ckpt.join(STATE_FILE))?)?;
        assert_eq!(state["data"]["dir"], want, "{}", ckpt.display());
        assert!(state["data"]["num_tokens"]
            .as_u64()
            .is_some_and(|n| n > 1000));
        assert_eq!(
            state["data"]["tokens_sha256"].as_str().map(str::len),
            Some(64)
        );
    }
    let moved = tmp.path().join("moved");
    std::fs::rename(&dir, &moved)?;
    for ckpt in [moved.clone(), moved.join("best")] {
        match run_data_spec(&ckpt)? {
            DataSpec::Prepared { dir, .. } => assert_eq!(dir, moved.join("data").canonicalize()?),
            other => panic!("{other:?}"),
        }
    }
    Ok(())
}

/// A checkpoint fine-tuned on windows shorter than its context: the windows, not the context,
/// size the memory check, and a resume keeps them (it continues as the uninterrupted run).
#[test]
fn a_fine_tune_on_shorter_windows_resumes_on_them() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let base = tmp.path().join("base");
    let small = |vocab| NextTokenPredictorConfig {
        max_len: 64,
        embed_dim: 16,
        num_heads: 2,
        num_layers: 1,
        ff_dim: 32,
        ..NextTokenPredictorConfig::for_text(vocab)
    };
    let run = NewRun::new(gpl_text_data(), config(1))
        .with_model(Box::new(move |vocab, _| small(vocab)))
        .with_max_len(64);
    Session::start(&base, run, &Device::Cpu, &SingleProcess, &mut ())?
        .run(&SingleProcess, &mut ())?;

    // A limit between a step of 8 windows of 8 tokens and one of the context's 64.
    let cfg = small(300);
    let (short, full) = (
        cfg.memory(DType::F32, 8 * 8, true).total(),
        cfg.memory(DType::F32, 8 * 64, true).total(),
    );
    assert!(short < full);
    let limit = ((short + full) / 2) as u64;
    let fine_tune = |dir: &std::path::Path, steps, max_len| {
        let mut run = NewRun::new(gpl_text_data(), config(steps)).with_max_len(max_len);
        run.init_from = Some(base.clone());
        run.memory_limit = Some(limit);
        Session::start(dir, run, &Device::Cpu, &SingleProcess, &mut ())
    };
    let refused = fine_tune(&tmp.path().join("whole"), 4, 64);
    assert!(
        refused
            .as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("training this model")),
        "{:?}",
        refused.err()
    );
    let mut whole = fine_tune(&tmp.path().join("whole"), 4, 8)?;
    whole.run(&SingleProcess, &mut ())?;
    assert_eq!(whole.trainer.state().max_tokens, Some(9));

    let split = tmp.path().join("split");
    fine_tune(&split, 2, 8)?.run(&SingleProcess, &mut ())?;
    let how = ResumeRun {
        steps: Some(4),
        memory_limit: Some(limit),
        ..ResumeRun::default()
    };
    let mut resumed = Session::resume(&split, how, &Device::Cpu, &SingleProcess, &mut ())?;
    assert_eq!(resumed.data.longest, 9);
    resumed.run(&SingleProcess, &mut ())?;
    assert_eq!(resumed.trainer.state().losses, whole.trainer.state().losses);
    Ok(())
}
