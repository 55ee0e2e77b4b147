//! [`CheckpointError`]: why a checkpoint could not be read or loaded, as variants a program
//! can match (carried through `candle::Error`: [`crate::error::find`]).

use std::path::PathBuf;

use super::LoadReport;

/// The failures of reading and loading a checkpoint a caller may want to tell apart. Carried
/// through `candle::Error` ([`crate::error::typed`]); get it back with
/// [`crate::error::find`].
///
/// ```
/// use candle_mha::candle::{DType, Device, Tensor};
/// use candle_mha::candle_nn::{Init, VarMap};
/// use candle_mha::checkpoint::{load_into_varmap, CheckpointError, LoadOptions, StateDict};
/// # fn main() -> candle_mha::candle::Result<()> {
/// let varmap = VarMap::new();
/// varmap.get((2, 2), "w", Init::Const(0.0), DType::F32, &Device::Cpu)?;
/// varmap.get(2, "b", Init::Const(0.0), DType::F32, &Device::Cpu)?;
/// let sd = StateDict::from_tensors([("w".to_string(), Tensor::zeros((3, 2), DType::F32, &Device::Cpu)?)]);
/// let err = load_into_varmap(&varmap, &sd, &LoadOptions::new()).unwrap_err();
/// let Some(CheckpointError::Mismatch { report, .. }) = candle_mha::error::find(&err) else { panic!("{err}") };
/// assert_eq!(report.missing, ["b"]);
/// assert_eq!(report.shape_mismatches[0].checkpoint, [3, 2]);
/// # Ok(())
/// # }
/// ```
///
/// PyTorch equivalent: the `RuntimeError` of `load_state_dict` (missing and unexpected keys,
/// size mismatches) and the `OSError` / `UnpicklingError` of `torch.load`.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The file cannot be opened or read: missing, a directory, a device or FIFO, an I/O error.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why, as the operating system or the check says it.
        reason: String,
    },
    /// The file was read but is not a checkpoint, or a damaged one: not a safetensors or
    /// `torch.save` file, a header or pickle that does not parse, a tensor past its end.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A strict load found tensors missing, unexpected, or of the wrong shape or dtype: the
    /// report names each (with the checkpoint's file as its `source`); nothing was loaded.
    Mismatch {
        /// What the load found.
        report: Box<LoadReport>,
        /// A sentence after the problems (which loader to use instead), or empty.
        hint: String,
    },
    /// The checkpoint asks for something this crate does not do (a setting refused by name
    /// rather than replaced by a default).
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The setting or tensor (`use_dora`, `config.bias`, …).
        key: String,
        /// What it says and what is supported.
        reason: String,
    },
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreadable { path, reason } | Self::Invalid { path, reason } => {
                write!(f, "cannot read checkpoint {}: {reason}", path.display())
            }
            Self::Mismatch { report, hint } => write!(
                f,
                "Error(s) in loading state_dict for {}: {}; nothing was loaded (strict).{hint}\n{report}",
                report.module,
                report.problems(),
            ),
            Self::Unsupported { path, key, reason } => {
                write!(f, "{}: {key}: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for CheckpointError {}

impl CheckpointError {
    /// This error as a `candle::Error` ([`crate::error::typed`]).
    pub fn into_candle(self) -> candle::Error {
        crate::error::typed(self)
    }
}
