//! [`TextWindows`]: a text file as consecutive model-sized windows, encoded piece by piece,
//! for evaluation and analysis over corpora of any size.

use std::path::Path;

use candle::Result;

use super::example::Example;
use super::text::TextTokenizer;
use super::text_chunks::{TextChunks, DEFAULT_CHUNK_BYTES};

/// The windows of one text file's token stream (`BOS ids… EOS`, as
/// [`prepare_text`](super::prepare_text) writes a document): `len` tokens each, each starting
/// where the previous one's inputs end, so every token after the first is predicted exactly
/// once; the last window holds the rest (at least 2 tokens). The file is read and encoded
/// [`DEFAULT_CHUNK_BYTES`] at a time: memory stays bounded whatever its size.
///
/// PyTorch equivalent: the strided evaluation loop of a language-model script
/// (`for i in range(0, len(ids), block_size): model(ids[i:i+block_size+1])`).
pub struct TextWindows<'a> {
    chunks: TextChunks,
    tok: &'a TextTokenizer,
    len: usize,
    buf: Vec<u32>,
    pos: usize,
    eos_done: bool,
    /// Text bytes read so far.
    bytes: u64,
}

impl<'a> TextWindows<'a> {
    /// Windows of `len` tokens (≥ 2) over the file at `path`.
    pub fn open(path: &Path, tok: &'a TextTokenizer, len: usize) -> Result<Self> {
        if len < 2 {
            candle::bail!(
                "window of {len} tokens is too short; expected at least 2 (one input, one target)"
            )
        }
        if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            candle::bail!("{} is empty; expected some text", path.display())
        }
        Ok(Self {
            chunks: TextChunks::open(path, DEFAULT_CHUNK_BYTES)?,
            tok,
            len,
            buf: tok.bos_id().into_iter().collect(),
            pos: 0,
            eos_done: false,
            bytes: 0,
        })
    }

    /// Text bytes read so far (all of the file once the iterator is exhausted).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn next_window(&mut self) -> Result<Option<Example>> {
        loop {
            if self.buf.len() - self.pos >= self.len {
                let w = self.buf[self.pos..self.pos + self.len].to_vec();
                self.pos += self.len - 1;
                return Ok(Some(Example::full(w)));
            }
            match self.chunks.next().transpose()? {
                Some(text) => {
                    self.bytes += text.len() as u64;
                    self.buf.drain(..self.pos);
                    self.pos = 0;
                    self.buf.extend(self.tok.encode(&text)?);
                }
                None if !self.eos_done => {
                    self.eos_done = true;
                    self.buf.extend(self.tok.eos_id());
                }
                None => {
                    if self.buf.len() - self.pos >= 2 {
                        let w = self.buf[self.pos..].to_vec();
                        self.pos = self.buf.len();
                        return Ok(Some(Example::full(w)));
                    }
                    return Ok(None);
                }
            }
        }
    }
}

impl Iterator for TextWindows<'_> {
    type Item = Result<Example>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_window().transpose()
    }
}
