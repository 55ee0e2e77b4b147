//! Tensors in a `torch.save` pickle: the dtypes we read, the `_rebuild_tensor_v2` calls that
//! reference a storage (with strides and offsets), and turning them into candle tensors.

use candle::pickle::Object;
use candle::{DType, Device, Result, Tensor};

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
pub(super) fn dtype_of(name: &str) -> std::result::Result<(DType, usize), String> {
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
pub(super) struct TensorRef {
    pub(super) key: String,
    dtype: DType,
    elem_size: usize,
    storage_numel: usize,
    offset: usize,
    size: Vec<usize>,
    stride: Vec<usize>,
}

pub(super) fn usizes(obj: Object, what: &str) -> std::result::Result<Vec<usize>, String> {
    let items = match obj {
        Object::Tuple(v) | Object::List(v) => v,
        other => return Err(format!("its {what} is {other:?}, expected a tuple")),
    };
    items
        .into_iter()
        .map(|o| non_negative(o, &format!("{what} entry")))
        .collect()
}

pub(super) fn non_negative(obj: Object, what: &str) -> std::result::Result<usize, String> {
    match obj.int_or_long() {
        Ok(v) if v >= 0 => Ok(v as usize),
        _ => Err(format!("its {what} is not a non-negative integer")),
    }
}

pub(super) fn class_of(obj: &Object) -> Option<(&str, &str)> {
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
pub(super) fn tensor_ref(obj: Object) -> Option<std::result::Result<TensorRef, String>> {
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
pub(super) fn rebuild_tensor(
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

/// The most bytes a view larger than its storage (an `expand`ed tensor, stride 0) is
/// materialised into.
pub const MAX_EXPANDED_BYTES: u64 = 256 << 20;

/// The tensor's elements, gathered contiguously from its storage's bytes.
pub(super) fn materialize(t: &TensorRef, storage: &[u8]) -> Result<Tensor> {
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
    // An expanded view (stride 0) may describe far more elements than its storage holds: a
    // 1.5 KB file could ask for gigabytes. Such a view is materialised up to a stated size.
    let want = numel.saturating_mul(es);
    let stored = t.storage_numel.saturating_mul(es);
    if want > stored && want as u64 > MAX_EXPANDED_BYTES {
        candle::bail!(
            "its view repeats its storage of {stored} bytes into {numel} elements of {es} bytes ({want} bytes): more than the {MAX_EXPANDED_BYTES} bytes an expanded view may take"
        )
    }
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
