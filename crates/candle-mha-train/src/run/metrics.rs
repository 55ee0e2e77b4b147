//! `metrics.jsonl`: one JSON object per line, written by the [`Trainer`](super::Trainer) into
//! its run directory, read back by `mha plot`.
//!
//! ```text
//! {"step":1,"train_loss":6.21,"lr":3e-5,"grad_norm":2.4,"tokens_per_s":5310.2,"tokens":4096}
//! {"step":250,"val_loss":3.1,"val_perplexity":22.2,"val_accuracy":0.31,"val_bits_per_byte":1.52}
//! ```
//! A line holds the training fields (after an optimizer step), the validation fields (after
//! an evaluation), or both. `step` counts optimizer steps done. On resume, lines past the
//! checkpoint's step are dropped, so the file always describes the run that continues.

use std::io::Write;
use std::path::Path;

use candle::Result;
use serde::{Deserialize, Serialize};

/// One line of `metrics.jsonl`.
///
/// PyTorch equivalent: none (what a training script logs to TensorBoard or wandb).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Optimizer steps done.
    pub step: u64,
    /// Training loss of the step (mean over its counted tokens, all micro-batches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_loss: Option<f64>,
    /// Learning rate of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Global gradient norm before clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// Input tokens per second of wall time over the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Input tokens of the step (`N × L` over all micro-batches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<usize>,
    /// Data-parallel runs: seconds rank 0 spent in the step's all-reduces (transfer and
    /// waiting for the slowest rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_s: Option<f64>,
    /// Validation loss (nats per token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Validation perplexity `exp(val_loss)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_perplexity: Option<f64>,
    /// Validation accuracy of the argmax prediction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Validation bits per byte of text (text data only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_bits_per_byte: Option<f64>,
}

/// Appends `record` as one line to `path` (created if missing).
pub fn append_metrics(path: &Path, record: &MetricsRecord) -> Result<()> {
    let line = serde_json::to_string(record)
        .map_err(|e| candle::Error::Msg(format!("serializing a metrics record: {e}")))?;
    // Never through a link: the run directory may come from someone else.
    let mut file = candle_mha::io::open_no_follow(
        path,
        std::fs::OpenOptions::new().create(true).append(true),
    )?;
    writeln!(file, "{line}")
        .map_err(|e| candle::Error::Msg(format!("writing {}: {e}", path.display())))
}

/// The records of a `metrics.jsonl`, and the lines that were not records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsLog {
    /// The records, in file order.
    pub records: Vec<MetricsRecord>,
    /// One warning per line skipped (`PATH:LINE: not a metrics record (…)`): a damaged or
    /// edited line costs that line, not the run's history.
    pub skipped: Vec<String>,
}

/// The largest `metrics.jsonl` read.
pub const MAX_METRICS_BYTES: u64 = 1 << 30;

/// Reads every record of a `metrics.jsonl` (never through a link, at most
/// [`MAX_METRICS_BYTES`]). Blank lines are skipped silently, a last line cut short (a run
/// killed mid-write) too; any other line that is not a record is skipped with a warning
/// naming the file and the line.
pub fn read_metrics(path: &Path) -> Result<MetricsLog> {
    candle_mha::io::refuse_link(path)?;
    let bytes = candle_mha::io::read_input(path, MAX_METRICS_BYTES)?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let mut log = MetricsLog::default();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<MetricsRecord>(line) {
            Ok(r) => log.records.push(r),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => log.skipped.push(format!(
                "{}:{}: not a metrics record ({e}); line skipped",
                path.display(),
                i + 1
            )),
        }
    }
    Ok(log)
}

/// Keeps only the records with `step <= step` (atomically rewritten), for a resumed run;
/// lines that are not records are dropped. Returns the warnings of those lines. A missing
/// file is left missing.
pub fn truncate_metrics(path: &Path, step: u64) -> Result<Vec<String>> {
    candle_mha::io::refuse_link(path)?;
    if !path.exists() {
        return Ok(Vec::new());
    }
    let log = read_metrics(path)?;
    let mut text = String::new();
    for r in log.records.iter().filter(|r| r.step <= step) {
        let line = serde_json::to_string(r)
            .map_err(|e| candle::Error::Msg(format!("serializing a metrics record: {e}")))?;
        text.push_str(&line);
        text.push('\n');
    }
    candle_mha::io::write_atomic(path, text.as_bytes())?;
    Ok(log.skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_dir::METRICS_FILE;

    #[test]
    fn records_round_trip_and_truncate() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("mha-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(METRICS_FILE);
        let _ = std::fs::remove_file(&path);
        let a = MetricsRecord {
            step: 1,
            train_loss: Some(2.5),
            lr: Some(1e-3),
            ..Default::default()
        };
        let b = MetricsRecord {
            step: 2,
            val_loss: Some(2.0),
            val_bits_per_byte: Some(1.25),
            ..Default::default()
        };
        append_metrics(&path, &a)?;
        append_metrics(&path, &b)?;
        assert_eq!(read_metrics(&path)?.records, vec![a.clone(), b]);
        let text = std::fs::read_to_string(&path)?;
        assert!(
            !text.contains("grad_norm"),
            "absent fields are not written: {text}"
        );
        assert!(truncate_metrics(&path, 1)?.is_empty());
        assert_eq!(read_metrics(&path)?.records, vec![a.clone()]);
        // A line cut short at the end is ignored; one in the middle is an error naming it.
        std::fs::write(
            &path,
            format!("{}\n{{\"step\":", serde_json::to_string(&a).unwrap()),
        )?;
        assert_eq!(read_metrics(&path)?.records, vec![a]);
        // A bad line in the middle is skipped with a warning naming it; the rest is kept.
        std::fs::write(&path, "{\"step\":\ngarbage\n{\"step\":3}\n")?;
        let log = read_metrics(&path)?;
        assert_eq!(log.records.len(), 1);
        assert_eq!(log.skipped.len(), 2);
        assert!(
            log.skipped[0].contains("metrics.jsonl:1"),
            "{:?}",
            log.skipped
        );
        assert!(
            log.skipped[1].contains("metrics.jsonl:2"),
            "{:?}",
            log.skipped
        );
        let warnings = truncate_metrics(&path, 5)?;
        assert_eq!(warnings.len(), 2);
        assert_eq!(read_metrics(&path)?.skipped, Vec::<String>::new());
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
