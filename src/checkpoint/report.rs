//! [`LoadReport`]: what loading a state_dict matched, missed and converted.

use std::fmt;

use candle::DType;

/// A parameter whose stored shape differs from the model's.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeMismatch {
    /// The parameter's name in the model.
    pub name: String,
    /// The shape in the checkpoint.
    pub checkpoint: Vec<usize>,
    /// The shape the model expects.
    pub model: Vec<usize>,
}

/// A parameter converted from its stored dtype to the model's.
#[derive(Clone, Debug, PartialEq)]
pub struct DtypeCast {
    /// The parameter's name in the model.
    pub name: String,
    /// The dtype in the checkpoint.
    pub from: DType,
    /// The model's dtype.
    pub to: DType,
}

/// The outcome of loading a state_dict into a model.
///
/// PyTorch equivalent: the `_IncompatibleKeys(missing_keys, unexpected_keys)` returned by
/// `load_state_dict`, plus the size mismatches (which PyTorch always raises) and the dtype
/// casts (which PyTorch does silently). Its `Display` reads like PyTorch's error message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// What was loaded ("MultiheadAttention", "NextTokenPredictor", …).
    pub module: String,
    /// Where from (a path, or "state_dict").
    pub source: String,
    /// The prefix in the checkpoint the model was read from (`""` or ending with `.`).
    pub prefix: String,
    /// Parameters found in the checkpoint with the right shape (model names); they are set
    /// unless strict loading failed.
    pub loaded: Vec<String>,
    /// Model parameters absent from the checkpoint (model names).
    pub missing: Vec<String>,
    /// Checkpoint tensors under the prefix that the model does not have (checkpoint names).
    pub unexpected: Vec<String>,
    /// Parameters present on both sides with different shapes (not loaded).
    pub shape_mismatches: Vec<ShapeMismatch>,
    /// Parameters loaded with a dtype conversion.
    pub casts: Vec<DtypeCast>,
    /// Parameters stored with an integer dtype where the model has a float one, or the
    /// reverse (not loaded).
    pub dtype_mismatches: Vec<DtypeCast>,
}

impl LoadReport {
    /// No missing key, no unexpected key, no shape or integer/float mismatch (float casts are
    /// allowed, as in PyTorch).
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.shape_mismatches.is_empty()
            && self.dtype_mismatches.is_empty()
    }

    /// What keeps the report from being clean, counted: `"12 unexpected key(s)"`, `"2 missing
    /// key(s), 1 size mismatch(es)"`; empty when it is clean.
    pub fn problems(&self) -> String {
        [
            (self.missing.len(), "missing key(s)"),
            (self.unexpected.len(), "unexpected key(s)"),
            (self.shape_mismatches.len(), "size mismatch(es)"),
            (
                self.dtype_mismatches.len(),
                "integer/float dtype mismatch(es)",
            ),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// The error of a strict load that found [`problems`](Self::problems), with `hint` (a
    /// sentence, or empty) after them and the full report below.
    pub fn strict_error(&self, hint: &str) -> candle::Error {
        super::CheckpointError::Mismatch {
            report: Box::new(self.clone()),
            hint: hint.to_string(),
        }
        .into_candle()
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.loaded.len()
            + self.missing.len()
            + self.shape_mismatches.len()
            + self.dtype_mismatches.len();
        let prefix = match self.prefix.as_str() {
            "" => String::new(),
            p => format!(" at prefix \"{p}\""),
        };
        writeln!(
            f,
            "{}: {} of {total} parameters matched in {}{prefix}",
            self.module,
            self.loaded.len(),
            self.source
        )?;
        if !self.missing.is_empty() {
            writeln!(
                f,
                "\tMissing key(s) in state_dict: {}.",
                quoted(&self.missing)
            )?;
        }
        if !self.unexpected.is_empty() {
            writeln!(
                f,
                "\tUnexpected key(s) in state_dict: {}.",
                quoted(&self.unexpected)
            )?;
        }
        for m in &self.shape_mismatches {
            writeln!(
                f,
                "\tsize mismatch for {}: copying a param with shape {:?} from checkpoint, the shape in current model is {:?}.",
                m.name, m.checkpoint, m.model
            )?;
        }
        for m in &self.dtype_mismatches {
            writeln!(
                f,
                "\tdtype mismatch for {}: the checkpoint holds {:?}, the model expects {:?}.",
                m.name, m.from, m.to
            )?;
        }
        if !self.casts.is_empty() {
            let mut kinds: Vec<(DType, DType)> =
                self.casts.iter().map(|c| (c.from, c.to)).collect();
            kinds.dedup();
            for (from, to) in kinds {
                let names: Vec<String> = self
                    .casts
                    .iter()
                    .filter(|c| (c.from, c.to) == (from, to))
                    .map(|c| c.name.clone())
                    .collect();
                writeln!(
                    f,
                    "\tdtype cast {from:?} -> {to:?} for {} tensor(s): {}.",
                    names.len(),
                    quoted(&names)
                )?;
            }
        }
        if self.is_clean() && self.casts.is_empty() {
            writeln!(f, "\tall keys matched.")?;
        }
        Ok(())
    }
}
