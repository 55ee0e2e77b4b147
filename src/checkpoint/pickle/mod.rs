//! `torch.save` files without Python, read and written (`torch_save.rs` is the writer).
//! Reading: the zip format (PyTorch ≥ 1.6, the default) and the legacy stream format
//! (`_use_new_zipfile_serialization=False`, older PyTorch), holding a state dict (also nested under a key) or a whole pickled module (`torch.save(model)`).
//!
//! The pickle is parsed by candle's pickle machine (`candle::pickle::Stack`), which builds a
//! tree of objects and runs nothing: a file cannot execute code here, whatever classes it
//! names. On top of candle's own reader (`candle::pickle::read_all_with_key`) this reads
//! strided views (`x[:, ::2]`, `expand`ed tensors), shared storages, `int16`/`int32`/`bool`/
//! `float8_e4m3fn` storages, and reports what it cannot read instead of dropping it.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use candle::pickle::Object;
use candle::{Result, Tensor};

mod bounded;
mod container;
mod plain;
mod tensor;
mod torch_save;
mod value;

use container::{open_legacy, open_zip, Storages};
pub use plain::{parse_plain_pickle, MAX_PLAIN_PICKLE_BYTES};
use tensor::{class_of, materialize, tensor_ref};
pub use torch_save::save_torch;
pub use value::{load_pickle, PickleValue};

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

/// A state dict found in a pickle: its tensor count, the key it is nested under, what was
/// learnt of it, its entries.
type Candidate<'a> = (
    usize,
    Option<&'a str>,
    PickleContents,
    Vec<(String, Object)>,
);

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
    // A training script's checkpoint may hold a few tensors of its own beside the nested
    // state dict (nanoGPT's `best_val_loss`): the candidate with the most tensors wins.
    let count = |entries: &[(String, Object)]| {
        entries
            .iter()
            .filter(|(_, v)| tensor_ref(v.clone()).is_some())
            .count()
    };
    let mut best: Option<Candidate> = None;
    if holds_tensors(&items) {
        best = Some((
            count(&items),
            None,
            PickleContents::default(),
            items.clone(),
        ));
    }
    for key in NESTING_KEYS {
        if let Some((_, value)) = items.iter().find(|(k, _)| k == key) {
            let mut nested = PickleContents::default();
            if let Ok(entries) = state_dict_entries(value.clone(), &mut nested) {
                let n = count(&entries);
                if n > 0 && best.as_ref().is_none_or(|b| n > b.0) {
                    best = Some((n, Some(key), nested, entries));
                }
            }
        }
    }
    if let Some((_, key, nested, entries)) = best {
        if let Some(key) = key {
            out.nested_under = Some(key.to_string());
            out.module_class = nested.module_class;
        }
        return Ok(entries);
    }
    candle::bail!(
        "the pickle holds no tensors (looked at the top level and under {NESTING_KEYS:?}); \
         expected a state_dict saved with torch.save"
    )
}

/// The object tree and the storages of a `torch.save` file (zip or legacy).
fn open(path: &Path) -> Result<(Object, Storages)> {
    let mut head = [0u8; 16];
    let n = crate::io::open_input(path)?.read(&mut head)?;
    if head[..n].starts_with(b"PK\x03\x04") {
        open_zip(path)
    } else if head[..n].starts_with(&LEGACY_MAGIC) {
        open_legacy(path)
    } else {
        candle::bail!(
            "not a torch.save file: it starts with neither a zip header nor the legacy \
             format's magic number"
        )
    }
}

/// Reads the tensors of a `torch.save` file (zip or legacy).
pub(crate) fn read(path: &Path) -> Result<PickleContents> {
    let (obj, mut storages) = open(path)?;
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
