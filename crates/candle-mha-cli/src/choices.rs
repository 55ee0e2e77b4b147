//! The command line's fixed sets of choices (`--device`, `--dtype`, `--fusion`,
//! `--baseline`), as value enums so that `--help` lists the accepted values.

use candle_mha::candle::DType;
use candle_mha_viz::HeadFusion;
use clap::builder::{PossibleValue, TypedValueParser};
use clap::ValueEnum;

/// A dtype the command line accepts (`--dtype`); each command says which it supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    /// 32-bit float.
    #[value(alias = "float32")]
    F32,
    /// 64-bit float.
    #[value(alias = "float64")]
    F64,
    /// 16-bit float (inference).
    #[value(aliases = ["float16", "half"])]
    F16,
    /// bfloat16 (inference).
    #[value(alias = "bfloat16")]
    Bf16,
}

impl From<Dtype> for DType {
    fn from(d: Dtype) -> Self {
        match d {
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::F64,
            Dtype::F16 => DType::F16,
            Dtype::Bf16 => DType::BF16,
        }
    }
}

/// A bad value of `arg`: its name, then `why`.
fn invalid(arg: Option<&clap::Arg>, why: String) -> clap::Error {
    let name = arg.and_then(clap::Arg::get_long).unwrap_or("value");
    clap::Error::raw(
        clap::error::ErrorKind::InvalidValue,
        format!("--{name}: {why}\n"),
    )
}

/// Parses `--dtype` into a candle [`DType`], listing the values in `--help` and naming the
/// argument and the accepted values on a bad one (`unknown dtype "f8": expected ...`).
#[derive(Clone, Copy, Debug)]
pub struct DtypeParser;

impl TypedValueParser for DtypeParser {
    type Value = DType;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DType, clap::Error> {
        let s = value.to_string_lossy();
        Dtype::from_str(&s, false).map(DType::from).map_err(|_| {
            invalid(
                arg,
                format!("unknown dtype \"{s}\": expected f32, f64, f16 or bf16"),
            )
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            Dtype::value_variants()
                .iter()
                .filter_map(ValueEnum::to_possible_value),
        ))
    }
}

/// Parses `--device`: `auto`, `cpu`, `cuda` or `cuda:N` (a GPU index, which a value enum
/// cannot list, hence a parser). Whether the device exists is checked when it is opened.
#[derive(Clone, Copy, Debug)]
pub struct DeviceParser;

impl TypedValueParser for DeviceParser {
    type Value = String;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let s = value.to_string_lossy();
        let valid = matches!(s.as_ref(), "auto" | "cpu" | "cuda")
            || s.strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<usize>().is_ok());
        if valid {
            Ok(s.into_owned())
        } else {
            Err(invalid(
                arg,
                format!("invalid device \"{s}\": expected auto, cpu, cuda or cuda:N"),
            ))
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            [
                PossibleValue::new("auto").help("CUDA device 0 when there is one, else the CPU"),
                PossibleValue::new("cpu"),
                PossibleValue::new("cuda").help("CUDA device 0"),
                PossibleValue::new("cuda:N").help("CUDA device N"),
            ]
            .into_iter(),
        ))
    }
}

/// How `mha inspect` fuses the heads of a layer (`--fusion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fusion {
    /// The average over heads (PyTorch's `average_attn_weights=True`).
    Mean,
    /// The element-wise maximum.
    Max,
    /// The element-wise minimum.
    Min,
}

impl Fusion {
    /// The fusion of one layer's heads and of the rollout over layers.
    pub fn head_and_rollout(self) -> (HeadFusion, HeadFusion) {
        match self {
            Fusion::Mean => (HeadFusion::Mean, HeadFusion::Mean),
            Fusion::Max => (HeadFusion::Max, HeadFusion::Max),
            Fusion::Min => (HeadFusion::Min, HeadFusion::Min),
        }
    }
}

/// Count-model baselines `mha eval` can print beside the model (`--baseline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// Unigram and bigram models counted on the data's training part.
    Bigram,
}

/// Each choice prints as it is spelled on the command line (`mean`, `bigram`, ...).
macro_rules! display_as_spelled {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.to_possible_value() {
                    Some(v) => f.write_str(v.get_name()),
                    None => write!(f, "{self:?}"),
                }
            }
        }
    )*};
}
display_as_spelled!(Dtype, Fusion, Baseline);
