//! `Session`: the one call behind `mha train`, from Rust. A new run in a directory, the
//! directory refused to a second new run, the run resumed further with the same data, the
//! checkpoint recording its data, and the options checked before anything is written.

#[path = "../../../tests/common/mod.rs"]
mod common;

use anyhow::Result;
use candle_mha::candle::{DType, Device};
use candle_mha_train::data::{run_data_spec, DataSpec, PrepareJob};
use candle_mha_train::distributed::SingleProcess;
use candle_mha_train::models::NextTokenPredictorConfig;
use candle_mha_train::{NewData, NewRun, ResumeRun, Session, TrainConfig, STATE_FILE};

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
    let again = Session::start(
        &dir,
        NewRun::new(synthetic(), config(6)),
        &Device::Cpu,
        &SingleProcess,
        &mut (),
    );
    let e = again
        .err()
        .expect("a second new run in the same directory")
        .to_string();
    assert!(e.contains("already holds a run"), "{e}");
    assert_eq!(std::fs::read(dir.join(STATE_FILE))?, before);

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
    let mut job = PrepareJob::text(vec![common::gpl_text().into()]);
    job.vocab_size = 300;
    let data = NewData::Text {
        job,
        eval_windows: 4,
    };
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
