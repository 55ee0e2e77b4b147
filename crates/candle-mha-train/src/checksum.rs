//! SHA-256 digests of bytes, files and streams, as the manifests, data records and LoRA base
//! records write them (lowercase hex).

use std::io::{Read, Write};

/// `digest` (a hash's bytes) as lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// The size and SHA-256 (hex) of what `reader` holds, read in 1 MiB pieces.
pub(crate) fn size_and_sha256(reader: impl Read) -> std::io::Result<(u64, String)> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, reader);
    let mut n = 0u64;
    loop {
        let buf = std::io::BufRead::fill_buf(&mut reader)?;
        if buf.is_empty() {
            return Ok((n, hex(&hasher.finalize())));
        }
        hasher.update(buf);
        let len = buf.len();
        n += len as u64;
        std::io::BufRead::consume(&mut reader, len);
    }
}

/// A writer that counts and hashes what passes through it (a staged file's manifest entry).
pub(crate) struct Hashing<W> {
    pub(crate) inner: W,
    pub(crate) hasher: sha2::Sha256,
    pub(crate) bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
