//! Reading `torch.save` files without Python: the zip format (PyTorch ≥ 1.6, the default) and
//! the legacy stream format (`_use_new_zipfile_serialization=False`, older PyTorch), holding
//! a state dict (also nested under a key) or a whole pickled module (`torch.save(model)`).
//!
//! The pickle is parsed by candle's pickle machine (`candle::pickle::Stack`), which builds a
//! tree of objects and runs nothing: a file cannot execute code here, whatever classes it
//! names. On top of candle's own reader (`candle::pickle::read_all_with_key`) this reads
//! strided views (`x[:, ::2]`, `expand`ed tensors), shared storages, `int16`/`int32`/`bool`/
//! `float8_e4m3fn` storages, and reports what it cannot read instead of dropping it.

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle::pickle::{Object, Stack};
use candle::{DType, Device, Result, Tensor};

/// Keys under which PyTorch training scripts commonly nest the state_dict in a pickle.
pub(crate) const NESTING_KEYS: [&str; 5] =
    ["state_dict", "model", "model_state_dict", "module", "net"];

/// What [`read`] found in a pickle.
#[derive(Debug, Default)]
pub(crate) struct PickleContents {
    /// The tensors, by state-dict name.
    pub tensors: Vec<(String, Tensor)>,
    /// Tensors that are in the file but could not be read: name and why.
    pub skipped: Vec<(String, String)>,
    /// The key the state dict was nested under, if any.
    pub nested_under: Option<String>,
    /// `module.Class` of a pickled module (`torch.save(model)`), if that is what the file holds.
    pub module_class: Option<String>,
}

/// The first 15 bytes of a legacy `torch.save` file: `pickle.dumps(MAGIC_NUMBER, protocol=2)`
/// (`0x1950a86a20f9469cfc6c` as a 10-byte LONG1), compared as bytes because candle's pickle
/// machine reads longs into an `i64`.
const LEGACY_MAGIC: [u8; 15] = [
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e,
];

/// Whether `head` (a file's first bytes) starts a `torch.save` file: a zip, or the legacy
/// format's magic number.
pub(crate) fn is_pickle_header(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || head.starts_with(&LEGACY_MAGIC)
}

/// The readable dtypes: candle dtype and size on disk, by PyTorch's name of the dtype
/// (`torch.float32`) and of its typed storage (`FloatStorage`).
const DTYPES: [(&str, &str, DType, usize); 11] = [
    ("float32", "FloatStorage", DType::F32, 4),
    ("float64", "DoubleStorage", DType::F64, 8),
    ("float16", "HalfStorage", DType::F16, 2),
    ("bfloat16", "BFloat16Storage", DType::BF16, 2),
    ("uint8", "ByteStorage", DType::U8, 1),
    ("int64", "LongStorage", DType::I64, 8),
    ("int32", "IntStorage", DType::I32, 4),
    ("int16", "ShortStorage", DType::I16, 2),
    // PyTorch's bool is one byte, 0 or 1: the u8 mask convention of candle (and this crate).
    ("bool", "BoolStorage", DType::U8, 1),
    ("float8_e4m3fn", "Float8_e4m3fnStorage", DType::F8E4M3, 1),
    ("uint32", "UInt32Storage", DType::U32, 4),
];

/// The candle dtype and element size of a PyTorch dtype or typed-storage name.
fn dtype_of(name: &str) -> std::result::Result<(DType, usize), String> {
    DTYPES
        .iter()
        .find(|(dtype, storage, _, _)| *dtype == name || *storage == name)
        .map(|(_, _, dt, size)| (*dt, *size))
        .ok_or_else(|| {
            let name = match name {
                "CharStorage" => "int8",
                "ComplexFloatStorage" => "complex64",
                "ComplexDoubleStorage" => "complex128",
                other => other,
            };
            format!(
                "its dtype {name} has no candle equivalent (readable: float64/32/16, bfloat16, \
                 float8_e4m3fn, int64/32/16, uint32, uint8, bool)"
            )
        })
}

/// A tensor as the pickle describes it: a view into a storage.
#[derive(Debug)]
struct TensorRef {
    key: String,
    dtype: DType,
    elem_size: usize,
    storage_numel: usize,
    offset: usize,
    size: Vec<usize>,
    stride: Vec<usize>,
}

fn usizes(obj: Object, what: &str) -> std::result::Result<Vec<usize>, String> {
    let items = match obj {
        Object::Tuple(v) | Object::List(v) => v,
        other => return Err(format!("its {what} is {other:?}, expected a tuple")),
    };
    items
        .into_iter()
        .map(|o| non_negative(o, &format!("{what} entry")))
        .collect()
}

fn non_negative(obj: Object, what: &str) -> std::result::Result<usize, String> {
    match obj.int_or_long() {
        Ok(v) if v >= 0 => Ok(v as usize),
        _ => Err(format!("its {what} is not a non-negative integer")),
    }
}

fn class_of(obj: &Object) -> Option<(&str, &str)> {
    match obj {
        Object::Class {
            module_name,
            class_name,
        } => Some((module_name.as_str(), class_name.as_str())),
        _ => None,
    }
}

/// The tensor `obj` describes: `None` if it is not a tensor at all (a number, a string, a
/// dict…), `Some(Err(why))` if it is one this reader cannot read.
fn tensor_ref(obj: Object) -> Option<std::result::Result<TensorRef, String>> {
    let (callable, args) = match obj {
        Object::Reduce { callable, args } => (*callable, *args),
        // A tensor subclass pickled with its state: the tensor is what was built.
        Object::Build { callable, .. } => return tensor_ref(*callable),
        _ => return None,
    };
    let (module, name) = class_of(&callable)?;
    let mut args = match args {
        Object::Tuple(a) => a,
        _ => {
            return Some(Err(format!(
                "{module}.{name} with arguments that are not a tuple"
            )))
        }
    };
    match (module, name) {
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state")
            if !args.is_empty() =>
        {
            tensor_ref(args.swap_remove(0))
        }
        // (function, type, arguments, state): a tensor of a subclass type.
        ("torch._tensor", "_rebuild_from_type_v2") if args.len() >= 3 => {
            let inner = args.swap_remove(2);
            let func = args.swap_remove(0);
            tensor_ref(Object::Reduce {
                callable: Box::new(func),
                args: Box::new(inner),
            })
        }
        ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor") if args.len() >= 4 => {
            Some(rebuild_tensor(args, None))
        }
        // Newer dtypes: an untyped (byte) storage and the dtype as argument 6.
        ("torch._utils", "_rebuild_tensor_v3") if args.len() >= 7 => {
            let dtype = match class_of(&args[6]) {
                Some((_, name)) => name.to_string(),
                None => return Some(Err("its dtype argument is not a torch dtype".into())),
            };
            Some(rebuild_tensor(args, Some(&dtype)))
        }
        ("torch._utils", other) if other.starts_with("_rebuild") => Some(Err(format!(
            "it is rebuilt by torch._utils.{other} (sparse, quantized, meta or other special \
             tensors are not supported; save a dense tensor)"
        ))),
        _ => None,
    }
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, …)`, or v3 with the `dtype` of
/// an untyped storage.
fn rebuild_tensor(
    mut args: Vec<Object>,
    dtype: Option<&str>,
) -> std::result::Result<TensorRef, String> {
    let stride = usizes(args.remove(3), "stride")?;
    let size = usizes(args.remove(2), "size")?;
    let offset = non_negative(args.remove(1), "storage offset")?;
    let storage = match args.remove(0) {
        Object::PersistentLoad(id) => *id,
        other => {
            return Err(format!(
                "its storage is {other:?}, expected a persistent id"
            ))
        }
    };
    // ('storage', storage type, key, location, numel[, view metadata])
    let mut id = match storage {
        Object::Tuple(id) if id.len() >= 5 => id,
        other => return Err(format!("its storage id is {other:?}")),
    };
    if id.len() > 5 && id[5] != Object::None {
        return Err("it views a storage view (PyTorch < 0.4 files): not supported".into());
    }
    let storage_numel = non_negative(id.remove(4), "storage size")?;
    let key = match id.remove(2) {
        Object::Unicode(k) => k,
        other => return Err(format!("its storage key is {other:?}")),
    };
    let class = id.remove(1);
    let (_, class_name) = class_of(&class).ok_or("its storage type is not a class")?;
    let (dtype, elem_size, storage_numel) = match (class_name, dtype) {
        // An untyped storage counts bytes.
        ("UntypedStorage", Some(name)) => {
            let (dt, es) = dtype_of(name)?;
            (dt, es, storage_numel / es)
        }
        (name, _) => {
            let (dt, es) = dtype_of(name)?;
            (dt, es, storage_numel)
        }
    };
    if size.len() != stride.len() {
        return Err(format!(
            "its size {size:?} and stride {stride:?} have different lengths"
        ));
    }
    let numel = size
        .iter()
        .try_fold(1usize, |acc, n| acc.checked_mul(*n))
        .ok_or_else(|| format!("its size {size:?} overflows"))?;
    if numel > 0 {
        let last = size.iter().zip(&stride).try_fold(offset, |acc, (n, s)| {
            acc.checked_add((n - 1).checked_mul(*s)?)
        });
        if last.is_none_or(|last| last >= storage_numel) {
            return Err(format!(
                "its view (offset {offset}, size {size:?}, stride {stride:?}) reaches past its \
                 storage of {storage_numel} elements"
            ));
        }
    }
    Ok(TensorRef {
        key,
        dtype,
        elem_size,
        storage_numel,
        offset,
        size,
        stride,
    })
}

/// The tensor's elements, gathered contiguously from its storage's bytes.
fn materialize(t: &TensorRef, storage: &[u8]) -> Result<Tensor> {
    let es = t.elem_size;
    if storage.len() < t.storage_numel * es {
        candle::bail!(
            "its storage {} holds {} bytes, expected {} elements of {es} bytes",
            t.key,
            storage.len(),
            t.storage_numel
        )
    }
    let numel: usize = t.size.iter().product();
    // An expanded view (stride 0) may describe far more elements than its storage holds.
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(numel.saturating_mul(es))
        .map_err(|_| {
            candle::Error::Msg(format!(
                "its {numel} elements of {es} bytes do not fit in memory"
            ))
        })?;
    let mut contiguous = true;
    let mut expect = 1;
    for (n, st) in t.size.iter().zip(&t.stride).rev() {
        contiguous &= *n == 1 || *st == expect;
        expect *= n;
    }
    if numel > 0 && contiguous {
        bytes.extend_from_slice(&storage[t.offset * es..(t.offset + numel) * es]);
    } else if numel > 0 {
        // Row-major walk over the view (bounds checked in `rebuild_tensor`).
        let mut index = vec![0usize; t.size.len()];
        let mut at = t.offset;
        for _ in 0..numel {
            bytes.extend_from_slice(&storage[at * es..(at + 1) * es]);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                at += t.stride[d];
                if index[d] < t.size[d] {
                    break;
                }
                at -= t.stride[d] * t.size[d];
                index[d] = 0;
            }
        }
    }
    let st_dtype = match t.dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::U8 => safetensors::Dtype::U8,
        DType::I64 => safetensors::Dtype::I64,
        DType::I32 => safetensors::Dtype::I32,
        DType::I16 => safetensors::Dtype::I16,
        DType::F8E4M3 => safetensors::Dtype::F8_E4M3,
        DType::U32 => safetensors::Dtype::U32,
        other => candle::bail!("no safetensors dtype for {other:?}"),
    };
    let view = safetensors::tensor::TensorView::new(st_dtype, t.size.clone(), &bytes)
        .map_err(|e| candle::Error::Msg(format!("{e}")))?;
    candle::safetensors::Load::load(&view, &Device::Cpu)
}

/// Where the storages' bytes are.
enum Storages {
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
    fn bytes(&mut self, key: &str) -> Result<Vec<u8>> {
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

fn parse_one(r: &mut impl std::io::BufRead) -> Result<Object> {
    let mut stack = Stack::empty();
    stack.read_loop(r)?;
    stack.finalize()
}

/// Opens a zip `torch.save` file: its `data.pkl` object and its storages.
fn open_zip(path: &Path) -> Result<(Object, Storages)> {
    let file = std::fs::File::open(path)?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| candle::Error::Msg(format!("invalid zip archive: {e}")))?;
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
fn open_legacy(path: &Path) -> Result<(Object, Storages)> {
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
fn collect_storage_sizes(obj: &Object, out: &mut HashMap<String, usize>) {
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

/// `key -> value` of a pickled dict whose keys are strings.
fn str_items(obj: Object) -> Option<Vec<(String, Object)>> {
    match obj {
        Object::Dict(kv) => Some(
            kv.into_iter()
                .filter_map(|(k, v)| match k {
                    Object::Unicode(k) => Some((k, v)),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

/// A pickled `nn.Module`: `(module.Class, its attribute dict)`.
fn as_module(obj: &Object) -> Option<(String, &Vec<(Object, Object)>)> {
    let Object::Build { callable, args } = obj else {
        return None;
    };
    let Object::Dict(attrs) = args.as_ref() else {
        return None;
    };
    let class = match callable.as_ref() {
        Object::Reduce { callable, .. } => class_of(callable),
        other => class_of(other),
    }?;
    let has_params = attrs
        .iter()
        .any(|(k, _)| *k == Object::Unicode("_parameters".into()));
    has_params.then(|| (format!("{}.{}", class.0, class.1), attrs))
}

/// Names in a pickled `set` (`builtins.set([...])`).
fn set_names(obj: &Object) -> Vec<String> {
    let list = match obj {
        Object::Reduce { args, .. } => match args.as_ref() {
            Object::Tuple(a) => a.first(),
            _ => None,
        },
        _ => None,
    };
    match list {
        Some(Object::List(v)) => v
            .iter()
            .filter_map(|o| match o {
                Object::Unicode(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The state-dict entries of a pickled module, as `module.state_dict()` names them:
/// parameters, persistent buffers, then submodules, `None` entries left out.
fn module_entries(attrs: &[(Object, Object)], prefix: &str, out: &mut Vec<(String, Object)>) {
    let get = |name: &str| {
        attrs
            .iter()
            .find(|(k, _)| *k == Object::Unicode(name.into()))
            .map(|(_, v)| v)
    };
    let non_persistent = get("_non_persistent_buffers_set")
        .map(set_names)
        .unwrap_or_default();
    for (field, skip) in [("_parameters", &[][..]), ("_buffers", &non_persistent[..])] {
        if let Some(items) = get(field).cloned().and_then(str_items) {
            for (name, value) in items {
                if value != Object::None && !skip.contains(&name) {
                    out.push((format!("{prefix}{name}"), value));
                }
            }
        }
    }
    if let Some(children) = get("_modules").cloned().and_then(str_items) {
        for (name, child) in children {
            if let Some((_, attrs)) = as_module(&child) {
                module_entries(attrs, &format!("{prefix}{name}."), out);
            }
        }
    }
}

/// Whether any value of a dict-like entry list is a tensor.
fn holds_tensors(items: &[(String, Object)]) -> bool {
    items.iter().any(|(_, v)| tensor_ref(v.clone()).is_some())
}

/// Finds the state dict in the file's object: the object itself, a dict nested under one of
/// [`NESTING_KEYS`], or a pickled module (also nested).
fn state_dict_entries(obj: Object, out: &mut PickleContents) -> Result<Vec<(String, Object)>> {
    if let Some((class, attrs)) = as_module(&obj) {
        let mut entries = Vec::new();
        module_entries(attrs, "", &mut entries);
        out.module_class = Some(class);
        return Ok(entries);
    }
    let Some(items) = str_items(obj) else {
        candle::bail!(
            "the pickle holds no dict of tensors; expected a state_dict saved with torch.save"
        )
    };
    if holds_tensors(&items) {
        return Ok(items);
    }
    for key in NESTING_KEYS {
        if let Some((_, value)) = items.iter().find(|(k, _)| k == key) {
            let mut nested = PickleContents::default();
            if let Ok(entries) = state_dict_entries(value.clone(), &mut nested) {
                if holds_tensors(&entries) {
                    out.nested_under = Some(key.to_string());
                    out.module_class = nested.module_class;
                    return Ok(entries);
                }
            }
        }
    }
    candle::bail!(
        "the pickle holds no tensors (looked at the top level and under {NESTING_KEYS:?}); \
         expected a state_dict saved with torch.save"
    )
}

/// Reads the tensors of a `torch.save` file (zip or legacy).
pub(crate) fn read(path: &Path) -> Result<PickleContents> {
    let mut head = [0u8; 16];
    let n = std::fs::File::open(path)?.read(&mut head)?;
    let (obj, mut storages) = if head[..n].starts_with(b"PK\x03\x04") {
        open_zip(path)?
    } else if head[..n].starts_with(&LEGACY_MAGIC) {
        open_legacy(path)?
    } else {
        candle::bail!(
            "not a torch.save file: it starts with neither a zip header nor the legacy \
             format's magic number"
        )
    };
    let mut out = PickleContents::default();
    let entries = state_dict_entries(obj, &mut out)?;
    let mut refs = Vec::new();
    for (name, value) in entries {
        match tensor_ref(value) {
            None => {}
            Some(Err(why)) => out.skipped.push((name, why)),
            Some(Ok(t)) => refs.push((name, t)),
        }
    }
    // A storage's bytes are read once and kept only while a later tensor still views them.
    let mut users: HashMap<String, usize> = HashMap::new();
    for (_, t) in &refs {
        *users.entry(t.key.clone()).or_default() += 1;
    }
    let mut cache: HashMap<String, Vec<u8>> = HashMap::new();
    for (name, t) in refs {
        if !cache.contains_key(&t.key) {
            let bytes = storages.bytes(&t.key)?;
            cache.insert(t.key.clone(), bytes);
        }
        let tensor = materialize(&t, &cache[&t.key])
            .map_err(|e| candle::Error::Msg(format!("tensor {name}: {e}")))?;
        out.tensors.push((name, tensor));
        let left = users.get_mut(&t.key).expect("counted above");
        *left -= 1;
        if *left == 0 {
            cache.remove(&t.key);
        }
    }
    Ok(out)
}
