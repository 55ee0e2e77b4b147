//! Writing `torch.save` files: a [`PickleValue`] (dicts, lists, tuples, numbers, strings and
//! tensors) in the zip format of PyTorch ≥ 1.6, which `torch.load(path, weights_only=True)`
//! reads: a protocol-2 pickle naming only `torch._utils._rebuild_tensor_v2`,
//! `collections.OrderedDict` and the storage classes, and one record per tensor.

use std::io::Write;
use std::path::Path;

use candle::{DType, Result, Tensor};

use super::PickleValue;

/// Writes `value` to `path` as `torch.save(value, path)` would, atomically. Tensors are
/// written contiguous, each with a storage of its own.
///
/// PyTorch equivalent: `torch.save(obj, path)`.
pub fn save_torch(path: &Path, value: &PickleValue) -> Result<()> {
    let mut w = PickleWriter::default();
    w.out.extend_from_slice(&[0x80, 0x02]);
    w.value(value)?;
    w.out.push(b'.');
    let stem = "archive";
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .with_alignment(64);
    let err = |e: zip::result::ZipError| candle::Error::Msg(format!("writing the zip: {e}"));
    let mut record = |name: String, bytes: &[u8]| -> Result<()> {
        zip.start_file(name, stored).map_err(err)?;
        zip.write_all(bytes)
            .map_err(|e| candle::Error::Msg(format!("writing the zip: {e}")))
    };
    record(format!("{stem}/data.pkl"), &w.out)?;
    record(format!("{stem}/byteorder"), b"little")?;
    for (key, bytes) in &w.storages {
        record(format!("{stem}/data/{key}"), bytes)?;
    }
    record(format!("{stem}/version"), b"3\n")?;
    let bytes = zip.finish().map_err(err)?.into_inner();
    crate::io::write_atomic(path, &bytes)
}

#[derive(Default)]
struct PickleWriter {
    out: Vec<u8>,
    storages: Vec<(String, Vec<u8>)>,
}

impl PickleWriter {
    fn global(&mut self, module: &str, name: &str) {
        self.out.push(b'c');
        self.out.extend_from_slice(module.as_bytes());
        self.out.push(b'\n');
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b'\n');
    }

    fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    fn int(&mut self, i: i64) {
        if (0..256).contains(&i) {
            self.out.extend_from_slice(&[b'K', i as u8]);
        } else if (0..65536).contains(&i) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(i as u16).to_le_bytes());
        } else if i32::try_from(i).is_ok() {
            self.out.push(b'J');
            self.out.extend_from_slice(&(i as i32).to_le_bytes());
        } else {
            self.out.extend_from_slice(&[0x8a, 8]);
            self.out.extend_from_slice(&i.to_le_bytes());
        }
    }

    fn tuple(&mut self, items: &[PickleValue]) -> Result<()> {
        match items.len() {
            0 => self.out.push(b')'),
            n @ 1..=3 => {
                for v in items {
                    self.value(v)?;
                }
                self.out.push(0x84 + n as u8);
            }
            _ => {
                self.out.push(b'(');
                for v in items {
                    self.value(v)?;
                }
                self.out.push(b't');
            }
        }
        Ok(())
    }

    fn value(&mut self, v: &PickleValue) -> Result<()> {
        match v {
            PickleValue::None => self.out.push(b'N'),
            PickleValue::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            PickleValue::Int(i) => self.int(*i),
            PickleValue::Float(x) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&x.to_be_bytes());
            }
            PickleValue::Str(s) => self.str(s),
            PickleValue::List(items) => {
                self.out.push(b']');
                if !items.is_empty() {
                    self.out.push(b'(');
                    for v in items {
                        self.value(v)?;
                    }
                    self.out.push(b'e');
                }
            }
            PickleValue::Tuple(items) => self.tuple(items)?,
            PickleValue::Dict(items) => {
                self.out.push(b'}');
                if !items.is_empty() {
                    self.out.push(b'(');
                    for (k, v) in items {
                        self.value(k)?;
                        self.value(v)?;
                    }
                    self.out.push(b'u');
                }
            }
            PickleValue::Tensor(t) => self.tensor(t)?,
            PickleValue::Other(what) => {
                candle::bail!("torch.save writer: {what} cannot be written (data and tensors only)")
            }
        }
        Ok(())
    }

    /// `_rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())`, the storage a
    /// persistent id `('storage', torch.XStorage, key, 'cpu', numel)`.
    fn tensor(&mut self, t: &Tensor) -> Result<()> {
        let (class, bytes) = storage_bytes(t)?;
        let key = self.storages.len().to_string();
        let numel = t.elem_count();
        self.storages.push((key.clone(), bytes));
        self.global("torch._utils", "_rebuild_tensor_v2");
        self.out.push(b'(');
        self.out.push(b'(');
        self.str("storage");
        self.global("torch", class);
        self.str(&key);
        self.str("cpu");
        self.int(numel as i64);
        self.out.push(b't');
        self.out.push(b'Q'); // BINPERSID
        self.int(0);
        let dims: Vec<PickleValue> = t
            .dims()
            .iter()
            .map(|d| PickleValue::Int(*d as i64))
            .collect();
        let mut stride = vec![1usize; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            stride[i] = stride[i + 1] * t.dims()[i + 1];
        }
        let stride: Vec<PickleValue> = stride.iter().map(|s| PickleValue::Int(*s as i64)).collect();
        self.tuple(&dims)?;
        self.tuple(&stride)?;
        self.out.push(0x89); // requires_grad False
        self.global("collections", "OrderedDict");
        self.out.push(b')');
        self.out.push(b'R');
        self.out.push(b't');
        self.out.push(b'R');
        Ok(())
    }
}

/// The storage class and little-endian bytes of `t`'s elements, contiguous.
fn storage_bytes(t: &Tensor) -> Result<(&'static str, Vec<u8>)> {
    let class = match t.dtype() {
        DType::F32 => "FloatStorage",
        DType::F64 => "DoubleStorage",
        DType::F16 => "HalfStorage",
        DType::BF16 => "BFloat16Storage",
        DType::I64 => "LongStorage",
        DType::U8 => "ByteStorage",
        d => candle::bail!("torch.save writer: tensors of dtype {d:?} are not written"),
    };
    let t = t.to_device(&candle::Device::Cpu)?.contiguous()?;
    // candle's safetensors view: the elements' bytes in memory order (little-endian here).
    Ok((class, safetensors::View::data(&t).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is written reads back through this crate's own `torch.load` reader.
    #[test]
    fn a_written_file_reads_back() -> Result<()> {
        let dev = candle::Device::Cpu;
        let w = Tensor::arange(0f32, 6.0, &dev)?.reshape((2, 3))?;
        let value = PickleValue::Dict(vec![
            (
                PickleValue::Str("model".into()),
                PickleValue::Dict(vec![(
                    PickleValue::Str("w".into()),
                    PickleValue::Tensor(w.clone()),
                )]),
            ),
            (
                PickleValue::Str("iter_num".into()),
                PickleValue::Int(70_000),
            ),
            (PickleValue::Str("lr".into()), PickleValue::Float(6e-4)),
            (
                PickleValue::Str("betas".into()),
                PickleValue::Tuple(vec![PickleValue::Float(0.9), PickleValue::Float(0.95)]),
            ),
            (PickleValue::Str("bias".into()), PickleValue::Bool(false)),
        ]);
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("ckpt.pt");
        save_torch(&path, &value)?;
        let back = super::super::super::load_pickle(&path)?;
        assert_eq!(
            back.get("iter_num").and_then(PickleValue::as_i64),
            Some(70_000)
        );
        assert_eq!(back.get("lr").and_then(PickleValue::as_f64), Some(6e-4));
        assert_eq!(back.get("bias").and_then(PickleValue::as_bool), Some(false));
        let t = back
            .get("model")
            .and_then(|m| m.get("w"))
            .and_then(PickleValue::as_tensor)
            .unwrap();
        assert_eq!(t.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
        let sd = super::super::super::StateDict::load(&path)?;
        assert_eq!(sd.get("w").map(|t| t.dims().to_vec()), Some(vec![2, 3]));
        Ok(())
    }
}
