//! Small file helpers shared by every layer that reads or writes files (checkpoints, prepared
//! data and vocabularies, training records, pictures): below all of them, importing nothing of
//! the crate.
//!
//! - [`write_atomic`]: a temporary file beside the target (created exclusively under an
//!   unpredictable name), flushed, then renamed over it, so a crash or Ctrl-C never leaves a
//!   half-written file and no write goes through a link planted at the temporary's name.
//! - [`open_input`] / [`read_input`]: the one way a path a user gives is opened for reading:
//!   devices, FIFOs and sockets are refused (they have no end, or block), and what is read is
//!   bounded.
//! - [`open_no_follow`], [`refuse_link`]: files a program owns (a lock, a log it appends to)
//!   are opened without following a link.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use candle::Result;

fn io_err(what: &str, path: &Path, e: std::io::Error) -> candle::Error {
    candle::Error::Msg(format!("{what} {}: {e}", path.display()))
}

/// What kind of file `md` describes, in words, for errors.
fn kind(md: &std::fs::Metadata) -> &'static str {
    let ft = md.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// A size in the decimal unit that fits: `512 bytes`, `34.5 kB`, `9.8 MB`, `1.25 GB`.
///
/// PyTorch equivalent: none.
pub fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1000 {
        format!("{bytes} bytes")
    } else if b < 1e6 {
        format!("{:.1} kB", b / 1e3)
    } else if b < 1e9 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.2} GB", b / 1e9)
    }
}

/// `text` in double quotes for a message, as a user reads it: quotes, backslashes and control
/// characters escaped (`\n`, `\u{1b}`), everything else as it is; cut after `max_chars`
/// characters with `…`.
///
/// PyTorch equivalent: none.
pub fn quoted(text: &str, max_chars: usize) -> String {
    let mut out = String::from("\"");
    for (i, c) in text.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A shape for a message, a long one shortened: `[2, 3]`, `[2, 3, 4, 5, 6, 7, …] (12 dims)`.
///
/// PyTorch equivalent: none.
pub fn short_shape(dims: &[usize]) -> String {
    let head: Vec<String> = dims.iter().take(6).map(usize::to_string).collect();
    match dims.len() {
        0..=6 => format!("[{}]", head.join(", ")),
        n => format!("[{}, …] ({n} dims)", head.join(", ")),
    }
}

/// Errors when `path` is a symbolic link (a missing path is fine): files a program writes
/// or replaces in its own directories are never links, so nothing outside is changed through
/// one.
pub fn refuse_link(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_symlink() => candle::bail!(
            "{} is a symbolic link: refusing to write through or replace it (give the path it points to, or remove the link)",
            path.display()
        ),
        _ => Ok(()),
    }
}

/// Opens `path` with `opts` without following a link at its last component, and checks that
/// it is a regular file: a link, a directory, a FIFO or a device there is an error naming it.
/// A FIFO is never waited on (it is opened non-blocking, then refused).
///
/// PyTorch equivalent: none.
pub fn open_no_follow(path: &Path, opts: &mut OpenOptions) -> Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    #[cfg(not(unix))]
    refuse_link(path)?;
    let file = opts.open(path).map_err(|e| {
        // O_NOFOLLOW on a link fails with ELOOP: say what it means.
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            candle::Error::Msg(format!(
                "{} is a symbolic link: refusing to open it (a file this program owns is never a link)",
                path.display()
            ))
        } else {
            io_err("opening", path, e)
        }
    })?;
    check_regular(path, &file)?;
    Ok(file)
}

fn check_regular(path: &Path, file: &File) -> Result<()> {
    let md = file.metadata().map_err(|e| io_err("reading", path, e))?;
    if !md.is_file() {
        candle::bail!(
            "{}: {}, not a regular file; expected a file",
            path.display(),
            kind(&md)
        )
    }
    Ok(())
}

/// Opens a file a user gave for reading. Links are followed (the path is the user's), but
/// what it names must be a regular file: a directory, a device (`/dev/zero`), a FIFO or a
/// socket is an error naming the path, at once (a FIFO is not waited on).
///
/// PyTorch equivalent: `open(path, "rb")`.
pub fn open_input(path: &Path) -> Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading would block until a writer comes.
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts
        .open(path)
        .map_err(|e| io_err("cannot read", path, e))?;
    check_regular(path, &file)?;
    Ok(file)
}

/// [`open_input`] and the file's size, checked to be at most `max_bytes`.
pub fn open_input_bounded(path: &Path, max_bytes: u64) -> Result<(File, u64)> {
    let file = open_input(path)?;
    let len = file
        .metadata()
        .map_err(|e| io_err("cannot read", path, e))?
        .len();
    if len > max_bytes {
        candle::bail!(
            "{}: {len} bytes, more than the {max_bytes} bytes such a file may have",
            path.display()
        )
    }
    Ok((file, len))
}

/// The bytes of a file a user gave ([`open_input`]), at most `max_bytes` of them: a larger
/// file is an error naming its size and the limit, before anything is read.
pub fn read_input(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let (file, len) = open_input_bounded(path, max_bytes)?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len as usize).map_err(|_| {
        candle::Error::Msg(format!(
            "{}: {len} bytes do not fit in memory",
            path.display()
        ))
    })?;
    // `take`: a file that grows while it is read still stops at the limit.
    file.take(max_bytes)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("cannot read", path, e))?;
    Ok(bytes)
}

/// [`read_input`] as UTF-8 text; errors name the path.
pub fn read_input_string(path: &Path, max_bytes: u64) -> Result<String> {
    String::from_utf8(read_input(path, max_bytes)?).map_err(|e| {
        candle::Error::Msg(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The directory and file name of `path`, for a write beside it.
fn dir_and_name(path: &Path) -> Result<(&Path, String)> {
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
    Ok((dir, name.to_string_lossy().into_owned()))
}

/// A new temporary file beside `path`, named `.NAME.tmp-PID-RANDOM`: created exclusively
/// (`O_CREAT | O_EXCL`, so never through a link planted there), removed when dropped unless
/// [`persist`](tempfile::NamedTempFile::persist)ed. [`remove_stale_temps`] knows the name.
pub fn temp_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let (dir, name) = dir_and_name(path)?;
    let prefix = format!(".{name}.tmp-{}-", std::process::id());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        // As `File::create`: the process's umask decides, not tempfile's private 0600.
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    builder
        .tempfile_in(dir)
        .map_err(|e| io_err("cannot create a temporary file in", dir, e))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it ([`temp_beside`]),
/// flushed, then renamed over it. A link at `path` is refused ([`refuse_link`]).
///
/// PyTorch equivalent: none (`torch.save` writes in place).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, &mut |w| {
        w.write_all(bytes).map_err(|e| io_err("writing", path, e))
    })
}

/// [`write_atomic`] of what `write` writes into the temporary file (through a 1 MiB buffer):
/// a large file streamed without its bytes in memory. An error from `write` leaves `path` as
/// it was and removes the temporary file.
///
/// PyTorch equivalent: none (`torch.save` writes in place).
pub fn write_atomic_with(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    refuse_link(path)?;
    let tmp = temp_beside(path)?;
    let mut buffered = std::io::BufWriter::with_capacity(1 << 20, tmp);
    write(&mut buffered)?;
    let tmp = buffered
        .into_inner()
        .map_err(|e| io_err("writing", path, e.into_error()))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| io_err("writing", path, e))?;
    tmp.persist(path)
        .map_err(|e| io_err("writing", path, e.error))?;
    Ok(())
}

/// Whether process `pid` may be running: `false` only where `/proc` shows it is not (Linux);
/// elsewhere every process is assumed alive.
fn pid_may_run(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// The pid in a temporary file's name (`.NAME.tmp-PID-RANDOM`, or `.NAME.tmp-PID`).
fn temp_pid(name: &str) -> Option<u32> {
    let (_, rest) = name.strip_prefix('.')?.rsplit_once(".tmp-")?;
    rest.split('-').next()?.parse().ok()
}

/// Removes the temporary files ([`temp_beside`]'s `.NAME.tmp-PID-…`) that processes which
/// are no longer running left in `dir` (killed while writing); returns how many. A live
/// process's file is left alone; a link is removed as a link.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = temp_pid(&name) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_text_escapes_only_what_a_reader_cannot_see() {
        assert_eq!(quoted("café", 10), "\"café\"");
        assert_eq!(quoted("a\"b\\c\n\u{1b}", 10), "\"a\\\"b\\\\c\\n\\u{1b}\"");
        assert_eq!(quoted("abcdef", 3), "\"abc…\"");
        assert_eq!(short_shape(&[2, 3]), "[2, 3]");
        assert_eq!(short_shape(&[1; 12]), "[1, 1, 1, 1, 1, 1, …] (12 dims)");
    }

    #[test]
    fn sizes_take_the_unit_that_fits() {
        assert_eq!(human_size(999), "999 bytes");
        assert_eq!(human_size(35_180), "35.2 kB");
        assert_eq!(human_size(5_700_000), "5.7 MB");
        assert_eq!(human_size(1_250_000_000), "1.25 GB");
    }

    #[test]
    fn temporary_names_carry_the_pid() {
        assert_eq!(temp_pid(".model.safetensors.tmp-42-aB3xYz"), Some(42));
        assert_eq!(temp_pid(".tokens.bin.tmp-7"), Some(7));
        assert_eq!(temp_pid("model.safetensors"), None);
        assert_eq!(temp_pid(".x.tmp-abc"), None);
    }

    #[cfg(unix)]
    #[test]
    fn writes_never_follow_a_link() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, b"keep")?;
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir)?;
        let link = dir.join("config.json");
        std::os::unix::fs::symlink(&outside, &link)?;
        let e = write_atomic(&link, b"new").unwrap_err().to_string();
        assert!(
            e.contains("symbolic link") && e.contains("config.json"),
            "{e}"
        );
        let mut opts = OpenOptions::new();
        opts.append(true).create(true);
        let e = open_no_follow(&link, &mut opts).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // A dangling link is not created through either.
        let dangling = dir.join(".lock");
        std::os::unix::fs::symlink(tmp.path().join("made.txt"), &dangling)?;
        assert!(open_no_follow(&dangling, &mut opts).is_err());
        assert!(!tmp.path().join("made.txt").exists());
        assert_eq!(std::fs::read(&outside)?, b"keep");
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn inputs_that_never_end_are_refused_at_once() -> Result<()> {
        for dev in ["/dev/zero", "/dev/urandom"] {
            let e = read_input(Path::new(dev), 1 << 20).unwrap_err().to_string();
            assert!(e.contains(dev) && e.contains("character device"), "{e}");
        }
        let tmp = tempfile::tempdir()?;
        let fifo = tmp.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_input(&fifo, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        let e = read_input(tmp.path(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
        let big = tmp.path().join("big");
        std::fs::write(&big, vec![b'x'; 100])?;
        let e = read_input(&big, 99).unwrap_err().to_string();
        assert!(e.contains("100 bytes") && e.contains("99"), "{e}");
        assert_eq!(read_input(&big, 100)?.len(), 100);
        Ok(())
    }
}
