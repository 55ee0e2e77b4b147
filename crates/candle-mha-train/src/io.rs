//! Files written as one unit ([`FileSet`]: staged files, a manifest of sizes and SHA-256
//! digests as the commit record, then renames), their recovery and verification, and
//! [`DirLock`], the ownership of a run or data directory by one process.
//!
//! Single files are written with [`candle_mha::io::write_atomic`] (re-exported here).

use std::io::Write;
use std::path::Path;

use candle::Result;
pub use candle_mha::io::{remove_stale_temps, write_atomic};
/// The commit record of a [`FileSet`] in its directory.
pub const MANIFEST_FILE: &str = "checkpoint.json";

/// One point of a [`FileSet::commit`], given to its hook before and after each file write and
/// rename: a crash (or a hook's error) there leaves the files as they are at that point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitPoint {
    /// Its position among the commit's points (0, 1, …; the same for every commit of the same
    /// files).
    pub index: usize,
    /// What is about to happen or just happened, e.g. `before staging model.safetensors`.
    pub what: String,
}

/// Files written into a directory as one unit: each is first staged under a hidden name
/// (`.NAME.staged`, flushed), then the manifest [`MANIFEST_FILE`] (each file's name, size and
/// SHA-256) is written atomically as the commit record, then each staged file is renamed into
/// place. A crash before the manifest leaves the previous set whole; after it,
/// [`recover_file_set`] (which [`FileSet::commit`] runs first, and readers should run before
/// reading) finishes the renames. Files of the directory that are not in the set are left
/// alone.
///
/// PyTorch equivalent: none (`torch.save` writes each file in place).
#[derive(Debug)]
pub struct FileSet {
    dir: std::path::PathBuf,
    files: Vec<(String, Vec<u8>)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    files: Vec<ManifestEntry>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ManifestEntry {
    name: String,
    bytes: u64,
    sha256: String,
}

/// `digest` (a hash's bytes) as lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

fn staged_name(name: &str) -> String {
    format!(".{name}.staged")
}

fn is_staged(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".staged")
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> candle::Error {
    candle::Error::Msg(format!("{what} {}: {e}", path.display()))
}

/// Flushes a directory's entries (the renames in it) to disk.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("flushing directory", dir, e))
}

impl FileSet {
    /// An empty set for `dir` (created by [`commit`](Self::commit) when missing).
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            files: Vec::new(),
        }
    }

    /// Adds file `name` (a plain file name, no directory) with `bytes`.
    pub fn add(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && !name.contains(['/', '\\'])
            && name != MANIFEST_FILE;
        if !plain || self.files.iter().any(|(n, _)| n == name) {
            candle::bail!("file set: {name:?} is not a new plain file name")
        }
        self.files.push((name.to_string(), bytes));
        Ok(())
    }

    /// Writes the set as one unit (see [`FileSet`]); `hook` is called at every
    /// [`CommitPoint`], and an error from it stops the commit there.
    pub fn commit(self, hook: &mut dyn FnMut(&CommitPoint) -> Result<()>) -> Result<()> {
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
        // An interrupted commit is finished first: staging would overwrite its staged files.
        finish_interrupted_commit(dir)?;
        let mut index = 0;
        let mut point = |what: String| {
            let p = CommitPoint { index, what };
            index += 1;
            hook(&p)
        };
        for (name, bytes) in &self.files {
            let staged = dir.join(staged_name(name));
            point(format!("before staging {name}"))?;
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&staged)?;
                file.write_all(bytes)?;
                file.sync_all()
            };
            write().map_err(|e| io_err("writing", &staged, e))?;
            point(format!("after staging {name}"))?;
        }
        let manifest = Manifest {
            files: self
                .files
                .iter()
                .map(|(name, bytes)| ManifestEntry {
                    name: name.clone(),
                    bytes: bytes.len() as u64,
                    sha256: sha256_hex(bytes),
                })
                .collect(),
        };
        let json = serde_json::to_string_pretty(&manifest)
            .map_err(|e| candle::Error::Msg(format!("serializing {MANIFEST_FILE}: {e}")))?;
        point(format!("before writing {MANIFEST_FILE}"))?;
        write_atomic(&dir.join(MANIFEST_FILE), json.as_bytes())?;
        point(format!("after writing {MANIFEST_FILE}"))?;
        for (name, _) in &self.files {
            point(format!("before renaming {name}"))?;
            let staged = dir.join(staged_name(name));
            std::fs::rename(&staged, dir.join(name)).map_err(|e| io_err("renaming", &staged, e))?;
            point(format!("after renaming {name}"))?;
        }
        sync_dir(dir)
    }
}

/// [`recover_file_set`] where a commit left staged files in `dir` (it stopped, or is being
/// finished); nothing, not even reading the files, where none is left.
pub fn finish_interrupted_commit(dir: &Path) -> Result<()> {
    let staged = std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| is_staged(&e.file_name().to_string_lossy()))
    });
    if staged {
        recover_file_set(dir)?;
    }
    Ok(())
}

/// What [`recover_file_set`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileSetState {
    /// No [`MANIFEST_FILE`]: a directory written before file sets (or by hand); nothing to
    /// check.
    Unrecorded,
    /// Every file of the manifest matches it.
    Whole {
        /// Files renamed into place now, finishing a commit a crash had interrupted.
        finished: usize,
    },
}

/// Makes the file set of `dir` whole: every file its [`MANIFEST_FILE`] lists must match its
/// size and SHA-256, where needed after renaming its staged copy into place (the end of a
/// commit a crash interrupted); staged files of commits that never wrote their manifest are
/// removed. Errors, naming the file, when a listed file matches neither itself nor a staged
/// copy (changed or damaged after its commit).
pub fn recover_file_set(dir: &Path) -> Result<FileSetState> {
    check_file_set(dir, true)
}

/// Checks, without changing anything, that every file the [`MANIFEST_FILE`] of `dir` lists
/// matches it (for readers: another process may be writing the directory). Errors, naming the
/// file, when one does not: a commit in progress or interrupted (its staged copy matches), or
/// a file changed or damaged after its commit.
pub fn verify_file_set(dir: &Path) -> Result<FileSetState> {
    check_file_set(dir, false)
}

fn check_file_set(dir: &Path, finish: bool) -> Result<FileSetState> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("reading", &manifest_path, e)),
    };
    let manifest: Option<Manifest> = text
        .map(|t| {
            serde_json::from_str(&t).map_err(|e| {
                candle::Error::Msg(format!("invalid {}: {e}", manifest_path.display()))
            })
        })
        .transpose()?;
    let mut finished = 0;
    if let Some(m) = &manifest {
        for entry in &m.files {
            let path = dir.join(&entry.name);
            let staged = dir.join(staged_name(&entry.name));
            let matches = |p: &Path| -> bool {
                std::fs::metadata(p).is_ok_and(|md| md.is_file() && md.len() == entry.bytes)
                    && std::fs::read(p).is_ok_and(|b| sha256_hex(&b) == entry.sha256)
            };
            if matches(&path) {
                continue;
            }
            if matches(&staged) {
                if !finish {
                    candle::bail!(
                        "{} is being saved, or its save was interrupted ({} is not in place yet): retry, or resume the run to finish it",
                        dir.display(),
                        entry.name
                    )
                }
                std::fs::rename(&staged, &path).map_err(|e| io_err("renaming", &staged, e))?;
                finished += 1;
                continue;
            }
            candle::bail!(
                "{} does not match {} (size {} bytes, sha256 {}): it was changed or damaged after it was written",
                path.display(),
                manifest_path.display(),
                entry.bytes,
                entry.sha256
            )
        }
        if finished > 0 {
            sync_dir(dir)?;
        }
    }
    if !finish {
        return Ok(match manifest {
            None => FileSetState::Unrecorded,
            Some(_) => FileSetState::Whole { finished: 0 },
        });
    }
    // Staged files of a commit that stopped before its manifest, and the manifest's own
    // temporary file from a write that stopped.
    let manifest_tmp = format!(".{MANIFEST_FILE}.tmp-");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_staged(&name) || name.starts_with(&manifest_tmp) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(match manifest {
        None => FileSetState::Unrecorded,
        Some(_) => FileSetState::Whole { finished },
    })
}

/// The lock file of a directory owned by one process ([`DirLock`]).
pub const LOCK_FILE: &str = ".lock";

/// An advisory lock on a directory: while it lives, no other process gets one on the same
/// directory. The operating system releases it when the process ends, however it ends, so a
/// lock file left behind never blocks. Its file holds the owner's pid and role, which the
/// error of a second process names.
///
/// PyTorch equivalent: none.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Locks `dir` (created when missing) for `role` (what the owner does, e.g. `mha train`).
    /// Errors, naming the holder's pid and role, when another process holds it.
    pub fn acquire(dir: &Path, role: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err("opening", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                candle::bail!(
                    "{} is in use by another process ({}): wait for it to finish, or choose another directory",
                    dir.display(),
                    if holder.is_empty() { "pid unknown" } else { holder }
                )
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err("locking", &path, e)),
        }
        let owner = format!("pid {}, {role}\n", std::process::id());
        let write = |f: &mut std::fs::File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.write_all(owner.as_bytes())?;
            f.flush()
        };
        write(&mut file).map_err(|e| io_err("writing", &path, e))?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(dir: &Path, version: u8) -> FileSet {
        let mut s = FileSet::new(dir);
        for name in ["a.bin", "b.json", "c.txt"] {
            s.add(name, vec![version; 100 + name.len()]).unwrap();
        }
        s
    }

    /// The files as one version, or `None` for a mix.
    fn version(dir: &Path) -> Option<u8> {
        let v: Vec<u8> = ["a.bin", "b.json", "c.txt"]
            .iter()
            .map(|n| std::fs::read(dir.join(n)).unwrap()[0])
            .collect();
        v.iter().all(|x| *x == v[0]).then_some(v[0])
    }

    /// A commit stopped at any point leaves, after recovery, the old set or the new one whole,
    /// and no staged file.
    #[test]
    fn a_commit_stopped_anywhere_recovers_whole() -> Result<()> {
        let mut points = 0;
        let tmp = tempfile::tempdir()?;
        set(tmp.path(), 1).commit(&mut |_| {
            points += 1;
            Ok(())
        })?;
        assert_eq!(points, 14); // 3 × (staging, renaming) × (before, after) + manifest × 2
        for at in 0..points {
            let tmp = tempfile::tempdir()?;
            let dir = tmp.path();
            set(dir, 1).commit(&mut |_| Ok(()))?;
            let stopped = set(dir, 2).commit(&mut |p| match p.index == at {
                true => candle::bail!("stop"),
                false => Ok(()),
            });
            assert!(stopped.is_err());
            // Readers see an interrupted rename as such; the writer's recovery finishes it.
            let verified = verify_file_set(dir);
            let state = recover_file_set(dir)?;
            let v = version(dir).expect("a mix of two commits");
            assert_eq!(v, if at < 7 { 1 } else { 2 }, "stopped at point {at}");
            assert_eq!(verify_file_set(dir)?, FileSetState::Whole { finished: 0 });
            if let FileSetState::Whole { finished } = state {
                assert_eq!(finished > 0, verified.is_err(), "point {at}");
            }
            let staged = std::fs::read_dir(dir)?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".staged"))
                .count();
            assert_eq!(staged, 0);
        }
        Ok(())
    }

    #[test]
    fn a_damaged_file_is_named() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        assert_eq!(recover_file_set(tmp.path())?, FileSetState::Unrecorded);
        set(tmp.path(), 1).commit(&mut |_| Ok(()))?;
        std::fs::write(tmp.path().join("b.json"), b"edited")?;
        for e in [verify_file_set(tmp.path()), recover_file_set(tmp.path())] {
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("b.json") && e.contains("changed or damaged"),
                "{e}"
            );
        }
        assert!(FileSet::new(tmp.path()).add("../x", vec![]).is_err());
        Ok(())
    }

    /// A second lock on a locked directory fails naming the holder; dropping the first frees
    /// it, and the lock file left behind does not block.
    #[test]
    fn a_directory_lock_excludes_a_second_holder() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let first = DirLock::acquire(tmp.path(), "mha train")?;
        let e = DirLock::acquire(tmp.path(), "mha prepare")
            .unwrap_err()
            .to_string();
        let pid = format!("pid {}, mha train", std::process::id());
        assert!(
            e.contains("in use by another process") && e.contains(&pid),
            "{e}"
        );
        drop(first);
        assert!(tmp.path().join(LOCK_FILE).exists());
        DirLock::acquire(tmp.path(), "mha prepare")?;
        Ok(())
    }
}
