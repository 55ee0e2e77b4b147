//! `candle_mha::threads`: building a layer sets candle's element-wise spin limit when the user
//! has not, and never overrides a value the user set. One test function: the environment is
//! process-wide.

use candle::{DType, Device};
use candle_mha::threads::{tune_candle_threads, BARRIER_SPIN_ENV, BARRIER_SPIN_LIMIT};
use candle_mha::{seeded_var_builder, MultiheadAttention, MultiheadAttentionConfig};

#[test]
fn building_a_module_sets_the_spin_limit_once_and_only_when_unset() -> anyhow::Result<()> {
    assert!(
        std::env::var_os(BARRIER_SPIN_ENV).is_none(),
        "run without {BARRIER_SPIN_ENV} set"
    );
    let varmap = candle_nn::VarMap::new();
    let vb = seeded_var_builder(&varmap, 0, DType::F32, &Device::Cpu);
    MultiheadAttention::new(MultiheadAttentionConfig::new(8, 2), vb.pp("attn"))?;
    assert_eq!(
        std::env::var(BARRIER_SPIN_ENV)?,
        BARRIER_SPIN_LIMIT.to_string(),
        "MultiheadAttention::new did not set the limit"
    );
    // Once set, the crate leaves the variable alone: a user's own value stays.
    std::env::set_var(BARRIER_SPIN_ENV, "25000");
    assert!(!tune_candle_threads());
    MultiheadAttention::new(MultiheadAttentionConfig::new(8, 2), vb.pp("attn2"))?;
    assert_eq!(std::env::var(BARRIER_SPIN_ENV)?, "25000");
    Ok(())
}
