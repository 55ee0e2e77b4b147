//! Parameter initialisation: PyTorch's initialisers as candle [`Init`]s, and a seeded
//! [`VarBuilder`] that draws them reproducibly.
//!
//! candle's [`Init`] has no Xavier variant and its draws use the unseedable CPU generator.
//! [`xavier_uniform`], [`xavier_normal`] and [`linear_weight`] express PyTorch's initialisers
//! as plain [`Init`] values, so a module asks for them through any `VarBuilder`;
//! [`seeded_var_builder`] then draws them from a seed.

use candle::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

use crate::rng;

/// `xavier_uniform_`: U(±gain·√(6/(fan_in+fan_out))).
///
/// PyTorch equivalent: `torch.nn.init.xavier_uniform_(w)` with `gain = 1`, where for a 2-D
/// weight `(out, in)` `fan_in = in` and `fan_out = out`.
pub fn xavier_uniform(fan_in: usize, fan_out: usize) -> Init {
    let bound = (6.0 / (fan_in + fan_out) as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// `xavier_normal_`: N(0, 2/(fan_in+fan_out)).
///
/// PyTorch equivalent: `torch.nn.init.xavier_normal_(w)` with `gain = 1`.
pub fn xavier_normal(fan_in: usize, fan_out: usize) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: (2.0 / (fan_in + fan_out) as f64).sqrt(),
    }
}

/// The default initialisation of `nn.Linear`'s weight and bias: U(±1/√in_features).
///
/// PyTorch equivalent: `kaiming_uniform_(w, a=√5)`, which reduces to that bound. candle's
/// `linear` uses a different (ReLU-gain normal) weight init.
pub fn linear_weight(in_features: usize) -> Init {
    let bound = 1.0 / (in_features as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// Draws `init` for a tensor of `shape` from a seeded generator.
///
/// PyTorch equivalent: the `torch.nn.init.*_` functions under `torch.manual_seed(seed)`.
pub fn sample(
    init: &Init,
    shape: &Shape,
    dtype: DType,
    device: &Device,
    seed: u64,
) -> Result<Tensor> {
    match *init {
        Init::Const(v) => Tensor::ones(shape, dtype, device)?.affine(v, 0.0),
        Init::Uniform { lo, up } => rng::uniform(lo, up, shape, dtype, device, seed),
        Init::Randn { mean, stdev } => rng::normal(mean, stdev, shape, dtype, device, seed),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    rng::uniform(-bound, bound, shape, dtype, device, seed)
                }
                NormalOrUniform::Normal => rng::normal(0.0, std, shape, dtype, device, seed),
            }
        }
    }
}

/// A [`VarMap`] backend whose new variables are drawn from a seed.
struct SeededVarMap {
    varmap: VarMap,
    seed: u64,
}

impl SimpleBackend for SeededVarMap {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut data = self
            .varmap
            .data()
            .lock()
            .map_err(|_| candle::Error::Msg("the VarMap's lock is poisoned".into()))?;
        if let Some(var) = data.get(name) {
            if var.shape() != &s {
                candle::bail!(
                    "parameter `{name}` already exists with shape {:?}, but shape {:?} was requested",
                    var.dims(),
                    s.dims()
                )
            }
            return Ok(var.as_tensor().clone());
        }
        // Each name gets its own stream: creation order does not matter.
        let value = sample(&h, &s, dtype, dev, rng::derive_seed(self.seed, name))?;
        let var = Var::from_tensor(&value)?;
        let tensor = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        candle::bail!("`get_unchecked({name})` is not supported on a seeded VarMap, use `get`")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.varmap
            .data()
            .lock()
            .map(|d| d.contains_key(name))
            .unwrap_or(false)
    }
}

/// A [`VarMap`] backend whose new variables are zeros the operating system maps on first
/// write (`calloc`): they take no memory until a checkpoint fills them.
struct ZeroedVarMap(VarMap);

impl SimpleBackend for ZeroedVarMap {
    fn get(&self, s: Shape, name: &str, _: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut data = self
            .0
            .data()
            .lock()
            .map_err(|_| candle::Error::Msg("the VarMap's lock is poisoned".into()))?;
        if let Some(var) = data.get(name) {
            if var.shape() != &s {
                candle::bail!(
                    "parameter `{name}` already exists with shape {:?}, but shape {:?} was requested",
                    var.dims(),
                    s.dims()
                )
            }
            return Ok(var.as_tensor().clone());
        }
        let var = Var::zeros(s, dtype, dev)?;
        let tensor = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        candle::bail!("`get_unchecked({name})` is not supported on a zeroed VarMap, use `get`")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0
            .data()
            .lock()
            .map(|d| d.contains_key(name))
            .unwrap_or(false)
    }
}

/// A [`VarBuilder`] over `varmap` whose new parameters are zeros that take no memory until
/// written: for a model a checkpoint is about to fill whole
/// ([`load_into_varmap_owned`](crate::checkpoint::load_into_varmap_owned)), so that loading
/// does not hold a random initialisation and the checkpoint at once. Not for training from
/// scratch (zeros are no initialisation).
///
/// PyTorch equivalent: building the model under `torch.device("meta")` before
/// `load_state_dict(..., assign=True)`.
pub fn zeroed_var_builder(varmap: &VarMap, dtype: DType, device: &Device) -> VarBuilder<'static> {
    VarBuilder::from_backend(
        Box::new(ZeroedVarMap(varmap.clone())),
        dtype,
        device.clone(),
    )
}

/// A [`VarBuilder`] over `varmap` whose new parameters are initialised reproducibly from
/// `seed`: the same seed and names give the same values, on every run and platform.
///
/// Variables already in `varmap` are returned as they are (as with
/// [`VarBuilder::from_varmap`]); the trainable variables are `varmap.all_vars()`.
///
/// PyTorch equivalent: `torch.manual_seed(seed)` before constructing the model (the values
/// differ from PyTorch's; the distributions are the same).
///
/// ```
/// use candle::{DType, Device};
/// use candle_mha::{seeded_var_builder, MultiheadAttention, MultiheadAttentionConfig};
/// # fn main() -> candle::Result<()> {
/// let (a, b) = (candle_nn::VarMap::new(), candle_nn::VarMap::new());
/// let cfg = MultiheadAttentionConfig::new(8, 2);
/// let m1 = MultiheadAttention::new(cfg.clone(), seeded_var_builder(&a, 7, DType::F32, &Device::Cpu))?;
/// let m2 = MultiheadAttention::new(cfg, seeded_var_builder(&b, 7, DType::F32, &Device::Cpu))?;
/// let (w1, w2) = (m1.in_proj_weight().unwrap(), m2.in_proj_weight().unwrap());
/// assert_eq!(w1.to_vec2::<f32>()?, w2.to_vec2::<f32>()?);
/// # Ok(())
/// # }
/// ```
pub fn seeded_var_builder(
    varmap: &VarMap,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> VarBuilder<'static> {
    let backend = SeededVarMap {
        varmap: varmap.clone(),
        seed,
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}
