//! [`StateDict`]: named tensors read from a PyTorch checkpoint (safetensors or pickle) or
//! taken from modules, and written back as PyTorch-compatible safetensors.

use std::collections::HashMap;
use std::path::Path;

use candle::{DType, Device, Result, Tensor};

use crate::io::write_atomic_with;

/// An ordered map of parameter names to tensors, with the file's metadata.
///
/// Names are kept in natural order (`layers.2` before `layers.10`). Tensors stay in their stored
/// dtype on the CPU until loaded into a module.
///
/// PyTorch equivalent: the `OrderedDict` of `module.state_dict()` / `torch.load(path)`.
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    tensors: Vec<(String, Tensor)>,
    metadata: HashMap<String, String>,
    /// Tensors of the file that could not be read, with the reason.
    skipped: Vec<(String, String)>,
}

/// Compares dotted names segment by segment, numbers numerically.
pub(super) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut x, mut y) = (a.split('.'), b.split('.'));
    loop {
        match (x.next(), y.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, _) => return std::cmp::Ordering::Less,
            (_, None) => return std::cmp::Ordering::Greater,
            (Some(p), Some(q)) => {
                let ord = match (p.parse::<u64>(), q.parse::<u64>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n),
                    _ => p.cmp(q),
                };
                if ord.is_ne() {
                    return ord;
                }
            }
        }
    }
}

/// The on-disk formats [`StateDict::load`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFormat {
    /// `.safetensors`.
    Safetensors,
    /// A `torch.save` file (`.pt`, `.pth`, `.bin`, `.ckpt`): the zip format, or the legacy
    /// format of PyTorch < 1.6 / `_use_new_zipfile_serialization=False`.
    Pickle,
}

impl CheckpointFormat {
    /// The format of `path`, from its extension, else from its first bytes.
    pub fn detect(path: &Path) -> Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("safetensors") => return Ok(Self::Safetensors),
            Some("pt" | "pth" | "bin" | "ckpt") => return Ok(Self::Pickle),
            _ => {}
        }
        let mut magic = [0u8; 16];
        let n = std::io::Read::read(&mut open(path)?, &mut magic).map_err(|e| io_err(path, e))?;
        Ok(if super::pickle::is_pickle_header(&magic[..n]) {
            Self::Pickle
        } else {
            Self::Safetensors
        })
    }
}

fn io_err(path: &Path, e: std::io::Error) -> candle::Error {
    unreadable(path, e.to_string())
}

fn unreadable(path: &Path, reason: String) -> candle::Error {
    super::CheckpointError::Unreadable {
        path: path.to_path_buf(),
        reason,
    }
    .into_candle()
}

fn open(path: &Path) -> Result<std::fs::File> {
    if path.is_dir() {
        return Err(unreadable(
            path,
            "it is a directory, expected a file".into(),
        ));
    }
    // A device or a FIFO (`/dev/zero`, `/dev/urandom`) has no end to read to.
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, e))?;
    if !meta.is_file() {
        return Err(unreadable(
            path,
            format!(
                "not a regular file ({:?}); expected a safetensors or torch.save file",
                meta.file_type()
            ),
        ));
    }
    std::fs::File::open(path).map_err(|e| io_err(path, e))
}

impl StateDict {
    /// A state_dict from named tensors.
    pub fn from_tensors(tensors: impl IntoIterator<Item = (String, Tensor)>) -> Self {
        let mut tensors: Vec<_> = tensors.into_iter().collect();
        tensors.sort_by(|a, b| natural_cmp(&a.0, &b.0));
        Self {
            tensors,
            metadata: HashMap::new(),
            skipped: Vec::new(),
        }
    }

    /// Reads a checkpoint: safetensors, or a PyTorch pickle (`torch.save`, also with the
    /// state_dict nested under `state_dict`, `model`, `model_state_dict`, `module` or `net`).
    ///
    /// PyTorch equivalent: `safetensors.torch.load_file(path)` / `torch.load(path)["state_dict"]`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        // What went wrong inside the file; an error that already says which it is stays.
        let ctx = |e: candle::Error| match crate::error::find::<super::CheckpointError>(&e) {
            Some(_) => e,
            None => super::CheckpointError::Invalid {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
            .into_candle(),
        };
        match CheckpointFormat::detect(path)? {
            CheckpointFormat::Safetensors => Self::read_safetensors(path).map_err(ctx),
            CheckpointFormat::Pickle => {
                open(path)?;
                Self::from_pickle(path).map_err(ctx)
            }
        }
    }

    /// Parses safetensors bytes. A bool tensor is read as u8 (0/1, candle having no bool);
    /// tensors of dtypes candle lacks (int8, complex, float8_e5m2, …) go to
    /// [`skipped`](Self::skipped) instead of failing the whole file.
    pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.is_empty() {
            candle::bail!("the file is empty, expected a safetensors header")
        }
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| candle::Error::Msg(format!("invalid safetensors header: {e}")))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| candle::Error::Msg(format!("invalid safetensors header: {e}")))?;
        let mut read = ReadTensors::default();
        for (name, view) in st.tensors() {
            read.push(name, view)?;
        }
        Ok(read.finish(header.metadata().clone()))
    }

    /// A safetensors file read one tensor at a time (in the order of their bytes): its
    /// header checked as the `safetensors` crate checks a whole buffer (offsets contiguous and
    /// matching each shape, ending at the file's end), then each tensor's bytes read and
    /// converted before the next, so the file is never whole in memory.
    fn read_safetensors(path: &Path) -> Result<Self> {
        use safetensors::tensor::{Metadata, TensorView};
        use std::io::Read;
        let invalid =
            |what: String| candle::Error::Msg(format!("invalid safetensors header: {what}"));
        let mut file = open(path)?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        if len == 0 {
            candle::bail!("the file is empty, expected a safetensors header")
        }
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|_| invalid(format!("the file has {len} bytes, fewer than 8")))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER_BYTES as u64 || n > len - 8 {
            return Err(invalid(format!(
                "it announces {n} bytes of header in a file of {len} bytes"
            )));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(|e| io_err(path, e))?;
        let header: Metadata = std::str::from_utf8(&header)
            .map_err(|e| invalid(e.to_string()))
            .and_then(|h| serde_json::from_str(h).map_err(|e| invalid(e.to_string())))?;
        let data = len - 8 - n;
        if header.data_len() as u64 != data {
            return Err(invalid(format!(
                "its tensors take {} bytes, the file holds {data} after the header",
                header.data_len()
            )));
        }
        let mut read = ReadTensors::default();
        let mut bytes = Vec::new();
        for name in header.offset_keys() {
            let Some(info) = header.info(&name) else {
                continue;
            };
            let (start, end) = info.data_offsets;
            bytes.clear();
            bytes.resize(end - start, 0);
            file.read_exact(&mut bytes).map_err(|e| io_err(path, e))?;
            let view = TensorView::new(info.dtype, info.shape.clone(), &bytes)
                .map_err(|e| candle::Error::Msg(format!("tensor {name}: {e}")))?;
            read.push(name, view)?;
        }
        Ok(read.finish(header.metadata().clone()))
    }

    fn from_pickle(path: &Path) -> Result<Self> {
        let contents = super::pickle::read(path)?;
        let mut sd = Self::from_tensors(contents.tensors);
        if let Some(k) = contents.nested_under {
            sd.metadata.insert("nested_under".into(), k);
        }
        if let Some(class) = contents.module_class {
            sd.metadata.insert("pickled_module".into(), class);
        }
        sd.skipped = contents.skipped;
        sd.skipped.sort_by(|a, b| natural_cmp(&a.0, &b.0));
        Ok(sd)
    }

    /// Tensors the file holds that could not be read (an int8, complex or sparse tensor, …),
    /// each with the reason; empty for state dicts built in memory.
    ///
    /// PyTorch equivalent: none (PyTorch reads every tensor type).
    pub fn skipped(&self) -> &[(String, String)] {
        &self.skipped
    }

    /// The tensors, in natural name order.
    pub fn tensors(&self) -> &[(String, Tensor)] {
        &self.tensors
    }

    /// The file's metadata (safetensors `__metadata__`).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Where the tensors came from, as load reports name it: the `"source"` metadata (the
    /// file a loader read), else `"state_dict"`. Not in PyTorch (a state_dict has no origin).
    pub fn source(&self) -> &str {
        self.metadata
            .get("source")
            .map(String::as_str)
            .unwrap_or("state_dict")
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        // The tensors are sorted by `natural_cmp`, under which a few names may tie ("a.01",
        // "a.1"): a binary search to the tied run, then an exact match in it.
        let start = self
            .tensors
            .partition_point(|(n, _)| natural_cmp(n, name).is_lt());
        self.tensors[start..]
            .iter()
            .take_while(|(n, _)| natural_cmp(n, name).is_eq())
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether it holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensors under `prefix` (`"a.b"` or `"a.b."`), with the prefix removed.
    ///
    /// PyTorch equivalent: what `module.load_state_dict` sees for a submodule at that prefix.
    pub fn under(&self, prefix: &str) -> Self {
        let prefix = normalize_prefix(prefix);
        let tensors = self
            .tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix(&prefix).map(|n| (n.to_string(), t.clone())))
            .collect::<Vec<_>>();
        let mut sd = Self::from_tensors(tensors);
        sd.skipped = self
            .skipped
            .iter()
            .filter_map(|(n, why)| {
                n.strip_prefix(&prefix)
                    .map(|n| (n.to_string(), why.clone()))
            })
            .collect();
        sd
    }

    /// Every tensor cast to `dtype`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        let tensors = self
            .tensors
            .iter()
            .map(|(n, t)| Ok((n.clone(), super::cast(t, dtype)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            tensors,
            metadata: self.metadata.clone(),
            skipped: self.skipped.clone(),
        })
    }

    /// The safetensors bytes: contiguous tensors with exactly these names, and
    /// `{"format": "pt"}` in the metadata (what `safetensors.torch` writes and
    /// `transformers` checks).
    pub fn to_safetensors_bytes(&self) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.write_safetensors(&mut bytes)?;
        Ok(bytes)
    }

    /// Writes [`to_safetensors_bytes`](Self::to_safetensors_bytes)'s bytes into `w` one tensor
    /// at a time: the file is never whole in memory (a checkpoint of a large model is saved in
    /// about its largest tensor's size, not the model's).
    ///
    /// PyTorch equivalent: `safetensors.torch.save(state_dict, {"format": "pt"})`, streamed.
    pub fn write_safetensors(&self, w: &mut dyn std::io::Write) -> Result<()> {
        use safetensors::tensor::{Metadata, TensorInfo};
        use safetensors::View;
        let io = |e: std::io::Error| candle::Error::Msg(format!("writing safetensors: {e}"));
        // The `safetensors` crate's order (`serialize`): descending dtype, then name.
        let mut order: Vec<&(String, Tensor)> = self.tensors.iter().collect();
        order.sort_by(|(ln, l), (rn, r)| View::dtype(r).cmp(&View::dtype(l)).then(ln.cmp(rn)));
        let mut offset = 0;
        let infos = order
            .iter()
            .map(|(name, t)| {
                let n = View::data_len(t);
                let info = TensorInfo {
                    dtype: View::dtype(t),
                    shape: t.dims().to_vec(),
                    data_offsets: (offset, offset + n),
                };
                offset += n;
                (name.clone(), info)
            })
            .collect();
        let mut metadata = self.metadata.clone();
        // What this crate noted about the source file, not the file's own metadata.
        metadata.retain(|k, _| k != "nested_under" && k != "pickled_module");
        metadata.insert("format".into(), "pt".into());
        let header = Metadata::new(Some(metadata), infos)
            .and_then(|m| Ok(serde_json::to_string(&m)?))
            .map_err(|e| candle::Error::Msg(format!("serializing safetensors: {e}")))?;
        let mut header = header.into_bytes();
        header.resize(header.len().next_multiple_of(8), b' ');
        if header.len() > MAX_HEADER_BYTES {
            candle::bail!(
                "serializing safetensors: a header of {} bytes ({} tensors), more than the format's {MAX_HEADER_BYTES}",
                header.len(),
                self.tensors.len()
            )
        }
        let mut head = (header.len() as u64).to_le_bytes().to_vec();
        head.extend(header);
        w.write_all(&sort_metadata(head)).map_err(io)?;
        for (_, t) in order {
            // A contiguous CPU copy where it is not one already: `View::data` must not fail.
            let t = t.to_device(&Device::Cpu)?.contiguous()?;
            w.write_all(&View::data(&t)).map_err(io)?;
        }
        Ok(())
    }

    /// Writes the tensors as safetensors to `path`, atomically, streamed
    /// ([`write_safetensors`](Self::write_safetensors)).
    ///
    /// PyTorch equivalent: `safetensors.torch.save_file(state_dict, path, {"format": "pt"})`;
    /// PyTorch reads it back with `load_state_dict(load_file(path), strict=True)`.
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomic_with(path.as_ref(), &mut |w| self.write_safetensors(w))
    }

    /// Adds `key: value` to the metadata written by [`save_safetensors`](Self::save_safetensors).
    pub fn with_metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
}

/// The tensors of a safetensors file as they are converted, and those candle cannot hold.
#[derive(Default)]
struct ReadTensors {
    tensors: Vec<(String, Tensor)>,
    skipped: Vec<(String, String)>,
}

impl ReadTensors {
    /// Converts one tensor: a bool tensor as u8 (0/1, candle having no bool); a dtype candle
    /// lacks (int8, complex, float8_e5m2, …) goes to the skipped list.
    fn push(&mut self, name: String, view: safetensors::tensor::TensorView) -> Result<()> {
        let view = if view.dtype() == safetensors::Dtype::BOOL {
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::U8,
                view.shape().to_vec(),
                view.data(),
            )
            .map_err(|e| candle::Error::Msg(format!("tensor {name}: {e}")))?
        } else {
            view
        };
        match candle::safetensors::Load::load(&view, &Device::Cpu) {
            Ok(t) => self.tensors.push((name, t)),
            Err(e) if e.to_string().contains("unsupported safetensor dtype") => {
                self.skipped.push((
                    name,
                    format!("its dtype {:?} has no candle equivalent", view.dtype()),
                ))
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn finish(mut self, metadata: Option<HashMap<String, String>>) -> StateDict {
        let mut sd = StateDict::from_tensors(self.tensors);
        sd.metadata = metadata.unwrap_or_default();
        self.skipped.sort_by(|a, b| natural_cmp(&a.0, &b.0));
        sd.skipped = self.skipped;
        sd
    }
}

/// The `safetensors` crate's largest header (it refuses to read a larger one).
const MAX_HEADER_BYTES: usize = 100_000_000;

/// Safetensors bytes with the `__metadata__` entries in sorted order: the `safetensors` crate
/// writes them in a `HashMap`'s order, which varies from process to process, so that the same
/// tensors gave different bytes. The header keeps its length (the same entries, reordered).
fn sort_metadata(mut bytes: Vec<u8>) -> Vec<u8> {
    const PREFIX: &str = "{\"__metadata__\":";
    let Some(n) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    else {
        return bytes;
    };
    let Some(header) = bytes.get(8..8 + n as usize) else {
        return bytes;
    };
    let Some(rest) = std::str::from_utf8(header)
        .ok()
        .and_then(|h| h.strip_prefix(PREFIX))
    else {
        return bytes;
    };
    let mut stream = serde_json::Deserializer::from_str(rest)
        .into_iter::<std::collections::BTreeMap<String, String>>();
    let Some(Ok(sorted)) = stream.next() else {
        return bytes;
    };
    let end = stream.byte_offset();
    match serde_json::to_string(&sorted) {
        Ok(text) if text.len() == end => {
            let at = 8 + PREFIX.len();
            bytes[at..at + end].copy_from_slice(text.as_bytes());
            bytes
        }
        _ => bytes,
    }
}

/// `"a.b"` and `"a.b."` → `"a.b."`; `""` stays empty.
pub fn normalize_prefix(prefix: &str) -> String {
    let p = prefix.trim_end_matches('.');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut v = vec!["layers.10.a", "layers.2.a", "layers.2", "b"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["b", "layers.2", "layers.2.a", "layers.10.a"]);
    }

    #[test]
    fn prefixes() {
        assert_eq!(normalize_prefix("a.b"), "a.b.");
        assert_eq!(normalize_prefix("a.b."), "a.b.");
        assert_eq!(normalize_prefix(""), "");
    }

    /// `get` finds every name among names that tie in the natural order ("a.01", "a.1").
    #[test]
    fn get_finds_names_that_tie_in_the_natural_order() -> Result<()> {
        let names = ["a.1", "a.01", "a.2", "b", "a.001", "a.10"];
        let sd = StateDict::from_tensors(names.iter().enumerate().map(|(i, n)| {
            (
                n.to_string(),
                Tensor::new(&[i as f32], &candle::Device::Cpu).unwrap(),
            )
        }));
        for (i, n) in names.iter().enumerate() {
            let t = sd.get(n).expect(n).to_vec1::<f32>()?;
            assert_eq!(t, [i as f32], "{n}");
        }
        assert!(sd.get("a.3").is_none() && sd.get("c").is_none());
        Ok(())
    }

    /// The streamed writer gives the bytes of the `safetensors` crate's own `serialize` (its
    /// tensor order, offsets, padding), metadata sorted: mixed dtypes, a strided tensor, an
    /// empty one, and metadata entries.
    #[test]
    fn streamed_safetensors_equal_the_crates_serialize() -> Result<()> {
        let dev = Device::Cpu;
        let m = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?;
        let tensors = vec![
            ("w.t".to_string(), m.t()?),
            ("b".to_string(), Tensor::new(&[1.5f64, -2.0], &dev)?),
            ("h".to_string(), m.to_dtype(DType::F16)?),
            ("a.bf".to_string(), m.to_dtype(DType::BF16)?),
            ("mask".to_string(), Tensor::new(&[1u8, 0, 1], &dev)?),
            ("ids".to_string(), Tensor::new(&[7i64, -1], &dev)?),
            (
                "empty".to_string(),
                Tensor::zeros((0, 3), DType::F32, &dev)?,
            ),
        ];
        let sd = StateDict::from_tensors(tensors.clone())
            .with_metadata("zeta", "1")
            .with_metadata("alpha", "2");
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.contiguous().unwrap()))
            .collect();
        let meta: HashMap<String, String> = [("zeta", "1"), ("alpha", "2"), ("format", "pt")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let want = sort_metadata(safetensors::serialize(views, Some(meta)).unwrap());
        assert_eq!(sd.to_safetensors_bytes()?, want);
        Ok(())
    }
}
