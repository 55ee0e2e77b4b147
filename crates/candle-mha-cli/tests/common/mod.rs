//! The CLI tests' helpers: the workspace's test support, and running this crate's `mha`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
pub use candle_mha_test_support::*;

/// The `mha` binary cargo built for these tests.
pub fn mha_exe() -> Result<&'static str> {
    Ok(env!("CARGO_BIN_EXE_mha"))
}

/// Runs `mha args`; returns (success, stdout, stderr).
pub fn mha<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<(bool, String, String)> {
    run_program(env!("CARGO_BIN_EXE_mha"), args)
}

/// `run_mha!("train --out {} --steps 4", dir)`: [`mha`] with its arguments written as a command
/// line ([`argv`]: words split at whitespace, `'…'` keeps spaces, each `{}` one argument).
#[allow(unused_macros)]
macro_rules! run_mha {
    ($template:literal $(, $arg:expr)* $(,)?) => {
        $crate::common::mha(&$crate::common::argv($template, &[$(AsRef::<str>::as_ref(&$arg)),*]))
    };
}
#[allow(unused_imports)]
pub(crate) use run_mha;

/// [`candle_mha_test_support::train_tiny_run`] with this crate's `mha`.
pub fn train_tiny_run(dir: &Path) -> Result<PathBuf> {
    candle_mha_test_support::train_tiny_run(env!("CARGO_BIN_EXE_mha"), dir)
}

/// A temporary path as an argument (the tests' paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// Runs `mha` with a deadline: (exit code, stderr); a run past it is killed and fails the
/// test as a hang. A signal's death (an abort) has no code and fails too.
pub fn mha_within(args: &[&str], secs: u64) -> Result<(i32, String)> {
    let mut child = std::process::Command::new(mha_exe()?)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err)?;
            let code = status
                .code()
                .with_context(|| format!("mha {args:?} died of a signal: {status}\n{err}"))?;
            return Ok((code, err));
        }
        if std::time::Instant::now() > deadline {
            child.kill()?;
            anyhow::bail!("mha {args:?} still running after {secs} s: it hangs")
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A clear error: exit 1 or 2 and `needle` in the message.
pub fn assert_refused(args: &[&str], needle: &str) -> Result<()> {
    let (code, err) = mha_within(args, 60)?;
    assert!(
        (code == 1 || code == 2) && err.contains(needle),
        "mha {args:?}: exit {code}, expected 1 or 2 with {needle:?}:\n{err}"
    );
    Ok(())
}

/// A FIFO at `path` (`mkfifo`).
pub fn mkfifo(path: &Path) -> Result<()> {
    let made = std::process::Command::new("mkfifo").arg(path).status()?;
    anyhow::ensure!(made.success(), "mkfifo {}", path.display());
    Ok(())
}
