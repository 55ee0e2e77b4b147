//! `candle_mha::runtime`: building layers leaves the process environment alone (the library
//! has no side effects); the settings a program opts into are candle's own names.

use candle::{DType, Device};
use candle_mha::runtime::{recommended_env, SPIN_LIMIT};
use candle_mha::{seeded_var_builder, MultiheadAttention, MultiheadAttentionConfig};

#[test]
fn building_layers_changes_no_environment_variable() -> anyhow::Result<()> {
    let before: Vec<_> = std::env::vars_os().collect();
    let varmap = candle_nn::VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
    MultiheadAttention::new(MultiheadAttentionConfig::new(8, 2), vb.pp("attn"))?;
    candle_mha::nn::Linear::new(8, 4, true, vb.pp("linear"))?;
    candle_mha::nn::LayerNorm::new(8, 1e-5, vb.pp("norm"))?;
    candle_mha::nn::Embedding::new(10, 8, vb.pp("emb"))?;
    let after: Vec<_> = std::env::vars_os().collect();
    assert_eq!(before, after, "a constructor changed the environment");
    Ok(())
}

/// candle's spin limit, and with `mkl` Intel OpenMP's blocktime: nothing where it is not linked.
#[test]
fn the_recommended_environment_is_candles_spin_limit_and_with_mkl_the_blocktime() {
    let mut want = vec![("CANDLE_BARRIER_POOL_SPIN_LIMIT", SPIN_LIMIT.to_string())];
    if cfg!(feature = "mkl") {
        want.push(("KMP_BLOCKTIME", "0".to_string()));
    }
    assert_eq!(recommended_env(), want);
}
