//! Files written as one unit ([`FileSet`]: staged files, a manifest of sizes and SHA-256
//! digests as the commit record, then renames), their recovery and verification. The
//! ownership of a directory by one process is [`crate::run::lock::DirLock`].
//!
//! A directory is untrusted input (run directories are shared like `.pt` files): a manifest
//! is checked before it is believed (plain names from the set's fixed list, no duplicates, a
//! bounded size), recovery renames only `.NAME.staged` to `NAME` inside the directory, and no
//! file of the set is written or read through a symbolic link.
//!
//! Single files are written with [`candle_mha::io::write_atomic`].

use crate::checksum::{hex, size_and_sha256, Hashing};
use crate::run_dir::MANIFEST_FILE;
use crate::{RunError, RunResult};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use candle::Result;
use candle_mha::io::open_no_follow;
use candle_mha::io::{refuse_link, write_atomic};

/// The largest [`MANIFEST_FILE`] read (a checkpoint's is a few hundred bytes).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// How long a reader waits for a save in progress to finish before saying so.
const SAVE_WAIT: Duration = Duration::from_secs(3);

/// The files of a [`FileSet`] directory: those its manifest may list (`allowed`: any other
/// name makes the manifest invalid) and those a reader is about to load (`read`: each must be
/// listed when there is a manifest, and none may be a link).
///
/// PyTorch equivalent: none.
#[derive(Clone, Copy, Debug)]
pub struct SetFiles<'a> {
    /// Every name the set may hold.
    pub allowed: &'a [&'a str],
    /// The names the caller reads.
    pub read: &'a [&'a str],
}

impl<'a> SetFiles<'a> {
    /// Any of `allowed`, reading none (a writer's view).
    pub fn writer(allowed: &'a [&'a str]) -> Self {
        Self { allowed, read: &[] }
    }
}

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
/// (`.NAME.staged`, created exclusively, flushed), then the manifest [`MANIFEST_FILE`] (each
/// file's name, size and SHA-256) is written atomically as the commit record, then each staged
/// file is renamed into place. A crash before the manifest leaves the previous set whole (a
/// failed save removes what it staged); after it, [`recover_file_set`] (which
/// [`FileSet::commit`] runs first) finishes the renames. Files of the directory that are not
/// in the set are left alone; a set file that is a link is an error, never written through.
///
/// PyTorch equivalent: none (`torch.save` writes each file in place).
pub struct FileSet<'a> {
    dir: std::path::PathBuf,
    allowed: &'a [&'a str],
    files: Vec<(String, Content<'a>)>,
}

impl std::fmt::Debug for FileSet<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSet")
            .field("dir", &self.dir)
            .field(
                "files",
                &self.files.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What a file of a [`FileSet`] holds: its bytes, or a writer that streams them into the
/// staged file at commit (a large checkpoint is never whole in memory).
type Stream<'a> = Box<dyn FnMut(&mut dyn Write) -> Result<()> + 'a>;

enum Content<'a> {
    Bytes(Vec<u8>),
    Stream(Stream<'a>),
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    files: Vec<ManifestEntry>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestEntry {
    name: String,
    bytes: u64,
    sha256: String,
}

fn staged_name(name: &str) -> String {
    format!(".{name}.staged")
}

fn is_staged(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".staged")
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> candle::Error {
    candle::Error::Msg(format!("{what} {}: {e}", path.display()))
}

/// Flushes a directory's entries (the renames in it) to disk.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("flushing directory", dir, e))
}

/// Whether `name` is a plain file name a set may hold: no separator, no leading dot, not the
/// manifest, short, printable ASCII.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name != MANIFEST_FILE
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl<'a> FileSet<'a> {
    /// An empty set for `dir` (created by [`commit`](Self::commit) when missing) whose files
    /// are among `allowed` (the manifest of an interrupted commit is checked against it too).
    pub fn new(dir: &Path, allowed: &'a [&'a str]) -> Self {
        Self {
            dir: dir.to_path_buf(),
            allowed,
            files: Vec::new(),
        }
    }

    /// Adds file `name` (one of the set's allowed names) with `bytes`.
    pub fn add(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.push(name, Content::Bytes(bytes))
    }

    /// Adds file `name` (one of the set's allowed names) with what `write` writes when the
    /// commit stages it: the bytes stream to disk and are never all in memory. An error from
    /// `write` stops the commit before its record, as a failed write does.
    pub fn add_streamed(
        &mut self,
        name: &str,
        write: impl FnMut(&mut dyn Write) -> Result<()> + 'a,
    ) -> Result<()> {
        self.push(name, Content::Stream(Box::new(write)))
    }

    fn push(&mut self, name: &str, content: Content<'a>) -> Result<()> {
        if !plain_name(name)
            || !self.allowed.contains(&name)
            || self.files.iter().any(|(n, _)| n == name)
        {
            candle::bail!(
                "file set: {name:?} is not a new file name among {:?}",
                self.allowed
            )
        }
        self.files.push((name.to_string(), content));
        Ok(())
    }

    /// Writes the set as one unit (see [`FileSet`]); `hook` is called at every
    /// [`CommitPoint`], and an error from it stops the commit there.
    pub fn commit(mut self, hook: &mut dyn FnMut(&CommitPoint) -> Result<()>) -> Result<()> {
        let dir = &self.dir;
        std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
        // An interrupted commit is finished first: staging would overwrite its staged files.
        finish_interrupted_commit(dir, SetFiles::writer(self.allowed))?;
        // Every file this commit replaces: none may be a link (checked before any write).
        for (name, _) in &self.files {
            refuse_link(&dir.join(name))?;
        }
        refuse_link(&dir.join(MANIFEST_FILE))?;
        let mut index = 0;
        let mut point = |what: String| {
            let p = CommitPoint { index, what };
            index += 1;
            hook(&p)
        };
        let mut staged = Vec::new();
        let files = &mut self.files;
        let staging = (|| -> Result<()> {
            let mut entries = Vec::new();
            for (name, content) in files.iter_mut() {
                let path = dir.join(staged_name(name));
                point(format!("before staging {name}"))?;
                // Whatever sits at the staged name (a link included) is replaced, never
                // written through: the new file is created exclusively.
                let _ = std::fs::remove_file(&path);
                staged.push(path.clone());
                let err = |e| io_err("writing", &path, e);
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(err)?;
                let mut out = Hashing {
                    inner: std::io::BufWriter::with_capacity(1 << 20, file),
                    hasher: sha2::Digest::new(),
                    bytes: 0,
                };
                match content {
                    Content::Bytes(bytes) => out.write_all(bytes).map_err(err)?,
                    Content::Stream(write) => write(&mut out)?,
                }
                let file = out.inner.into_inner().map_err(|e| err(e.into_error()))?;
                file.sync_all().map_err(err)?;
                entries.push(ManifestEntry {
                    name: name.clone(),
                    bytes: out.bytes,
                    sha256: hex(&sha2::Digest::finalize(out.hasher)),
                });
                point(format!("after staging {name}"))?;
            }
            let manifest = Manifest { files: entries };
            let json = serde_json::to_string_pretty(&manifest)
                .map_err(|e| candle::Error::Msg(format!("serializing {MANIFEST_FILE}: {e}")))?;
            point(format!("before writing {MANIFEST_FILE}"))?;
            write_atomic(&dir.join(MANIFEST_FILE), json.as_bytes())
        })();
        if let Err(e) = staging {
            // Before the commit record: the previous set stands; what was staged only fills
            // the disk (a disk-full failure would keep it full).
            for path in &staged {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
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

/// Whether `dir` holds a staged file (a commit in progress or interrupted).
fn has_staged(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| is_staged(&e.file_name().to_string_lossy()))
    })
}

/// [`recover_file_set`] where a commit left staged files in `dir` (it stopped, or is being
/// finished); nothing, not even reading the files, where none is left.
pub fn finish_interrupted_commit(dir: &Path, files: SetFiles) -> Result<()> {
    if has_staged(dir) {
        recover_file_set(dir, files)?;
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

/// Makes the file set of `dir` whole (for its writer, which holds the directory's
/// [`DirLock`](crate::run::lock::DirLock)): every file its [`MANIFEST_FILE`] lists must match its size and SHA-256,
/// where needed after renaming its staged copy into place (the end of a commit a crash
/// interrupted); staged files of commits that never wrote their manifest are removed.
/// Errors, naming the file: an invalid manifest (see [`SetFiles`]), a link where a set file
/// or its staged copy should be, a listed file that matches neither itself nor a staged copy
/// (changed or damaged after its commit).
pub fn recover_file_set(dir: &Path, files: SetFiles) -> Result<FileSetState> {
    let text = read_manifest(dir)?;
    let manifest = text
        .as_deref()
        .map(|t| parse_manifest(dir, t, files))
        .transpose()?;
    check_unlisted_links(dir, files)?;
    let mut finished = 0;
    if let Some(m) = &manifest {
        for entry in &m.files {
            let path = dir.join(&entry.name);
            if matches(&path, entry)? {
                continue;
            }
            let staged = dir.join(staged_name(&entry.name));
            if matches(&staged, entry)? {
                std::fs::rename(&staged, &path).map_err(|e| io_err("renaming", &staged, e))?;
                finished += 1;
                continue;
            }
            return Err(damaged(dir, &path, entry).into());
        }
        if finished > 0 {
            sync_dir(dir)?;
        }
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

/// Checks, without changing anything, that the [`MANIFEST_FILE`] of `dir` is valid and that
/// every file it lists matches it (for readers: another process may be saving into the
/// directory). A save seen in progress is waited for, a few seconds at most, then reported as
/// such ("being saved"), never as damage. Errors, naming the file: an invalid manifest or a
/// link (see [`SetFiles`]), a save in progress or interrupted, a file changed or damaged
/// after its commit.
pub fn verify_file_set(dir: &Path, files: SetFiles) -> RunResult<FileSetState> {
    let deadline = Instant::now() + SAVE_WAIT;
    loop {
        let staged_before = has_staged(dir);
        let before = read_manifest(dir)?;
        let Some(text) = &before else {
            check_unlisted_links(dir, files)?;
            return Ok(FileSetState::Unrecorded);
        };
        let manifest = parse_manifest(dir, text, files)?;
        check_unlisted_links(dir, files)?;
        let mut mismatch = None;
        for entry in &manifest.files {
            let path = dir.join(&entry.name);
            if !matches(&path, entry)? {
                mismatch = Some((path, entry));
                break;
            }
        }
        let Some((path, entry)) = mismatch else {
            return Ok(FileSetState::Whole { finished: 0 });
        };
        // A commit renames files only after replacing the manifest and while staged files
        // exist: with neither seen around the check, the file itself is wrong.
        let saving = staged_before || has_staged(dir) || read_manifest(dir)? != before;
        if !saving {
            return Err(damaged(dir, &path, entry));
        }
        if Instant::now() >= deadline {
            return Err(RunError::SaveInProgress {
                dir: dir.to_path_buf(),
                file: entry.name.clone(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn damaged(dir: &Path, path: &Path, entry: &ManifestEntry) -> RunError {
    RunError::Damaged {
        file: path.to_path_buf(),
        manifest: dir.join(MANIFEST_FILE),
        bytes: entry.bytes,
        sha256: entry.sha256.clone(),
    }
}

/// The manifest's text, `None` when there is none; bounded, and never through a link.
fn read_manifest(dir: &Path) -> RunResult<Option<String>> {
    let path = dir.join(MANIFEST_FILE);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("reading", &path, e).into()),
        Ok(_) => {}
    }
    let file = open_no_follow(&path, std::fs::OpenOptions::new().read(true))?;
    let mut text = String::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| io_err("reading", &path, e))?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(RunError::InvalidManifest {
            manifest: path,
            reason: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
        });
    }
    Ok(Some(text))
}

/// The manifest, checked: entries are plain names among `files.allowed`, each once, with a
/// 64-digit hex SHA-256; every name in `files.read` is listed.
fn parse_manifest(dir: &Path, text: &str, files: SetFiles) -> RunResult<Manifest> {
    let invalid = |reason: String| RunError::InvalidManifest {
        manifest: dir.join(MANIFEST_FILE),
        reason,
    };
    let manifest: Manifest =
        serde_json::from_str(text).map_err(|e| invalid(format!("not its JSON ({e})")))?;
    for (i, entry) in manifest.files.iter().enumerate() {
        if !plain_name(&entry.name) || !files.allowed.contains(&entry.name.as_str()) {
            return Err(invalid(format!(
                "entry {:?} is not one of the files such a directory has ({})",
                entry.name,
                files.allowed.join(", ")
            )));
        }
        if manifest.files[..i].iter().any(|e| e.name == entry.name) {
            return Err(invalid(format!("{:?} is listed twice", entry.name)));
        }
        let hex = entry.sha256.len() == 64
            && entry
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(invalid(format!(
                "the sha256 of {:?} is not 64 lowercase hex digits",
                entry.name
            )));
        }
    }
    if let Some(name) = files
        .read
        .iter()
        .find(|n| !manifest.files.iter().any(|e| e.name == **n))
    {
        return Err(invalid(format!(
            "it does not list {name}, which is read from the directory (a file added or replaced after the save)"
        )));
    }
    Ok(manifest)
}

/// Errors when a file the caller reads is a link (readers do not follow one out of the
/// directory).
fn check_unlisted_links(dir: &Path, files: SetFiles) -> Result<()> {
    for name in files.read {
        refuse_link(&dir.join(name))?;
    }
    Ok(())
}

/// Whether the file at `path` is a regular file of the entry's size and SHA-256 (hashed in
/// pieces); a link there is an error, a missing file `false`.
fn matches(path: &Path, entry: &ManifestEntry) -> Result<bool> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(_) => return Ok(false),
    };
    if md.file_type().is_symlink() {
        refuse_link(path)?;
    }
    if !md.is_file() || md.len() != entry.bytes {
        return Ok(false);
    }
    let Ok(file) = open_no_follow(path, std::fs::OpenOptions::new().read(true)) else {
        return Ok(false);
    };
    Ok(size_and_sha256(file).is_ok_and(|(n, sha)| n == entry.bytes && sha == entry.sha256))
}

#[cfg(test)]
mod tests;
