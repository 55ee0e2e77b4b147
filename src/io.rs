//! Small file helpers shared by every layer that writes files (checkpoints, prepared data and
//! vocabularies, training records, pictures): below all of them, importing nothing of the crate.
//!
//! [`write_atomic`]: a temporary file beside the target, flushed, then renamed over it, so a
//! crash or Ctrl-C never leaves a half-written file.

use std::io::Write;
use std::path::Path;

use candle::Result;

/// Writes `bytes` to `path` atomically (temp file in the same directory + `fsync` + rename).
///
/// PyTorch equivalent: none (`torch.save` writes in place).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        candle::Error::Msg(format!(
            "cannot write to {}: not a file path",
            path.display()
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        candle::Error::Msg(format!("writing {}: {e}", path.display()))
    })
}
