//! Reading a large text file in bounded memory: [`TextChunks`] yields pieces of about
//! `chunk_bytes`, cut where a byte-level BPE would cut anyway, and [`expand_sources`] turns
//! files, directories and glob patterns into a sorted list of files.

use std::io::Read;
use std::path::{Path, PathBuf};

use candle::Result;

/// The default size of one piece of text read and encoded at a time (1 MiB).
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

/// Whether `b` is an ASCII whitespace byte (what the pre-tokenizers' `\s` matches in ASCII).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Where to cut `buf` (a prefix of the file's remaining bytes, followed by at least one more
/// byte `next`) so that encoding the two sides separately gives the same tokens as encoding
/// them together with a GPT-2-style pre-tokenizer: after a newline that a non-space follows
/// (the newline ends a whitespace pre-token, the next word starts a new one), else before a
/// space that follows a non-space and precedes one (the space starts the next word's
/// pre-token), else at a UTF-8 character boundary. Searches the second half of `buf` only,
/// so a piece is never smaller than half the chunk.
fn cut_point(buf: &[u8], next: u8) -> usize {
    let at = |i: usize| if i < buf.len() { buf[i] } else { next };
    let half = buf.len() / 2;
    let newline = (half.max(1)..buf.len())
        .rev()
        .find(|&i| buf[i - 1] == b'\n' && !is_space(at(i)));
    if let Some(i) = newline {
        return i;
    }
    let space = (half.max(1)..buf.len())
        .rev()
        .find(|&i| buf[i] == b' ' && !is_space(buf[i - 1]) && !is_space(at(i + 1)));
    if let Some(i) = space {
        return i;
    }
    // A byte that is not a UTF-8 continuation byte starts a character.
    (half.max(1)..buf.len())
        .rev()
        .find(|&i| buf[i] & 0xc0 != 0x80)
        .unwrap_or(buf.len())
}

/// The largest piece [`TextChunks`] reads at a time (each thread holds a few).
pub const MAX_CHUNK_BYTES: usize = 256 << 20;

/// The pieces of one UTF-8 text file, each about `chunk_bytes` long (the last may be shorter),
/// in order; concatenated they are the file. Invalid UTF-8 is an error naming the file, the
/// line and the byte offset.
///
/// Memory: about two chunks, whatever the file's size.
///
/// PyTorch equivalent: none (reading a corpus with `open(path).read(n)` in a loop).
pub struct TextChunks {
    path: PathBuf,
    file: std::fs::File,
    chunk_bytes: usize,
    /// Bytes read from the file but not yet returned.
    pending: Vec<u8>,
    eof: bool,
    /// Byte offset and 1-based line of the start of `pending`, for error messages.
    offset: u64,
    line: u64,
}

impl TextChunks {
    /// Opens `path`; errors on a directory or an unreadable file, naming it, and on
    /// `chunk_bytes` over [`MAX_CHUNK_BYTES`].
    pub fn open(path: &Path, chunk_bytes: usize) -> Result<Self> {
        if chunk_bytes > MAX_CHUNK_BYTES {
            candle::bail!("chunk of {chunk_bytes} bytes: expected at most {MAX_CHUNK_BYTES}")
        }
        if path.is_dir() {
            candle::bail!("{} is a directory; expected a text file", path.display())
        }
        let file = candle_mha::io::open_input(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            chunk_bytes: chunk_bytes.max(16),
            pending: Vec::new(),
            eof: false,
            offset: 0,
            line: 1,
        })
    }

    /// Reads until `pending` holds more than `chunk_bytes` bytes or the file ends.
    fn fill(&mut self) -> Result<()> {
        let mut buf = vec![0u8; self.chunk_bytes];
        while !self.eof && self.pending.len() <= self.chunk_bytes {
            let n = self
                .file
                .read(&mut buf)
                .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", self.path.display())))?;
            if n == 0 {
                self.eof = true;
            } else {
                self.pending.extend_from_slice(&buf[..n]);
            }
        }
        Ok(())
    }

    fn next_chunk(&mut self) -> Result<Option<String>> {
        self.fill()?;
        if self.pending.is_empty() {
            return Ok(None);
        }
        let cut = if self.pending.len() > self.chunk_bytes {
            cut_point(
                &self.pending[..self.chunk_bytes],
                self.pending[self.chunk_bytes],
            )
        } else {
            self.pending.len()
        };
        let rest = self.pending.split_off(cut);
        let bytes = std::mem::replace(&mut self.pending, rest);
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let lines = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() as u64;
            candle::Error::Msg(format!(
                "{}:{}: invalid UTF-8 at byte {}; expected a UTF-8 text file",
                self.path.display(),
                self.line + lines,
                self.offset + at as u64
            ))
        })?;
        self.offset += text.len() as u64;
        self.line += text.bytes().filter(|&b| b == b'\n').count() as u64;
        Ok(Some(text))
    }
}

impl Iterator for TextChunks {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_chunk().transpose()
    }
}

/// The sizes of the text files `files`; errors name a file that cannot be read or is empty.
pub(crate) fn text_file_sizes(files: &[PathBuf]) -> Result<Vec<u64>> {
    files
        .iter()
        .map(|f| {
            // A device or a FIFO (`/dev/zero`) has no size to plan with, nor an end.
            let (_, len) = candle_mha::io::open_input_bounded(f, u64::MAX)?;
            if len == 0 {
                candle::bail!("{} is empty; expected some text", f.display())
            }
            Ok(len)
        })
        .collect()
}

/// The files named by `sources`, in order, each source expanded: a file as is, a directory to
/// every file below it (sorted, hidden files and folders skipped), a pattern with `*`, `?` or
/// `[` to the files it matches (sorted; as in a shell, wildcards do not match a leading dot).
/// Errors, naming the source, when one does not exist or a pattern matches no file. A file
/// reached twice (named twice, or through a symbolic link to a file already listed) is kept
/// once, where it first appears.
///
/// PyTorch equivalent: none (`glob.glob(pattern, recursive=True)` in a data script).
pub fn expand_sources(sources: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for src in sources {
        let text = src.to_string_lossy();
        let found = if text.contains(['*', '?', '[']) {
            // As a shell does: `*` does not match a leading dot.
            let options = glob::MatchOptions {
                require_literal_leading_dot: true,
                ..Default::default()
            };
            let paths = glob::glob_with(&text, options).map_err(|e| {
                candle::Error::Msg(format!("{text}: not a valid glob pattern ({e})"))
            })?;
            let mut files = Vec::new();
            for p in paths {
                let p = p.map_err(|e| candle::Error::Msg(format!("{text}: {e}")))?;
                if p.is_dir() {
                    walk(&p, &mut files)?;
                } else {
                    files.push(p);
                }
            }
            if files.is_empty() {
                candle::bail!("{text}: the pattern matches no file")
            }
            files.sort();
            files
        } else if src.is_dir() {
            let mut files = Vec::new();
            walk(src, &mut files)?;
            if files.is_empty() {
                candle::bail!("{}: the directory holds no file", src.display())
            }
            files
        } else if src.exists() {
            vec![src.clone()]
        } else {
            return Err(super::DataError::NotFound { path: src.clone() }.into());
        };
        for p in found {
            // A file reached twice (named twice, or through a symbolic link) is read once.
            let key = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
            if seen.insert(key) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Every file below `dir`, sorted, skipping names that start with a dot. A directory reached
/// again (through a symbolic link to itself or an ancestor, or twice) is walked once: a link
/// cycle does not make the walk endless.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    walk_once(dir, out, &mut std::collections::HashSet::new())
}

fn walk_once(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    visited: &mut std::collections::HashSet<PathBuf>,
) -> Result<()> {
    let real = std::fs::canonicalize(dir)
        .map_err(|e| candle::Error::Msg(format!("reading directory {}: {e}", dir.display())))?;
    if !visited.insert(real) {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| candle::Error::Msg(format!("reading directory {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            walk_once(&p, out, visited)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two links to the directory itself: each file once, and the walk ends.
    #[cfg(unix)]
    #[test]
    fn a_link_cycle_is_walked_once() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        std::fs::write(tmp.path().join("a.txt"), "a")?;
        std::fs::create_dir(tmp.path().join("sub"))?;
        std::fs::write(tmp.path().join("sub/b.txt"), "b")?;
        std::os::unix::fs::symlink(".", tmp.path().join("x"))?;
        std::os::unix::fs::symlink("..", tmp.path().join("sub/up"))?;
        let files = expand_sources(&[tmp.path().to_path_buf()])?;
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.txt", "b.txt"]);
        Ok(())
    }

    #[test]
    fn cuts_fall_where_a_bpe_would_cut() {
        // After a newline followed by a word.
        assert_eq!(cut_point(b"aaaa bb\nccc", b'd'), 8);
        // Not after a newline followed by a space: before the space of " bb" instead.
        assert_eq!(cut_point(b"aaaa\n bb cc", b'd'), 8);
        // A long word: at a character boundary, never inside a multi-byte character.
        let s = "ééééé".as_bytes();
        let c = cut_point(&s[..7], s[7]);
        assert!(c < 7 && s[c] & 0xc0 != 0x80, "{c}");
    }
}
