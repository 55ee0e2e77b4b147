//! [`RunError`]: why a run could not start, resume, lock its directory or use its data, as
//! variants a program can match (the rest as [`RunError::Other`]).

use std::path::PathBuf;

/// The failures a caller of [`Session`](crate::Session) or [`Trainer`](crate::Trainer) may
/// want to tell apart; everything else (a disk error, a bad option) is [`Other`](Self::Other),
/// where [`candle_mha::error::find`] finds the typed errors of checkpoints
/// ([`candle_mha::checkpoint::CheckpointError`]) and data ([`crate::data::DataError`]).
/// Converts into `candle::Error` as itself, so `?` works in code returning `candle::Result` and
/// a caller of such code still matches it:
///
/// ```
/// use candle_mha_train::RunError;
/// let e: candle_mha::candle::Error = RunError::NoRun { dir: "runs/x".into() }.into();
/// assert!(matches!(candle_mha::error::find(&e), Some(RunError::NoRun { .. })));
/// assert!(matches!(RunError::from(e), RunError::NoRun { .. }));
/// ```
///
/// PyTorch equivalent: none (a training script raises `RuntimeError`s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A new run was asked for in a directory that already holds one (`trainer_state.json`).
    #[error("{} already holds a run: resume it, or choose another directory", .dir.display())]
    RunExists {
        /// The run directory.
        dir: PathBuf,
    },
    /// Resuming a directory that holds no run.
    #[error("{} has no trainer_state.json to resume from", .dir.display())]
    NoRun {
        /// The directory.
        dir: PathBuf,
    },
    /// A new run's directory holds files no run writes; nothing was changed.
    #[error("{} holds files a run did not write ({}): nothing was changed; choose a new or empty directory, or remove them", .dir.display(), .files.join(", "))]
    StrayFiles {
        /// The directory.
        dir: PathBuf,
        /// The files' names, sorted.
        files: Vec<String>,
    },
    /// Another process holds the directory's lock (it trains, or prepares data, there).
    #[error("{} is in use by another process ({holder}): wait for it to finish, or choose another directory", .dir.display())]
    Locked {
        /// The locked directory.
        dir: PathBuf,
        /// What its lock file says of the holder (`pid N, role`), or `pid unknown`.
        holder: String,
    },
    /// The prepared data is not the data the run recorded (moved, or prepared again).
    #[error("{}: {found}, but the run recorded {recorded}: it is not the data the run was trained on (moved or prepared again?); give the run's own data directory", .dir.display())]
    DataMismatch {
        /// The data directory.
        dir: PathBuf,
        /// What the data holds (its token count or hash).
        found: String,
        /// What the run recorded.
        recorded: String,
    },
    /// A checkpoint's file does not match its manifest while no save is under way: it was
    /// changed or damaged after it was written.
    #[error("{} does not match {} (size {bytes} bytes, sha256 {sha256}): it was changed or damaged after it was written", .file.display(), .manifest.display())]
    Damaged {
        /// The file.
        file: PathBuf,
        /// The manifest that lists it.
        manifest: PathBuf,
        /// The size the manifest records.
        bytes: u64,
        /// The SHA-256 the manifest records.
        sha256: String,
    },
    /// A checkpoint's manifest cannot be trusted (not its JSON, an entry that is not one of
    /// the directory's files, a file read but not listed, too large): nothing was read or
    /// renamed.
    #[error("{} is not a valid checkpoint manifest: {reason}; the directory cannot be trusted (nothing was read or renamed)", .manifest.display())]
    InvalidManifest {
        /// The manifest file.
        manifest: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint is being saved by another process (or its save was interrupted): reading
    /// it again in a moment may succeed.
    #[error("{} is being saved, or its save was interrupted ({file} is not in place yet): retry in a moment; if no training process is writing it, resuming the run finishes the save", .dir.display())]
    SaveInProgress {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The first file not yet in place.
        file: String,
    },
    /// A step's training loss was not finite (NaN or ±inf): the run stopped before the
    /// step's update, so the weights are those before it.
    #[error("training loss is {loss} at step {} (lr {lr:.3e}): stopping; lower the learning rate or check the data. The weights were not updated.", .step + 1)]
    LossNotFinite {
        /// The step (0-based).
        step: u64,
        /// The loss.
        loss: f64,
        /// The step's learning rate.
        lr: f64,
    },
    /// The evaluation before a save gave a non-finite loss: the weights have diverged and
    /// were not saved; the directory keeps its previous checkpoint.
    #[error("step {step}: evaluation loss is {loss}, the weights have diverged (learning rate too high?): not saved, {} keeps its previous checkpoint", .dir.display())]
    Diverged {
        /// The step.
        step: u64,
        /// The evaluation loss.
        loss: f64,
        /// The run directory.
        dir: PathBuf,
    },
    /// Any other failure.
    #[error(transparent)]
    Other(candle::Error),
}

/// A variant travels as itself ([`candle_mha::error::typed`]): `candle_mha::error::find` and
/// `RunError::from` get it back.
impl From<RunError> for candle::Error {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Other(e) => e,
            e => candle_mha::error::typed(e),
        }
    }
}

/// The variant a `candle::Error` carries (one that went through `?` into `candle::Result`),
/// else [`RunError::Other`].
impl From<candle::Error> for RunError {
    fn from(e: candle::Error) -> Self {
        candle_mha::error::take::<RunError>(e).unwrap_or_else(RunError::Other)
    }
}

/// A `Result` whose error is a [`RunError`].
pub type RunResult<T> = std::result::Result<T, RunError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_keep_their_message_through_candle() {
        let e = RunError::RunExists {
            dir: "runs/x".into(),
        };
        let text = e.to_string();
        assert_eq!(
            text,
            "runs/x already holds a run: resume it, or choose another directory"
        );
        let carried = candle::Error::from(e);
        assert_eq!(carried.to_string(), text);
        assert!(matches!(
            RunError::from(carried),
            RunError::RunExists { dir } if dir == std::path::Path::new("runs/x")
        ));
        let inner = candle::Error::Msg("disk full".into());
        assert!(matches!(RunError::from(inner), RunError::Other(_)));
    }
}
