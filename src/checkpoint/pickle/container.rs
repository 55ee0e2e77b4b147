//! The two `torch.save` containers: the zip archive (`data.pkl` + one file per storage) and
//! the legacy stream (pickle, storage keys, then the storages' bytes in order).

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle::pickle::{Object, Stack};
use candle::Result;

use super::tensor::{class_of, dtype_of};
use super::LEGACY_MAGIC;

/// Where the storages' bytes are.
pub(super) enum Storages {
    /// Zip records `{dir}data/{key}`.
    Zip {
        archive: zip::ZipArchive<BufReader<std::fs::File>>,
        dir: String,
    },
    /// Legacy format: the file, and where each storage's bytes are (offset, length).
    Legacy {
        file: std::fs::File,
        at: HashMap<String, (u64, usize)>,
    },
}

impl Storages {
    pub(super) fn bytes(&mut self, key: &str) -> Result<Vec<u8>> {
        match self {
            Self::Zip { archive, dir } => {
                let name = format!("{dir}data/{key}");
                let mut record = archive
                    .by_name(&name)
                    .map_err(|e| candle::Error::Msg(format!("storage record {name}: {e}")))?;
                let mut bytes = Vec::new();
                record.read_to_end(&mut bytes)?;
                Ok(bytes)
            }
            Self::Legacy { file, at } => {
                let (offset, len) = *at.get(key).ok_or_else(|| {
                    candle::Error::Msg(format!("storage {key} is not in the file"))
                })?;
                file.seek(std::io::SeekFrom::Start(offset))?;
                let mut bytes = vec![0u8; len];
                file.read_exact(&mut bytes)?;
                Ok(bytes)
            }
        }
    }
}

/// One pickle from `r`, its nesting and size checked first ([`super::bounded`]).
pub(super) fn parse_one(r: &mut impl std::io::BufRead) -> Result<Object> {
    let bytes = super::bounded::read_bounded(r)?;
    let mut stack = Stack::empty();
    stack.read_loop(&mut std::io::Cursor::new(bytes))?;
    stack.finalize()
}

/// The zip archive of `path`, read from its first byte. `torch.save` archives start there;
/// the zip crate's search for an archive behind leading bytes misreads some of them (it takes
/// a central directory record right before PyTorch's zip64 records for the start of the
/// directory, as with every 21-character archive name), so that search is the fallback.
fn open_archive(path: &Path) -> Result<zip::ZipArchive<BufReader<std::fs::File>>> {
    let open = |offset| -> Result<_> {
        let file = std::fs::File::open(path)?;
        let config = zip::read::Config {
            archive_offset: offset,
        };
        zip::ZipArchive::with_config(config, BufReader::new(file))
            .map_err(|e| candle::Error::Msg(format!("invalid zip archive: {e}")))
    };
    open(zip::read::ArchiveOffset::Known(0)).or_else(|_| open(zip::read::ArchiveOffset::Detect))
}

/// Opens a zip `torch.save` file: its `data.pkl` object and its storages.
pub(super) fn open_zip(path: &Path) -> Result<(Object, Storages)> {
    let mut archive = open_archive(path)?;
    let names = archive
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<std::result::Result<Vec<String>, _>>()
        .map_err(|e| candle::Error::Msg(format!("invalid zip archive: {e}")))?;
    if names
        .iter()
        .any(|n| n.ends_with("constants.pkl") || n.contains("/code/"))
    {
        candle::bail!(
            "this is a TorchScript archive (torch.jit.save), not a torch.save file; in PyTorch, \
             save its state_dict: torch.save(torch.jit.load(path).state_dict(), 'weights.pt')"
        )
    }
    let pkl = names
        .iter()
        .find(|n| n.ends_with("data.pkl"))
        .cloned()
        .ok_or_else(|| candle::Error::Msg("the zip archive has no data.pkl".into()))?;
    let dir = pkl.trim_end_matches("data.pkl").to_string();
    if let Ok(mut rec) = archive.by_name(&format!("{dir}byteorder")) {
        let mut order = String::new();
        rec.read_to_string(&mut order)?;
        if order.trim() == "big" {
            candle::bail!("the file was written on a big-endian machine: not supported")
        }
    }
    let obj = {
        let rec = archive
            .by_name(&pkl)
            .map_err(|e| candle::Error::Msg(format!("{pkl}: {e}")))?;
        parse_one(&mut BufReader::new(rec))?
    };
    Ok((obj, Storages::Zip { archive, dir }))
}

/// Reads a legacy `torch.save` stream: magic number, protocol version, system info, the
/// object, the sorted storage keys, then each storage as an 8-byte element count and its
/// bytes (little-endian).
pub(super) fn open_legacy(path: &Path) -> Result<(Object, Storages)> {
    let mut r = BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0u8; 15];
    r.read_exact(&mut magic)?;
    if magic != LEGACY_MAGIC {
        candle::bail!("not a torch.save file (neither a zip archive nor the legacy format)")
    }
    let _protocol = parse_one(&mut r)?;
    if let Object::Dict(info) = parse_one(&mut r)? {
        let little = info
            .iter()
            .find(|(k, _)| *k == Object::Unicode("little_endian".into()));
        if let Some((_, Object::Bool(false))) = little {
            candle::bail!("the file was written on a big-endian machine: not supported")
        }
    }
    let obj = parse_one(&mut r)?;
    let keys = match parse_one(&mut r)? {
        Object::List(keys) => keys,
        other => candle::bail!("legacy format: expected the list of storage keys, got {other:?}"),
    };
    // Element sizes come from the tensors that use each storage.
    let mut elem_size = HashMap::new();
    collect_storage_sizes(&obj, &mut elem_size);
    let mut storages = HashMap::new();
    for key in keys {
        let key = match key {
            Object::Unicode(k) => k,
            other => candle::bail!("legacy format: a storage key is {other:?}"),
        };
        let mut n = [0u8; 8];
        r.read_exact(&mut n)?;
        let numel = i64::from_le_bytes(n);
        let es = *elem_size.get(&key).ok_or_else(|| {
            candle::Error::Msg(format!("legacy format: storage {key} has no known type"))
        })?;
        let len = usize::try_from(numel)
            .ok()
            .and_then(|n| n.checked_mul(es))
            .ok_or_else(|| candle::Error::Msg(format!("storage {key}: bad size {numel}")))?;
        let here = r.stream_position()?;
        let file_len = r.get_ref().metadata()?.len();
        if here.saturating_add(len as u64) > file_len {
            candle::bail!("storage {key} ({len} bytes) runs past the end of the file")
        }
        r.seek_relative(len as i64)?;
        storages.insert(key, (here, len));
    }
    let file = r.into_inner();
    Ok((obj, Storages::Legacy { file, at: storages }))
}

/// Element size of every storage a tensor in `obj` uses (its type is in the persistent id).
pub(super) fn collect_storage_sizes(obj: &Object, out: &mut HashMap<String, usize>) {
    match obj {
        Object::PersistentLoad(id) => {
            if let Object::Tuple(id) = id.as_ref() {
                if let (Some(Object::Unicode(key)), Some((_, class))) =
                    (id.get(2), id.get(1).and_then(class_of))
                {
                    let es = dtype_of(class).map(|(_, es)| es).unwrap_or(1);
                    out.insert(key.clone(), es);
                }
            }
        }
        Object::Tuple(v) | Object::List(v) => v.iter().for_each(|o| collect_storage_sizes(o, out)),
        Object::Dict(kv) => kv.iter().for_each(|(k, v)| {
            collect_storage_sizes(k, out);
            collect_storage_sizes(v, out)
        }),
        Object::Reduce { callable, args } | Object::Build { callable, args } => {
            collect_storage_sizes(callable, out);
            collect_storage_sizes(args, out)
        }
        _ => {}
    }
}
