//! [`StagedDir`]: a new output directory written as a unit (`mha import`, `mha export`).

use std::path::{Path, PathBuf};

use candle::Result;

use crate::run::commit::io_err;
use crate::run_dir::{MANIFEST_FILE, STATE_FILE};

/// A directory written whole or not at all: its files go into a hidden temporary directory
/// beside `out`, which [`finish`](Self::finish) renames to `out`; dropped unfinished, it is
/// removed with everything in it (a failure, a full disk), so `out` is never half-written.
///
/// `out` must be new: missing, or an empty directory (which the rename replaces). A link at
/// `out`, a file, a directory holding anything (a run, a user's `config.json` or `ckpt.pt`),
/// and a place inside a run directory are refused before anything is written.
///
/// PyTorch equivalent: none (`save_pretrained` and `torch.save` write in place).
#[derive(Debug)]
pub struct StagedDir {
    // Declared first: dropped (removed) before the parents made for it.
    tmp: Option<tempfile::TempDir>,
    out: PathBuf,
    /// The missing parents of `out` this made, deepest first: removed again when unfinished.
    made: Vec<PathBuf>,
}

impl StagedDir {
    /// Checks that `out` may be written by `role` (what writes it, e.g. `mha export`) and
    /// makes the staging directory beside it.
    pub fn new(out: &Path, role: &str) -> Result<Self> {
        check_new(out, role)?;
        let parent = parent_of(out);
        let made = crate::run::undo::missing_ancestors(parent);
        std::fs::create_dir_all(parent)
            .map_err(|e| io_err("cannot create directory", parent, e))?;
        let mut staged = Self {
            tmp: None,
            out: out.to_path_buf(),
            made,
        };
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}.staged-{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(|e| io_err("cannot create a directory in", parent, e))?;
        #[cfg(unix)]
        {
            // As `mkdir`: readable by others (tempfile makes it private).
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io_err("cannot set permissions of", tmp.path(), e))?;
        }
        staged.tmp = Some(tmp);
        Ok(staged)
    }

    /// The checks of [`new`](Self::new) alone, making nothing: for a command that reads its
    /// input (a large checkpoint) before it writes.
    pub fn check(out: &Path, role: &str) -> Result<()> {
        check_new(out, role)
    }

    /// Where to write the files.
    pub fn path(&self) -> &Path {
        self.tmp.as_ref().expect("made in new").path()
    }

    /// Flushes the files to disk and renames the directory to `out`. Errors (leaving nothing
    /// behind) when `out` was made meanwhile and is not empty.
    pub fn finish(mut self) -> Result<()> {
        let dir = self.path();
        for entry in std::fs::read_dir(dir).map_err(|e| io_err("reading", dir, e))? {
            let path = entry.map_err(|e| io_err("reading", dir, e))?.path();
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| io_err("writing", &path, e))?;
        }
        let staged = self.tmp.take().expect("made in new").keep();
        if let Err(e) = std::fs::rename(&staged, &self.out) {
            let _ = std::fs::remove_dir_all(&staged);
            return Err(io_err(
                "cannot rename the finished directory to",
                &self.out,
                e,
            ));
        }
        self.made.clear();
        if let Ok(parent) = std::fs::File::open(parent_of(&self.out)) {
            let _ = parent.sync_all();
        }
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        drop(self.tmp.take());
        for dir in &self.made {
            // Only while empty: anything another process put there stays.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn parent_of(out: &Path) -> &Path {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Errors unless `out` is missing or an empty directory (not a link), outside any run.
fn check_new(out: &Path, role: &str) -> Result<()> {
    let refuse = |why: String| -> Result<()> {
        candle::bail!(
            "{role}: {} {why}; {role} writes a new directory (give a path that does not exist, or an empty directory); nothing was written",
            out.display()
        )
    };
    match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("reading", out, e)),
        Ok(md) if md.file_type().is_symlink() => {
            return refuse("is a symbolic link (never written through)".into())
        }
        Ok(md) if !md.is_dir() => return refuse("is a file".into()),
        Ok(_) => {
            let mut names: Vec<String> = std::fs::read_dir(out)
                .map_err(|e| io_err("reading", out, e))?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if !names.is_empty() {
                names.sort();
                let shown = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
                let more = if names.len() > 3 { ", …" } else { "" };
                let what = if names.iter().any(|n| n == STATE_FILE || n == MANIFEST_FILE) {
                    "already holds a run"
                } else {
                    "is not empty"
                };
                return refuse(format!("{what} ({shown}{more})"));
            }
        }
    }
    // Inside a run, a new directory would sit among the run's own files.
    let existing = parent_of(out)
        .ancestors()
        .find(|p| p.as_os_str().is_empty() || p.exists())
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        });
    if let Some(Ok(mut dir)) = existing.map(Path::canonicalize) {
        loop {
            if dir.join(STATE_FILE).is_file() || dir.join(MANIFEST_FILE).is_file() {
                return refuse(format!("lies inside the run directory {}", dir.display()));
            }
            if !dir.pop() {
                break;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finished, the files appear at `out` at once; dropped, nothing is left anywhere.
    #[test]
    fn a_staged_directory_appears_whole_or_not_at_all() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let out = tmp.path().join("out");
        let staged = StagedDir::new(&out, "t")?;
        std::fs::write(staged.path().join("a"), b"1")?;
        assert!(!out.exists());
        drop(staged);
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0);
        let staged = StagedDir::new(&out, "t")?;
        std::fs::write(staged.path().join("a"), b"1")?;
        staged.finish()?;
        assert_eq!(std::fs::read(out.join("a"))?, b"1");
        assert_eq!(std::fs::read_dir(tmp.path())?.count(), 1);
        // An empty directory is replaced.
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty)?;
        let staged = StagedDir::new(&empty, "t")?;
        std::fs::write(staged.path().join("b"), b"2")?;
        staged.finish()?;
        assert_eq!(std::fs::read(empty.join("b"))?, b"2");
        // Parents it made are removed again when unfinished, kept when finished.
        drop(StagedDir::new(&tmp.path().join("x/y/out"), "t")?);
        assert!(!tmp.path().join("x").exists());
        StagedDir::new(&tmp.path().join("x/y/out"), "t")?.finish()?;
        assert!(tmp.path().join("x/y/out").is_dir());
        Ok(())
    }

    /// A directory with anything in it, a file, a link and a place inside a run are refused
    /// before anything is made.
    #[cfg(unix)]
    #[test]
    fn an_occupied_linked_or_run_path_is_refused() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let full = tmp.path().join("full");
        std::fs::create_dir(&full)?;
        std::fs::write(full.join("config.json"), b"{}")?;
        let e = StagedDir::new(&full, "mha export").unwrap_err().to_string();
        assert!(
            e.contains("is not empty (config.json)") && e.contains("nothing was written"),
            "{e}"
        );
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x")?;
        assert!(StagedDir::new(&file, "t")
            .unwrap_err()
            .to_string()
            .contains("is a file"));
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere)?;
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link)?;
        let e = StagedDir::new(&link, "t").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let run = tmp.path().join("run");
        std::fs::create_dir(&run)?;
        std::fs::write(run.join(STATE_FILE), b"{}")?;
        let e = StagedDir::new(&run, "t").unwrap_err().to_string();
        assert!(e.contains("holds a run"), "{e}");
        let e = StagedDir::new(&run.join("sub").join("out"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("inside the run directory"), "{e}");
        // Nothing was made by any of these.
        let mut names: Vec<_> = std::fs::read_dir(tmp.path())?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["elsewhere", "file", "full", "link", "run"]);
        assert_eq!(std::fs::read_dir(&elsewhere)?.count(), 0);
        Ok(())
    }
}
