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

/// Whether process `pid` may be running: `false` only where `/proc` shows it is not (Linux);
/// elsewhere every process is assumed alive.
fn pid_may_run(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Removes the temporary files ([`write_atomic`]'s `.NAME.tmp-PID`) that processes which are no
/// longer running left in `dir` (killed while writing); returns how many. A live process's
/// file is left alone.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(".tmp-"))
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id()
                && !pid_may_run(pid)
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}
