//! Plain pickles of Python's builtins (`pickle.dump` of dicts, lists, strings and numbers, in
//! any binary protocol up to 5), such as nanoGPT's `meta.pkl`. candle's pickle machine reads
//! the protocol-2 files `torch.save` writes, not protocol 4's frames and memo; this reads
//! those, and refuses any class (nothing is ever constructed or run).

use super::value::PickleValue;
use candle::Result;

/// The largest plain pickle read.
pub const MAX_PLAIN_PICKLE_BYTES: u64 = 64 << 20;

/// Deeper than this the pickle is refused.
const MAX_DEPTH: usize = 200;

/// The value `pickle.load` would return for `bytes`, when it holds only builtins (`None`,
/// `bool`, `int`, `float`, `str`, `bytes` as a list of ints, `list`, `tuple`, `dict`, `set`).
/// Errors, naming the opcode and its offset, at anything else.
///
/// PyTorch equivalent: `pickle.loads(bytes)` of a data-only pickle.
pub fn parse_plain_pickle(bytes: &[u8]) -> Result<PickleValue> {
    let mut p = Parser {
        bytes,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
    };
    p.run()
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<PickleValue>,
    marks: Vec<usize>,
    memo: Vec<Option<PickleValue>>,
}

impl Parser<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            candle::bail!("the pickle ends inside an opcode at byte {}", self.at)
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64> {
        let b = self.take(n)?;
        let mut v = 0u64;
        for (i, x) in b.iter().enumerate() {
            v |= u64::from(*x) << (8 * i);
        }
        Ok(v)
    }

    fn pop(&mut self) -> Result<PickleValue> {
        self.stack
            .pop()
            .ok_or_else(|| candle::Error::Msg("the pickle pops an empty stack".into()))
    }

    fn pop_mark(&mut self) -> Result<Vec<PickleValue>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| candle::Error::Msg("the pickle closes a MARK it never opened".into()))?;
        if mark > self.stack.len() {
            candle::bail!("the pickle's MARK lies beyond its stack")
        }
        Ok(self.stack.split_off(mark))
    }

    fn text(&mut self, n: usize) -> Result<PickleValue> {
        let b = self.take(n)?;
        Ok(PickleValue::Str(String::from_utf8(b.to_vec()).map_err(
            |_| candle::Error::Msg("a pickled str is not UTF-8".into()),
        )?))
    }

    fn memo_put(&mut self, index: usize) -> Result<()> {
        let top = self
            .stack
            .last()
            .cloned()
            .ok_or_else(|| candle::Error::Msg("the pickle memoizes an empty stack".into()))?;
        if index > self.bytes.len() {
            candle::bail!("the pickle's memo index {index} is out of range")
        }
        if self.memo.len() <= index {
            self.memo.resize(index + 1, None);
        }
        self.memo[index] = Some(top);
        Ok(())
    }

    fn memo_get(&mut self, index: usize) -> Result<()> {
        let v = self.memo.get(index).cloned().flatten().ok_or_else(|| {
            candle::Error::Msg(format!("the pickle reads memo {index}, never set"))
        })?;
        self.stack.push(v);
        Ok(())
    }

    /// Appends `items` to the list (or set) on top of the stack.
    fn extend(&mut self, items: Vec<PickleValue>) -> Result<()> {
        match self.stack.last_mut() {
            Some(PickleValue::List(v)) => v.extend(items),
            _ => candle::bail!("the pickle appends to something that is not a list"),
        }
        Ok(())
    }

    fn set_items(&mut self, items: Vec<PickleValue>) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            candle::bail!("the pickle sets a dict item without its value")
        }
        let mut it = items.into_iter();
        let mut pairs = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            pairs.push((k, v));
        }
        match self.stack.last_mut() {
            // Repeated keys are merged once the whole pickle is read (`merge_repeated_keys`):
            // a search per item here made large dicts quadratic.
            Some(PickleValue::Dict(d)) => d.extend(pairs),
            _ => candle::bail!("the pickle sets items on something that is not a dict"),
        }
        Ok(())
    }

    fn run(&mut self) -> Result<PickleValue> {
        loop {
            if self.stack.len() + self.marks.len() > self.bytes.len() + 1 {
                candle::bail!("the pickle's stack outgrows the file")
            }
            if self.marks.len() > MAX_DEPTH {
                candle::bail!("the pickle nests deeper than {MAX_DEPTH} levels")
            }
            let at = self.at;
            let op = self.take(1)?[0];
            match op {
                0x80 => {
                    self.take(1)?; // PROTO
                }
                0x95 => {
                    self.take(8)?; // FRAME: its length only groups the opcodes
                }
                b'.' => {
                    let mut v = self.pop()?;
                    merge_repeated_keys(&mut v);
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'}' => self.stack.push(PickleValue::Dict(Vec::new())),
                b']' | 0x8f => self.stack.push(PickleValue::List(Vec::new())),
                b')' => self.stack.push(PickleValue::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark()?;
                    self.stack.push(PickleValue::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n {
                        candle::bail!("the pickle builds a tuple from an empty stack")
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(PickleValue::Tuple(items));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.stack.push(PickleValue::List(items));
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.stack.push(PickleValue::List(items)); // FROZENSET
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.stack.push(PickleValue::Dict(Vec::new()));
                    self.set_items(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend(vec![v])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    self.extend(items)?;
                }
                b'N' => self.stack.push(PickleValue::None),
                0x88 => self.stack.push(PickleValue::Bool(true)),
                0x89 => self.stack.push(PickleValue::Bool(false)),
                b'J' => {
                    let v = self.uint(4)? as u32 as i32;
                    self.stack.push(PickleValue::Int(i64::from(v)));
                }
                b'K' => {
                    let v = self.uint(1)?;
                    self.stack.push(PickleValue::Int(v as i64));
                }
                b'M' => {
                    let v = self.uint(2)?;
                    self.stack.push(PickleValue::Int(v as i64));
                }
                0x8a => {
                    let n = self.uint(1)? as usize;
                    if n > 8 {
                        candle::bail!("the pickle holds an integer wider than 64 bits")
                    }
                    let b = self.take(n)?.to_vec();
                    let mut v: i64 = 0;
                    for (i, x) in b.iter().enumerate() {
                        v |= i64::from(*x) << (8 * i);
                    }
                    // Sign-extend from n bytes.
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.stack.push(PickleValue::Int(v));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let v = f64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                    self.stack.push(PickleValue::Float(v));
                }
                0x8c => {
                    let n = self.uint(1)? as usize;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                b'X' => {
                    let n = self.uint(4)? as usize;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = self.uint(8)? as usize;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                b'C' | b'B' => {
                    let n = self.uint(if op == b'C' { 1 } else { 4 })? as usize;
                    let b = self.take(n)?;
                    let items = b.iter().map(|x| PickleValue::Int(i64::from(*x))).collect();
                    self.stack.push(PickleValue::List(items));
                }
                0x94 => {
                    let index = self.memo.len();
                    self.memo_put(index)?;
                }
                b'q' => {
                    let i = self.uint(1)? as usize;
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = self.uint(4)? as usize;
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = self.uint(1)? as usize;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = self.uint(4)? as usize;
                    self.memo_get(i)?;
                }
                other => candle::bail!(
                    "the pickle holds opcode 0x{other:02x} at byte {at}, which is not data: expected a pickle of Python's builtins (dict, list, str, int, float) only"
                ),
            }
        }
    }
}

/// A dict key that merges with its repeats: strings and integers (other keys never merge).
#[derive(PartialEq, Eq, Hash)]
enum Key {
    Str(String),
    Int(i64),
}

/// Every dict in `v` with a repeated key keeps the key at its first place and the last value
/// set, as Python's dict does; in time linear in the size of `v`, without recursion (the
/// nesting is the file's).
fn merge_repeated_keys(v: &mut PickleValue) {
    use std::collections::hash_map::Entry;
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match v {
            PickleValue::Dict(items) => {
                let mut at = std::collections::HashMap::with_capacity(items.len());
                let mut merged: Vec<(PickleValue, PickleValue)> = Vec::with_capacity(items.len());
                for (k, v) in std::mem::take(items) {
                    let key = match &k {
                        PickleValue::Str(s) => Some(Key::Str(s.clone())),
                        PickleValue::Int(i) => Some(Key::Int(*i)),
                        _ => None,
                    };
                    let seen = key.and_then(|key| match at.entry(key) {
                        Entry::Occupied(e) => Some(*e.get()),
                        Entry::Vacant(e) => {
                            e.insert(merged.len());
                            None
                        }
                    });
                    match seen {
                        Some(i) => merged[i].1 = v,
                        None => merged.push((k, v)),
                    }
                }
                *items = merged;
                todo.extend(items.iter_mut().map(|(_, value)| value));
            }
            PickleValue::List(items) | PickleValue::Tuple(items) => todo.extend(items.iter_mut()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({"vocab_size": 3, "itos": {0: "a", 1: "\n"}, "x": [1.5, None, True]},
    /// protocol=4)` and the same at protocol 2.
    #[test]
    fn reads_protocols_two_and_four() -> Result<()> {
        let p4: &[u8] = b"\x80\x04\x95>\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\nvocab_size\x94K\x03\x8c\x04itos\x94}\x94(K\x00\x8c\x01a\x94K\x01\x8c\x01\n\x94u\x8c\x01x\x94]\x94(G?\xf8\x00\x00\x00\x00\x00\x00N\x88eu.";
        let p2: &[u8] = b"\x80\x02}q\x00(X\n\x00\x00\x00vocab_sizeq\x01K\x03X\x04\x00\x00\x00itosq\x02}q\x03(K\x00X\x01\x00\x00\x00aq\x04K\x01X\x01\x00\x00\x00\nq\x05uX\x01\x00\x00\x00xq\x06]q\x07(G?\xf8\x00\x00\x00\x00\x00\x00N\x88eu.";
        for bytes in [p4, p2] {
            let v = parse_plain_pickle(bytes)?;
            assert_eq!(v.get("vocab_size").and_then(PickleValue::as_i64), Some(3));
            let itos = v.get("itos").unwrap();
            assert_eq!(itos.get_index(1).and_then(PickleValue::as_str), Some("\n"));
            let x = v.get("x").and_then(PickleValue::as_list).unwrap();
            assert_eq!(x[0].as_f64(), Some(1.5));
            assert!(matches!(x[1], PickleValue::None));
            assert_eq!(x[2].as_bool(), Some(true));
        }
        // A class (here `os.system`) is refused, never looked up.
        let e = parse_plain_pickle(b"\x80\x02cos\nsystem\nq\x00.")
            .unwrap_err()
            .to_string();
        assert!(e.contains("opcode 0x63"), "{e}");
        assert!(parse_plain_pickle(b"\x80\x04}").is_err());
        Ok(())
    }

    /// A repeated key keeps its first place and its last value, as in Python:
    /// `pickle.dumps({"a": 1, "b": 2} | ..., protocol=2)` written by hand as two SETITEMS.
    #[test]
    fn a_repeated_key_keeps_its_place_and_last_value() -> Result<()> {
        // {} ( 'a' 1 'b' 2 'a' 3 u .
        let bytes =
            b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bK\x02X\x01\x00\x00\x00aK\x03u.";
        let v = parse_plain_pickle(bytes)?;
        let d = v.as_dict().unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].0.as_str(), Some("a"));
        assert_eq!(d[0].1.as_i64(), Some(3));
        assert_eq!(d[1].1.as_i64(), Some(2));
        Ok(())
    }

    /// A dict of 300,000 entries (nanoGPT's `meta.pkl` of a large character set) is read in
    /// linear time: a search per item (4.5e10 comparisons) took minutes.
    #[test]
    fn a_large_dict_reads_in_linear_time() -> Result<()> {
        let n = 300_000u32;
        let mut bytes = b"\x80\x04}(".to_vec();
        for i in 0..n {
            bytes.push(b'J'); // BININT
            bytes.extend_from_slice(&i.to_le_bytes());
            bytes.push(b'J');
            bytes.extend_from_slice(&(n - i).to_le_bytes());
        }
        bytes.extend_from_slice(b"u.");
        let start = std::time::Instant::now();
        let v = parse_plain_pickle(&bytes)?;
        let d = v.as_dict().unwrap();
        assert_eq!(d.len(), n as usize);
        assert_eq!(d[7].1.as_i64(), Some(i64::from(n - 7)));
        // Quadratic merging takes minutes here; linear well under a second.
        assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
        Ok(())
    }
}
