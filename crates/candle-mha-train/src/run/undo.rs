//! [`Undo`]: what a refused command made in a directory, taken away again.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The entries of a directory before a command writes into it: [`undo`](Self::undo) removes
/// every entry made since (its lock, a `data/` it prepared, the directory itself and the
/// parents made for it), so a refused or failed command leaves the file system as it found it.
/// What was there before is never touched. Noted before the directory's lock is taken, it is
/// noted again once it is held ([`locked`](Self::locked)): what another process made in
/// between stays.
///
/// PyTorch equivalent: none.
#[derive(Debug)]
pub struct Undo {
    dir: PathBuf,
    /// The names in `dir` before; `None` when `dir` did not exist.
    before: Option<HashSet<OsString>>,
    /// The missing ancestors of `dir`, `dir` first.
    missing: Vec<PathBuf>,
}

impl Undo {
    /// Notes what `dir` holds now.
    pub fn note(dir: &Path) -> Self {
        let before = std::fs::read_dir(dir)
            .ok()
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect());
        Self {
            dir: dir.to_path_buf(),
            missing: missing_ancestors(dir),
            before,
        }
    }

    /// Notes again what the directory holds now that this process holds its lock: entries
    /// that appeared since [`note`](Self::note) are another process's and stay, but for the
    /// lock file when it was not there before.
    pub fn locked(self) -> Self {
        let lock = OsString::from(crate::run_dir::LOCK_FILE);
        let lock_was_there = self.before.as_ref().is_some_and(|b| b.contains(&lock));
        let mut now = Self::note(&self.dir);
        if let Some(names) = now.before.as_mut() {
            if !lock_was_there {
                names.remove(&lock);
            }
        }
        Self {
            missing: self.missing,
            ..now
        }
    }

    /// Removes what was made in the directory since [`note`](Self::note) (never following a
    /// link: a link made there is removed as a link), then the directories made for it while
    /// they are empty.
    pub fn undo(self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if self.before.as_ref().is_some_and(|b| b.contains(&name)) {
                    continue;
                }
                let path = entry.path();
                let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
                let _ = match is_dir {
                    true => std::fs::remove_dir_all(&path),
                    false => std::fs::remove_file(&path),
                };
            }
        }
        for dir in &self.missing {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The ancestors of `path` (itself first) that do not exist.
pub(crate) fn missing_ancestors(path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_err())
        .map(Path::to_path_buf)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what was made since the note goes; what was there stays, and so does what another
    /// process made before the lock was taken.
    #[test]
    fn undo_removes_only_what_was_made() -> candle::Result<()> {
        let tmp = tempfile::tempdir()?;
        let run = tmp.path().join("a/run");
        let undo = Undo::note(&run);
        std::fs::create_dir_all(run.join("data"))?;
        std::fs::write(run.join(".lock"), b"pid")?;
        undo.undo();
        assert!(!tmp.path().join("a").exists());
        std::fs::create_dir_all(&run)?;
        std::fs::write(run.join("mine.txt"), b"keep")?;
        let undo = Undo::note(&run);
        std::fs::create_dir(run.join("data"))?;
        std::fs::write(run.join("data/x"), b"1")?;
        undo.undo();
        assert_eq!(std::fs::read(run.join("mine.txt"))?, b"keep");
        assert!(!run.join("data").exists());
        // Another process's run appears before the lock is ours: it stays; our lock goes.
        let fresh = tmp.path().join("b/run");
        let undo = Undo::note(&fresh);
        std::fs::create_dir_all(&fresh)?;
        std::fs::write(fresh.join("trainer_state.json"), b"{}")?;
        std::fs::write(fresh.join(".lock"), b"pid")?;
        let undo = undo.locked();
        std::fs::create_dir(fresh.join("data"))?;
        undo.undo();
        assert!(fresh.join("trainer_state.json").exists());
        assert!(!fresh.join(".lock").exists() && !fresh.join("data").exists());
        Ok(())
    }
}
