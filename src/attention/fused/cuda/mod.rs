//! The fused attention kernels on CUDA (`flash.cu`): loading, launch parameters and the three
//! entry points (forward, backward, decoding) the ops call.
//!
//! `flash.cu` is compiled by `build.rs` into a fat binary (machine code for
//! `CUDA_COMPUTE_CAP`, 90 by default, and compute_80 PTX that the driver compiles for other
//! GPUs of compute capability 8.0 or more), loaded once per device. On an older GPU the module
//! does not load and [`available`] says so: the module then keeps the reference path.
//!
//! Operands are read in place through [`RowMap`]s (the head split of a `(·, ·, E)` or packed
//! `(·, ·, 3E)` projection, or a cache's `(N, H, len, d)` view): no head transpose is copied.

mod op;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle::backend::BackendStorage;
use candle::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    SyncOnDrop,
};
use candle::cuda_backend::cudarc::nvrtc::Ptx;
use candle::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, DeviceId, WrapErr};
use candle::{DType, Result};

use super::kernel::{Geom, RowMap};
use crate::nn::dropout::DropoutMask;

pub(crate) use op::decode_attention_cuda;

static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flash_attention.fatbin"));

const OP: &str = "fused attention (CUDA)";

/// The largest head dim the kernels take (the tiles are 32, 64 or 128 columns wide).
pub(crate) const MAX_HEAD_DIM: usize = 128;

/// A row map as the kernels read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Map {
    off: i64,
    sb: i64,
    sh: i64,
    si: i64,
}

impl From<RowMap> for Map {
    fn from(m: RowMap) -> Self {
        Self {
            off: m.off as i64,
            sb: m.sb as i64,
            sh: m.sh as i64,
            si: m.si as i64,
        }
    }
}

/// The kernels' one parameter struct (`Params` in `flash.cu`, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Params {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    dout: u64,
    dq_acc: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    lse: u64,
    dsum: u64,
    attn: u64,
    kpm: u64,
    mq: Map,
    mk: Map,
    mv: Map,
    mo: Map,
    mdo: Map,
    mdq: Map,
    mdk: Map,
    mdv: Map,
    attn_bh_stride: i64,
    causal_offset: i64,
    drop_key: u64,
    drop_threshold: u64,
    drop_offset: u64,
    n: i32,
    h: i32,
    l: i32,
    s: i32,
    d: i32,
    s_masked: i32,
    causal: i32,
    dropout: i32,
    vec: i32,
    scale: f32,
    scale_log2: f32,
    drop_scale: f32,
}

// SAFETY: plain old data, laid out as the kernels' struct.
unsafe impl DeviceRepr for Params {}

// The kernels' struct size (13 pointers, 8 row maps of four i64, 5 64-bit scalars, 9 i32 and
// 3 f32): a field out of order or of another width would shift every field after it. Checked
// at compile time, so every `--features cuda` build (CI's check included) checks it.
const _: () = assert!(std::mem::size_of::<Params>() == 13 * 8 + 8 * 32 + 5 * 8 + 9 * 4 + 3 * 4);
const _: () = assert!(std::mem::align_of::<Params>() == 8);

/// A tensor the kernels read or write: its storage and where its rows are (the layout's start
/// offset included).
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub storage: &'a CudaStorage,
    pub map: RowMap,
}

/// The additive f32 masks (contiguous): `attn` `(L, s_masked)`, or `(N·H, L, s_masked)` with
/// the flag; `kpm` `(N, s_masked)`. Each with its start offset in elements.
#[derive(Clone, Copy, Default)]
pub(crate) struct CudaMasks<'a> {
    pub attn: Option<(&'a CudaStorage, usize, bool)>,
    pub kpm: Option<(&'a CudaStorage, usize)>,
}

/// Where the causal rule puts the diagonal: key `j < s_masked` is masked for query `i` when
/// `j > i + offset` (0 for a square mask; the cache length before the queries when decoding).
pub(crate) type CausalOffset = Option<usize>;

fn modules() -> &'static Mutex<HashMap<DeviceId, Arc<CudaModule>>> {
    static MODULES: OnceLock<Mutex<HashMap<DeviceId, Arc<CudaModule>>>> = OnceLock::new();
    MODULES.get_or_init(Default::default)
}

/// The kernels' module on `dev`, loaded on first use.
fn module(dev: &CudaDevice) -> Result<Arc<CudaModule>> {
    let mut cache = modules()
        .lock()
        .map_err(|_| candle::Error::Msg(format!("{OP}: the module cache is poisoned")))?;
    if let Some(m) = cache.get(&dev.id()) {
        return Ok(m.clone());
    }
    let stream = dev.cuda_stream();
    let m = stream
        .context()
        .load_module(Ptx::from_binary(FATBIN.to_vec()))
        .map_err(|e| {
            candle::Error::Msg(format!(
                "{OP}: cannot load the kernels on this GPU ({e}); they need compute capability 8.0 or more"
            ))
        })?;
    cache.insert(dev.id(), m.clone());
    Ok(m)
}

/// Whether the fused kernels run on `dev` (they load: compute capability 8.0 or more).
pub(crate) fn available(dev: &CudaDevice) -> bool {
    module(dev).is_ok()
}

/// Kernel `name` with room for `smem` bytes of dynamic shared memory.
fn function(dev: &CudaDevice, name: &str, smem: usize) -> Result<CudaFunction> {
    let f = module(dev)?.load_function(name).w()?;
    if smem > 48 * 1024 {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
    }
    Ok(f)
}

fn dtype_name(dt: DType) -> Result<&'static str> {
    match dt {
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        DType::F32 => Ok("f32"),
        dt => candle::bail!("{OP}: dtype {dt:?} is not supported (bf16, f16 or f32)"),
    }
}

/// The tile width in head-dim columns for head dim `d`.
fn padded_head_dim(d: usize) -> Result<usize> {
    match d {
        0 => candle::bail!("{OP}: head dim 0"),
        1..=32 => Ok(32),
        33..=64 => Ok(64),
        65..=128 => Ok(128),
        _ => candle::bail!("{OP}: head dim {d} is over the kernels' {MAX_HEAD_DIM}"),
    }
}

/// Warps per block of the forward and backward kernels (`FwdTile::NW`, `BwdTile::NW`): each
/// warp takes 16 query rows (forward) or 16 key rows (backward).
const fn warps(dt: DType) -> usize {
    match dt {
        DType::F32 => 4,
        _ => 8,
    }
}

/// Element size and row padding of the kernels' shared tiles.
const fn elem_pad(dt: DType) -> (usize, usize) {
    match dt {
        DType::F32 => (4, 4),
        _ => (2, 8),
    }
}

/// Query rows per forward block.
const fn forward_rows(dt: DType) -> usize {
    16 * warps(dt)
}

/// Shared memory of the forward kernel (`fwd_impl`'s tiles).
const fn forward_smem(dt: DType, dp: usize) -> usize {
    let (size, pad) = elem_pad(dt);
    let bc = if matches!(dt, DType::F32) { 32 } else { 64 };
    let (br, ld, ldp) = (forward_rows(dt), dp + pad, bc + pad);
    ((br + 2 * bc) * ld + br * ldp) * size
}

// Every tile fits the 163 KB a block may have on compute capability 8.0, the oldest GPU the
// kernels load on.
const _: () = {
    let dts = [DType::F32, DType::BF16, DType::F16];
    let mut i = 0;
    while i < 9 {
        let (dt, dp) = (dts[i / 3], 32 << (i % 3));
        assert!(forward_smem(dt, dp) <= 163 * 1024 && backward_smem(dt, dp) <= 163 * 1024);
        i += 1;
    }
};

/// Key rows per backward block.
const fn backward_keys(dt: DType) -> usize {
    16 * warps(dt)
}

/// Shared memory of the backward kernel (`bwd_impl`'s tiles).
const fn backward_smem(dt: DType, dp: usize) -> usize {
    let (size, pad) = elem_pad(dt);
    let (bc, br) = (backward_keys(dt), if dp >= 128 { 32 } else { 64 });
    let (ld, ldt) = (dp + pad, br + pad);
    ((2 * bc + 2 * br) * ld + 2 * bc * ldt) * size + 2 * br * 4
}

/// The storage's device pointer (its element 0), kept valid while `guards` lives.
fn ptr<'a>(
    s: &'a CudaStorage,
    stream: &'a CudaStream,
    guards: &mut Vec<SyncOnDrop<'a>>,
) -> Result<u64> {
    let (p, guard) = match &s.slice {
        CudaStorageSlice::F32(x) => x.device_ptr(stream),
        CudaStorageSlice::BF16(x) => x.device_ptr(stream),
        CudaStorageSlice::F16(x) => x.device_ptr(stream),
        _ => candle::bail!("{OP}: dtype {:?} is not supported", s.dtype()),
    };
    guards.push(guard);
    Ok(p)
}

/// Whether every row of the operands starts on 16 bytes and holds whole 16-byte vectors.
fn vectorizable(dt: DType, d: usize, ptrs: &[u64], maps: &[RowMap]) -> bool {
    let vw = if dt == DType::F32 { 4 } else { 8 };
    d.is_multiple_of(vw)
        && ptrs.iter().all(|p| p % 16 == 0)
        && maps.iter().all(|m| {
            [m.off, m.sb, m.sh, m.si]
                .iter()
                .all(|x| x.is_multiple_of(vw))
        })
}

/// The parameters every kernel shares.
fn base_params(g: &Geom, causal_offset: CausalOffset, dropout: Option<&DropoutMask>) -> Params {
    let (drop_key, drop_threshold, drop_offset, drop_scale) = match dropout {
        Some(m) => m.parts(),
        None => (0, 0, 0, 1.0),
    };
    Params {
        n: g.n as i32,
        h: g.h as i32,
        l: g.l as i32,
        s: g.s as i32,
        d: g.d as i32,
        s_masked: g.s_masked as i32,
        causal: i32::from(g.causal || causal_offset.is_some()),
        causal_offset: causal_offset.unwrap_or(0) as i64,
        scale: g.scale as f32,
        scale_log2: (g.scale * std::f64::consts::LOG2_E) as f32,
        dropout: i32::from(dropout.is_some()),
        drop_key,
        drop_threshold,
        drop_offset,
        drop_scale: drop_scale as f32,
        ..Default::default()
    }
}

/// Checks that the sizes fit the kernels' 32-bit indices.
fn check_sizes(g: &Geom) -> Result<()> {
    let limit = i32::MAX as usize;
    if [g.n, g.h, g.l, g.s].iter().any(|&x| x > limit) || g.n * g.h * g.l.max(g.s) > limit {
        candle::bail!(
            "{OP}: N={}, H={}, L={}, S={} is over the kernels' 2^31 rows",
            g.n,
            g.h,
            g.l,
            g.s
        )
    }
    Ok(())
}

fn launch(f: &CudaFunction, stream: &CudaStream, p: &Params, cfg: LaunchConfig) -> Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(p);
    // SAFETY: the kernel takes one `Params` by value; every pointer in it is a live
    // allocation of the sizes the row maps and sizes describe (checked by the callers).
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// The parameters of a call on `q`, `k`, `v` with `masks`: sizes, the causal rule, dropout,
/// and the inputs' and masks' pointers (valid while `guards` lives) and row maps.
#[allow(clippy::too_many_arguments)]
fn inputs_params<'a>(
    g: &Geom,
    causal_offset: CausalOffset,
    dropout: Option<&DropoutMask>,
    (q, k, v): (Operand<'a>, Operand<'a>, Operand<'a>),
    masks: CudaMasks<'a>,
    stream: &'a CudaStream,
    guards: &mut Vec<SyncOnDrop<'a>>,
) -> Result<Params> {
    check_sizes(g)?;
    let mut p = base_params(g, causal_offset, dropout);
    p.q = ptr(q.storage, stream, guards)?;
    p.k = ptr(k.storage, stream, guards)?;
    p.v = ptr(v.storage, stream, guards)?;
    (p.mq, p.mk, p.mv) = (q.map.into(), k.map.into(), v.map.into());
    if let Some((s, off, per_head)) = masks.attn {
        p.attn = ptr(s, stream, guards)? + 4 * off as u64;
        p.attn_bh_stride = if per_head {
            (g.l * g.s_masked) as i64
        } else {
            0
        };
    }
    if let Some((s, off)) = masks.kpm {
        p.kpm = ptr(s, stream, guards)? + 4 * off as u64;
    }
    Ok(p)
}

/// The forward pass: `out` rows get softmax(scale·q·kᵀ + masks)·v (dropped as `dropout`
/// says), `lse` `(N, H, L)` f32 the row log-sum-exp (`+inf` for a row with every key masked,
/// whose output is zero).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    g: &Geom,
    causal_offset: CausalOffset,
    (q, k, v): (Operand, Operand, Operand),
    masks: CudaMasks,
    dropout: Option<&DropoutMask>,
    out: Operand,
    lse: &CudaStorage,
) -> Result<()> {
    let dt = q.storage.dtype();
    let dp = padded_head_dim(g.d)?;
    let dev = &q.storage.device;
    let stream = dev.cuda_stream();
    let mut guards = Vec::new();
    let mut p = inputs_params(
        g,
        causal_offset,
        dropout,
        (q, k, v),
        masks,
        &stream,
        &mut guards,
    )?;
    p.o = ptr(out.storage, &stream, &mut guards)?;
    p.lse = ptr(lse, &stream, &mut guards)?;
    p.mo = out.map.into();
    p.vec = i32::from(vectorizable(
        dt,
        g.d,
        &[p.q, p.k, p.v],
        &[q.map, k.map, v.map],
    ));
    let smem = forward_smem(dt, dp);
    let f = function(dev, &format!("fa_fwd_{}_{dp}", dtype_name(dt)?), smem)?;
    let blocks = g.n * g.h * g.l.div_ceil(forward_rows(dt));
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (32 * warps(dt) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    if blocks == 0 {
        return Ok(());
    }
    launch(&f, &stream, &p, cfg)
}

/// What the backward pass reads besides q, k, v: the forward's output `o`, its gradient
/// `d_out` (both in the forward output's layout) and row log-sum-exp.
pub(crate) struct Saved<'a> {
    pub o: Operand<'a>,
    pub d_out: Operand<'a>,
    pub lse: &'a CudaStorage,
}

/// The backward pass: writes every element of `dq`, `dk`, `dv` (they may be parts of one
/// buffer), from the forward's inputs and [`Saved`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    g: &Geom,
    (q, k, v): (Operand, Operand, Operand),
    saved: Saved,
    masks: CudaMasks,
    dropout: Option<&DropoutMask>,
    (dq, dk, dv): (Operand, Operand, Operand),
) -> Result<()> {
    let dt = q.storage.dtype();
    let dp = padded_head_dim(g.d)?;
    let dev = &q.storage.device;
    let stream = dev.cuda_stream();
    let rows = g.n * g.h * g.l;
    let dq_acc = dev.alloc_zeros::<f32>(rows * g.d)?;
    let dsum = dev.alloc_zeros::<f32>(rows)?;
    let mut guards = Vec::new();
    let mut p = inputs_params(g, None, dropout, (q, k, v), masks, &stream, &mut guards)?;
    p.o = ptr(saved.o.storage, &stream, &mut guards)?;
    p.dout = ptr(saved.d_out.storage, &stream, &mut guards)?;
    p.lse = ptr(saved.lse, &stream, &mut guards)?;
    p.dq = ptr(dq.storage, &stream, &mut guards)?;
    p.dk = ptr(dk.storage, &stream, &mut guards)?;
    p.dv = ptr(dv.storage, &stream, &mut guards)?;
    let (acc_ptr, acc_guard) = dq_acc.device_ptr(&stream);
    let (dsum_ptr, dsum_guard) = dsum.device_ptr(&stream);
    (p.dq_acc, p.dsum) = (acc_ptr, dsum_ptr);
    (p.mo, p.mdo) = (saved.o.map.into(), saved.d_out.map.into());
    (p.mdq, p.mdk, p.mdv) = (dq.map.into(), dk.map.into(), dv.map.into());
    // The tiles the main kernel loads: q, k, v and the output gradient.
    let maps = [q.map, k.map, v.map, saved.d_out.map];
    p.vec = i32::from(vectorizable(dt, g.d, &[p.q, p.k, p.v, p.dout], &maps));
    let name = dtype_name(dt)?;

    // No queries (L = 0): only the main kernel runs, writing zero dK and dV.
    if rows > 0 {
        let pre = function(dev, &format!("fa_bwd_pre_{name}"), 0)?;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(&pre, &stream, &p, cfg)?;
    }

    let smem = backward_smem(dt, dp);
    let main = function(dev, &format!("fa_bwd_{name}_{dp}"), smem)?;
    let blocks = g.n * g.h * g.s.div_ceil(backward_keys(dt));
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (32 * warps(dt) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    if blocks > 0 {
        launch(&main, &stream, &p, cfg)?;
    }

    if rows * g.d > 0 {
        let post = function(dev, &format!("fa_bwd_dq_{name}"), 0)?;
        let cfg = LaunchConfig {
            grid_dim: ((rows * g.d).div_ceil(256).min(1 << 16) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(&post, &stream, &p, cfg)?;
    }
    drop((acc_guard, dsum_guard));
    Ok(())
}
