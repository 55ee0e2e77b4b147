//! The CLI tests' helpers: the workspace's test support, and running this crate's `mha`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::Result;
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
