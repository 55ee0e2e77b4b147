//! [`DirLock`]: the ownership of a run or data directory by one process.

use std::io::{Read, Write};
use std::path::Path;

use candle_mha::io::open_no_follow;

use crate::run::commit::io_err;
use crate::run_dir::LOCK_FILE;

/// An advisory lock on a directory: while it lives, no other process gets one on the same
/// directory. The operating system releases it when the process ends, however it ends, so a
/// lock file left behind never blocks. Its file holds the owner's pid and role, which the
/// error of a second process names. A link, directory or FIFO at the lock's name is an error
/// naming it (never written through).
///
/// PyTorch equivalent: none.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Locks `dir` (created when missing) for `role` (what the owner does, e.g. `mha train`).
    /// Errors with [`RunError::Locked`](crate::RunError::Locked), naming the holder's pid and
    /// role, when another process holds it.
    pub fn acquire(dir: &Path, role: &str) -> crate::RunResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
        let path = dir.join(LOCK_FILE);
        let mut file = open_no_follow(
            &path,
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = (&file).take(256).read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(crate::RunError::Locked {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "pid unknown"
                    } else {
                        holder
                    }
                    .to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err("locking", &path, e).into()),
        }
        let owner = format!("pid {}, {role}\n", std::process::id());
        let write = |f: &mut std::fs::File| -> std::io::Result<()> {
            f.set_len(0)?;
            std::io::Seek::seek(f, std::io::SeekFrom::Start(0))?;
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
    use candle::Result;

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

    /// A link (dangling or not), a directory or a FIFO at the lock's name is refused; nothing
    /// outside is created or truncated.
    #[cfg(unix)]
    #[test]
    fn a_lock_is_never_taken_through_a_link() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, b"keep")?;
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir)?;
        std::os::unix::fs::symlink(&outside, dir.join(LOCK_FILE))?;
        let e = DirLock::acquire(&dir, "t").unwrap_err().to_string();
        assert!(e.contains("symbolic link") && e.contains(LOCK_FILE), "{e}");
        assert_eq!(std::fs::read(&outside)?, b"keep");
        std::fs::remove_file(dir.join(LOCK_FILE))?;
        std::os::unix::fs::symlink(tmp.path().join("new.txt"), dir.join(LOCK_FILE))?;
        assert!(DirLock::acquire(&dir, "t").is_err());
        assert!(!tmp.path().join("new.txt").exists());
        std::fs::remove_file(dir.join(LOCK_FILE))?;
        std::fs::create_dir(dir.join(LOCK_FILE))?;
        assert!(DirLock::acquire(&dir, "t").is_err());
        std::fs::remove_dir(dir.join(LOCK_FILE))?;
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(LOCK_FILE))
            .status()?;
        assert!(made.success());
        let e = DirLock::acquire(&dir, "t").unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        Ok(())
    }
}
