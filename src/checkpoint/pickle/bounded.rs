//! One pickle read from a stream with its size bounded before candle's pickle machine builds
//! it: the opcodes are walked once, tracking for each value on the stack how deeply nested it
//! is and how many objects it expands to (a memo reference is copied in full by candle), so
//! that a file nesting 200,000 lists (candle's objects are built and dropped recursively: a
//! stack overflow) or referencing one list from itself in a doubling chain (an exponential
//! copy) is an error, not an abort.

use std::collections::HashMap;
use std::io::{BufRead, Read};

use candle::Result;

/// Nesting deeper than this is refused (real checkpoints nest a few dozen levels).
pub(super) const MAX_DEPTH: usize = 1_000;
/// Objects a pickle may expand to (a state dict of 100,000 tensors is about a million).
pub(super) const MAX_OBJECTS: u64 = 50_000_000;
/// Bytes of one pickle (the object tree, not the tensors' storages).
pub(super) const MAX_BYTES: u64 = 1 << 30;

/// A value on the walker's stack: its nesting depth and the objects it expands to.
#[derive(Clone, Copy)]
struct Shape {
    depth: usize,
    objects: u64,
}

const LEAF: Shape = Shape {
    depth: 1,
    objects: 1,
};

enum Slot {
    Mark,
    Value(Shape),
}

/// The pickle machine's stack of shapes.
struct Walker {
    stack: Vec<Slot>,
    memo: HashMap<u64, Shape>,
    bytes: Vec<u8>,
}

fn too_big(what: &str) -> candle::Error {
    candle::Error::Msg(format!("the pickle {what}; refusing to build it"))
}

impl Walker {
    fn push(&mut self, s: Shape) -> Result<()> {
        if s.depth > MAX_DEPTH {
            return Err(too_big(&format!(
                "nests objects deeper than {MAX_DEPTH} levels"
            )));
        }
        if s.objects > MAX_OBJECTS {
            return Err(too_big(&format!(
                "expands to more than {MAX_OBJECTS} objects"
            )));
        }
        self.stack.push(Slot::Value(s));
        Ok(())
    }

    fn pop(&mut self) -> Result<Shape> {
        match self.stack.pop() {
            Some(Slot::Value(s)) => Ok(s),
            _ => candle::bail!("malformed pickle: an opcode found too few values on the stack"),
        }
    }

    /// The values down to the last mark (the mark removed).
    fn pop_mark(&mut self) -> Result<Vec<Shape>> {
        let mut items = Vec::new();
        loop {
            match self.stack.pop() {
                Some(Slot::Value(s)) => items.push(s),
                Some(Slot::Mark) => return Ok(items),
                None => candle::bail!("malformed pickle: no mark on the stack"),
            }
        }
    }

    fn top(&self) -> Result<Shape> {
        match self.stack.last() {
            Some(Slot::Value(s)) => Ok(*s),
            _ => candle::bail!("malformed pickle: no value to memoize"),
        }
    }

    /// A container holding `items`, one level above the deepest.
    fn parent(items: impl IntoIterator<Item = Shape>) -> Shape {
        items.into_iter().fold(LEAF, |acc, s| Shape {
            depth: acc.depth.max(s.depth + 1),
            objects: acc.objects.saturating_add(s.objects),
        })
    }

    /// Adds `items` to the container below them on the stack.
    fn extend_top(&mut self, items: Vec<Shape>) -> Result<()> {
        let container = self.pop()?;
        let grown = Self::parent(items);
        self.push(Shape {
            depth: container.depth.max(grown.depth),
            objects: container.objects.saturating_add(grown.objects - 1),
        })
    }

    fn read_exact(&mut self, r: &mut impl BufRead, n: u64) -> Result<()> {
        if self.bytes.len() as u64 + n > MAX_BYTES {
            return Err(too_big(&format!("is larger than {MAX_BYTES} bytes")));
        }
        let got = r.take(n).read_to_end(&mut self.bytes)?;
        if (got as u64) < n {
            candle::bail!("malformed pickle: the stream ends inside an opcode's argument")
        }
        Ok(())
    }

    /// A little-endian unsigned argument of `n` bytes.
    fn read_uint(&mut self, r: &mut impl BufRead, n: usize) -> Result<u64> {
        self.read_exact(r, n as u64)?;
        let b = &self.bytes[self.bytes.len() - n..];
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    /// A newline-terminated argument (protocol 0), as text.
    fn read_line(&mut self, r: &mut impl BufRead) -> Result<String> {
        let start = self.bytes.len();
        let limit = MAX_BYTES.saturating_sub(start as u64);
        r.take(limit).read_until(b'\n', &mut self.bytes)?;
        if self.bytes.last() != Some(&b'\n') {
            candle::bail!("malformed pickle: the stream ends inside a text argument")
        }
        Ok(String::from_utf8_lossy(&self.bytes[start..self.bytes.len() - 1]).into_owned())
    }
}

/// Reads one pickle (through its STOP opcode) from `r`, checking its nesting and size; returns
/// its bytes for candle's pickle machine.
pub(super) fn read_bounded(r: &mut impl BufRead) -> Result<Vec<u8>> {
    let mut w = Walker {
        stack: Vec::new(),
        memo: HashMap::new(),
        bytes: Vec::new(),
    };
    loop {
        w.read_exact(r, 1)?;
        let op = *w.bytes.last().unwrap_or(&b'.');
        match op {
            b'.' => return Ok(w.bytes),
            b'(' => w.stack.push(Slot::Mark),
            b'0' => {
                w.pop()?;
            }
            b'1' => {
                w.pop_mark()?;
            }
            b'2' => {
                let top = w.top()?;
                w.push(top)?;
            }
            // Values with a text argument.
            b'F' | b'I' | b'L' | b'S' | b'V' | b'P' => {
                w.read_line(r)?;
                w.push(LEAF)?;
            }
            b'c' => {
                w.read_line(r)?;
                w.read_line(r)?;
                w.push(LEAF)?;
            }
            b'i' => {
                w.read_line(r)?;
                w.read_line(r)?;
                let items = w.pop_mark()?;
                w.push(Walker::parent(items))?;
            }
            // Fixed-size values.
            b'J' => w.read_exact(r, 4).and_then(|_| w.push(LEAF))?,
            b'K' => w.read_exact(r, 1).and_then(|_| w.push(LEAF))?,
            b'M' => w.read_exact(r, 2).and_then(|_| w.push(LEAF))?,
            b'G' => w.read_exact(r, 8).and_then(|_| w.push(LEAF))?,
            b'N' | 0x88 | 0x89 | b']' | b'}' | b')' | 0x8f | 0x97 => w.push(LEAF)?,
            0x82 => w.read_exact(r, 1).and_then(|_| w.push(LEAF))?,
            0x83 => w.read_exact(r, 2).and_then(|_| w.push(LEAF))?,
            0x84 => w.read_exact(r, 4).and_then(|_| w.push(LEAF))?,
            // Length-prefixed values: 1, 4 or 8 length bytes.
            // LONG1: candle's machine wraps an integer beyond 64 bits (10^30 became a small
            // number); it is handed a string saying what stood there instead.
            0x8a => {
                let at = w.bytes.len() - 1;
                let n = w.read_uint(r, 1)?;
                w.read_exact(r, n)?;
                if n > 8 {
                    w.bytes.truncate(at);
                    let text = format!("an integer wider than 64 bits ({n} bytes)");
                    w.bytes.push(b'X'); // BINUNICODE, which candle's machine reads
                    w.bytes
                        .extend_from_slice(&(text.len() as u32).to_le_bytes());
                    w.bytes.extend_from_slice(text.as_bytes());
                }
                w.push(LEAF)?;
            }
            b'U' | b'C' | 0x8c => {
                let n = w.read_uint(r, 1)?;
                w.read_exact(r, n)?;
                w.push(LEAF)?;
            }
            b'T' | b'X' | b'B' | 0x8b => {
                let n = w.read_uint(r, 4)?;
                w.read_exact(r, n)?;
                w.push(LEAF)?;
            }
            0x8d | 0x8e | 0x96 => {
                let n = w.read_uint(r, 8)?;
                w.read_exact(r, n)?;
                w.push(LEAF)?;
            }
            // Framing and protocol: no value.
            0x80 => w.read_exact(r, 1)?,
            0x95 => w.read_exact(r, 8)?,
            0x98 => {}
            // Containers built from the values down to the mark.
            b't' | b'l' | b'd' | 0x91 | b'o' => {
                let items = w.pop_mark()?;
                w.push(Walker::parent(items))?;
            }
            b'e' | b'u' | 0x90 => {
                let items = w.pop_mark()?;
                w.extend_top(items)?;
            }
            b'a' => {
                let item = w.pop()?;
                w.extend_top(vec![item])?;
            }
            b's' => {
                let (v, k) = (w.pop()?, w.pop()?);
                w.extend_top(vec![k, v])?;
            }
            // Built from a fixed number of values.
            0x85 | b'Q' => {
                let a = w.pop()?;
                w.push(Walker::parent([a]))?;
            }
            0x86 | b'R' | b'b' | 0x81 | 0x93 => {
                let (a, b) = (w.pop()?, w.pop()?);
                w.push(Walker::parent([a, b]))?;
            }
            0x87 | 0x92 => {
                let (a, b, c) = (w.pop()?, w.pop()?, w.pop()?);
                w.push(Walker::parent([a, b, c]))?;
            }
            // The memo: a reference is copied in full by candle.
            b'g' => {
                let idx = w.read_line(r)?.trim().parse::<u64>().unwrap_or(u64::MAX);
                let s = w.memo.get(&idx).copied().unwrap_or(LEAF);
                w.push(s)?;
            }
            b'h' | b'j' => {
                let idx = w.read_uint(r, if op == b'h' { 1 } else { 4 })?;
                let s = w.memo.get(&idx).copied().unwrap_or(LEAF);
                w.push(s)?;
            }
            b'p' => {
                let idx = w.read_line(r)?.trim().parse::<u64>().unwrap_or(u64::MAX);
                let top = w.top()?;
                w.memo.insert(idx, top);
            }
            b'q' | b'r' => {
                let idx = w.read_uint(r, if op == b'q' { 1 } else { 4 })?;
                let top = w.top()?;
                w.memo.insert(idx, top);
            }
            0x94 => {
                let idx = w.memo.len() as u64;
                let top = w.top()?;
                w.memo.insert(idx, top);
            }
            other => candle::bail!("malformed pickle: unknown opcode 0x{other:02x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_of(bytes: &[u8]) -> Result<Vec<u8>> {
        read_bounded(&mut std::io::Cursor::new(bytes))
    }

    /// `pickle.dumps(10**30)` and `pickle.dumps(2**64 - 1)`: LONG1s wider than 64 bits, which
    /// candle's machine would wrap, reach it as strings saying what stood there; `-5` as is.
    #[test]
    fn integers_wider_than_64_bits_are_not_wrapped() -> Result<()> {
        let parsed = |hex: &str| {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            super::super::container::parse_one(&mut std::io::Cursor::new(bytes))
        };
        let text = |n: usize| format!("an integer wider than 64 bits ({n} bytes)");
        let wide = parsed("80028a0d00000040eaed7446d09c2c9f0c2e")?;
        assert_eq!(wide, candle::pickle::Object::Unicode(text(13)));
        let max = parsed("80028a09ffffffffffffffff002e")?;
        assert_eq!(max, candle::pickle::Object::Unicode(text(9)));
        assert_eq!(parsed("80024afbffffff2e")?, candle::pickle::Object::Int(-5));
        Ok(())
    }

    #[test]
    fn nesting_and_copies_are_bounded() {
        // [[[…]]] nested n deep: EMPTY_LIST × n, APPEND × (n − 1), STOP.
        let nested = |n: usize| {
            let mut p = vec![0x80, 2];
            p.extend(std::iter::repeat_n(b']', n));
            p.extend(std::iter::repeat_n(b'a', n - 1));
            p.push(b'.');
            p
        };
        assert!(depth_of(&nested(MAX_DEPTH)).is_ok());
        let e = depth_of(&nested(200_000)).unwrap_err().to_string();
        assert!(e.contains("deeper than 1000 levels"), "{e}");
        // x = []; then 40 times x = [x, x] through the memo: 2^40 objects when copied.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 0..40u8 {
            p.extend([b'(', b'h', i, b'h', i, b'l', b'q', i + 1]);
        }
        p.push(b'.');
        let e = depth_of(&p).unwrap_err().to_string();
        assert!(e.contains("more than 50000000 objects"), "{e}");
        // A length that runs past the end, an unknown opcode.
        assert!(
            depth_of(&[0x80, 2, 0x8d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err()
        );
        assert!(depth_of(&[0x80, 2, 0xff]).is_err());
    }
}
