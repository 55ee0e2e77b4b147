//! The typed errors a program branches on, got back from the `candle::Error` the functions
//! return ([`candle_mha::error::find`]): data ([`DataError`]), checkpoints
//! ([`CheckpointError`]) and runs ([`RunError`]), each with the file and the key it is about.
//! Their messages stay the sentences the command line prints.

use std::path::Path;

use anyhow::Result;
use candle_mha::checkpoint::CheckpointError;
use candle_mha::error::find;
use candle_mha_train::data::{
    expand_sources, open_prepared, prepare_token_files, read_token_file, DataError, PrepareOptions,
    TokenData,
};
use candle_mha_train::distributed::SingleProcess;
use candle_mha_train::{ResumeRun, RunError, Session};

/// A data directory `dir/name` prepared from token lines of `symbols`.
fn prepared(dir: &Path, name: &str, symbols: &str) -> Result<std::path::PathBuf> {
    let src = dir.join(format!("{name}.txt"));
    std::fs::write(&src, format!("{symbols}\n").repeat(40))?;
    let out = dir.join(name);
    prepare_token_files(&[src], &out, &PrepareOptions::default())?;
    Ok(out)
}

#[test]
fn data_errors_are_variants_with_their_paths() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let missing = tmp.path().join("no/corpus.txt");
    for err in [
        expand_sources(std::slice::from_ref(&missing)).unwrap_err(),
        read_token_file(&missing, 64).unwrap_err(),
    ] {
        match find::<DataError>(&err) {
            Some(DataError::NotFound { path }) => assert_eq!(path, &missing),
            other => panic!("{other:?}: {err}"),
        }
        assert!(err.to_string().contains("no such file"), "{err}");
    }

    // Another tokenization's data: the mismatch, naming the data directory.
    let (a, b) = (
        prepared(tmp.path(), "a", "x y z")?,
        prepared(tmp.path(), "b", "p q r s t")?,
    );
    let codec_b = TokenData::open(&b)?.codec()?;
    let Err(err) = open_prepared(&a, Some(&codec_b), "the given tokenizer") else {
        panic!("another tokenization's data was opened")
    };
    match find::<DataError>(&err) {
        Some(DataError::TokenizerMismatch { dir, what, .. }) => {
            assert_eq!(
                (dir.as_path(), what.as_str()),
                (a.as_path(), "the given tokenizer")
            )
        }
        other => panic!("{other:?}: {err}"),
    }

    // An id past the vocabulary in tokens.bin: the file and the id.
    let tokens = a.join("tokens.bin");
    let mut bytes = std::fs::read(&tokens)?;
    bytes[..2].copy_from_slice(&60_000u16.to_le_bytes());
    std::fs::write(&tokens, bytes)?;
    let err = TokenData::open(&a).unwrap_err();
    match find::<DataError>(&err) {
        Some(DataError::IdOutOfRange {
            path, id, vocab, ..
        }) => {
            assert_eq!((path.as_path(), *id), (tokens.as_path(), 60_000));
            assert!(*vocab < 60_000);
        }
        other => panic!("{other:?}: {err}"),
    }
    Ok(())
}

#[test]
fn checkpoint_and_run_errors_are_variants() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let missing = tmp.path().join("model.safetensors");
    let err = candle_mha::checkpoint::StateDict::load(&missing).unwrap_err();
    assert!(
        matches!(find(&err), Some(CheckpointError::Unreadable { path, .. }) if path == &missing),
        "{err}"
    );
    std::fs::write(
        &missing,
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all",
    )?;
    let err = candle_mha::checkpoint::StateDict::load(&missing).unwrap_err();
    assert!(
        matches!(find(&err), Some(CheckpointError::Invalid { path, .. }) if path == &missing),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("cannot read checkpoint"),
        "{err}"
    );

    // A RunError that went through a `candle::Result` is still itself.
    let empty = tmp.path().join("empty");
    let how = ResumeRun::default();
    let device = candle_mha::candle::Device::Cpu;
    let err = Session::resume(&empty, how, &device, &SingleProcess, &mut ()).err();
    let carried: candle_mha::candle::Error = err.expect("nothing to resume").into();
    assert!(matches!(find(&carried), Some(RunError::NoRun { .. })));
    assert!(matches!(RunError::from(carried), RunError::NoRun { .. }));
    Ok(())
}
