//! [`PickleValue`]: everything a `torch.save` file holds, not only its state dict: numbers,
//! strings, lists, tuples and dicts as Python's builtins, tensors materialised. A training
//! script's checkpoint (nanoGPT's `ckpt.pt`: `model_args`, `iter_num`, the optimizer's
//! `state_dict()`) is read this way.

use std::collections::HashMap;
use std::path::Path;

use candle::pickle::Object;
use candle::{Result, Tensor};

use super::container::Storages;
use super::tensor::{class_of, materialize, tensor_ref};

/// A value of a `torch.save` file. Classes this reader does not rebuild (a dataclass, a
/// pickled module, a `torch.device`) are [`PickleValue::Other`], named.
///
/// PyTorch equivalent: what `torch.load(path, weights_only=True)` returns.
#[derive(Clone, Debug)]
pub enum PickleValue {
    /// `None`.
    None,
    /// `True`, `False`.
    Bool(bool),
    /// An `int` that fits in 64 bits.
    Int(i64),
    /// A `float`.
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `list`.
    List(Vec<PickleValue>),
    /// A `tuple`.
    Tuple(Vec<PickleValue>),
    /// A `dict` or `OrderedDict`, in its order.
    Dict(Vec<(PickleValue, PickleValue)>),
    /// A tensor (a `Parameter` too), on the CPU in its stored dtype.
    Tensor(Tensor),
    /// Anything else, as `module.Class`.
    Other(String),
}

impl PickleValue {
    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&PickleValue> {
        match self {
            Self::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Self::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value under integer key `key` of a dict (an optimizer's `state` is keyed so).
    pub fn get_index(&self, key: i64) -> Option<&PickleValue> {
        match self {
            Self::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Self::Int(i) if *i == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// An `int` (or a `bool`, as Python treats it), or a 0-d integer tensor.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            Self::Bool(b) => Some(i64::from(*b)),
            Self::Tensor(t) if t.rank() == 0 => t
                .to_dtype(candle::DType::F64)
                .and_then(|t| t.to_scalar::<f64>())
                .ok()
                .filter(|x| x.fract() == 0.0)
                .map(|x| x as i64),
            _ => None,
        }
    }

    /// A number: a `float`, an `int`, or a 0-d tensor.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Float(x) => Some(*x),
            Self::Int(i) => Some(*i as f64),
            Self::Tensor(t) if t.rank() == 0 => t
                .to_dtype(candle::DType::F64)
                .and_then(|t| t.to_scalar::<f64>())
                .ok(),
            _ => None,
        }
    }

    /// A `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a `list` or `tuple`.
    pub fn as_list(&self) -> Option<&[PickleValue]> {
        match self {
            Self::List(v) | Self::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The entries of a dict.
    pub fn as_dict(&self) -> Option<&[(PickleValue, PickleValue)]> {
        match self {
            Self::Dict(v) => Some(v),
            _ => None,
        }
    }

    /// A tensor.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Self::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// Reads a whole `torch.save` file (zip or legacy format) as a [`PickleValue`], or a plain
/// pickle of builtins (`pickle.dump`, any protocol: [`super::parse_plain_pickle`]); the
/// pickle is parsed, never run, and its sizes are bounded as for
/// [`StateDict::load`](super::super::StateDict::load).
///
/// PyTorch equivalent: `torch.load(path, weights_only=True)` / `pickle.load(f)`.
pub fn load_pickle(path: &Path) -> Result<PickleValue> {
    let mut head = [0u8; 16];
    let n = std::io::Read::read(&mut crate::io::open_input(path)?, &mut head)
        .map_err(|e| candle::Error::Msg(format!("reading {}: {e}", path.display())))?;
    if !super::is_pickle_header(&head[..n]) {
        let bytes = crate::io::read_input(path, super::MAX_PLAIN_PICKLE_BYTES)?;
        return super::parse_plain_pickle(&bytes)
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())));
    }
    let (obj, mut storages) = super::open(path)?;
    let mut cache = HashMap::new();
    convert(obj, &mut storages, &mut cache, 0)
}

/// Deeper than this the file is refused (a pickle nests far less).
const MAX_DEPTH: usize = 200;

fn convert(
    obj: Object,
    storages: &mut Storages,
    cache: &mut HashMap<String, Vec<u8>>,
    depth: usize,
) -> Result<PickleValue> {
    if depth > MAX_DEPTH {
        candle::bail!("the pickle nests deeper than {MAX_DEPTH} levels")
    }
    let seq = |items: Vec<Object>,
               storages: &mut Storages,
               cache: &mut HashMap<String, Vec<u8>>|
     -> Result<Vec<PickleValue>> {
        items
            .into_iter()
            .map(|o| convert(o, storages, cache, depth + 1))
            .collect()
    };
    Ok(match obj {
        Object::None => PickleValue::None,
        Object::Bool(b) => PickleValue::Bool(b),
        Object::Int(i) => PickleValue::Int(i64::from(i)),
        Object::Long(i) => PickleValue::Int(i),
        Object::Float(x) => PickleValue::Float(x),
        Object::Unicode(s) => PickleValue::Str(s),
        Object::List(items) => PickleValue::List(seq(items, storages, cache)?),
        Object::Tuple(items) => PickleValue::Tuple(seq(items, storages, cache)?),
        Object::Dict(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (k, v) in items {
                out.push((
                    convert(k, storages, cache, depth + 1)?,
                    convert(v, storages, cache, depth + 1)?,
                ));
            }
            PickleValue::Dict(out)
        }
        obj => match tensor_ref(obj.clone()) {
            Some(Ok(t)) => {
                if !cache.contains_key(&t.key) {
                    let bytes = storages.bytes(&t.key)?;
                    cache.insert(t.key.clone(), bytes);
                }
                PickleValue::Tensor(materialize(&t, &cache[&t.key])?)
            }
            Some(Err(why)) => PickleValue::Other(format!("an unreadable tensor ({why})")),
            None => PickleValue::Other(describe(&obj)),
        },
    })
}

/// `module.Class` of an object this reader does not rebuild.
fn describe(obj: &Object) -> String {
    let class = match obj {
        Object::Reduce { callable, .. } | Object::Build { callable, .. } => match callable.as_ref()
        {
            Object::Reduce { callable, .. } => class_of(callable),
            other => class_of(other),
        },
        other => class_of(other),
    };
    match class {
        Some((m, c)) => format!("{m}.{c}"),
        None => "an object".to_string(),
    }
}
