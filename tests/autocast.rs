//! `autocast(Precision::Bf16, ..)`: the large CPU products take bf16 operands with f32 sums,
//! forward and backward, against f64 products of operands that candle itself rounded to bf16
//! (`to_dtype(BF16)`); nothing changes outside the scope or on other threads.

use candle::{DType, Device, Module, Tensor, Var};
use candle_mha::autocast::{autocast, bf16_products, precision, Precision};
use candle_mha::nn::Linear;
use candle_mha::MultiheadAttentionConfig;
use candle_mha::{seeded_var_builder, AttentionOptions, MultiheadAttention};

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
            ((h >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// `t` rounded to bf16 by candle, in f64.
fn bf16_f64(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
}

fn max_gap(a: &Tensor, b: &Tensor) -> f64 {
    candle_mha_test_support::max_abs_diff(a, b).unwrap()
}

/// A linear layer's output and its three gradients (x, weight, bias) under bf16 autocast are
/// the f64 products of bf16-rounded operands (the output gradient rounded too, as the backward
/// products read it), within f32 rounding of their sums; and they differ from the f32 ones.
#[test]
fn a_linear_layer_forward_and_backward_round_both_operands() {
    let (m, k, n) = (300, 384, 520); // large enough for all threads
    let x = Var::from_tensor(&randn(1, &[3, m / 3, k])).unwrap();
    let w = Var::from_tensor(&randn(2, &[n, k])).unwrap();
    let b = Var::from_tensor(&randn(3, &[n])).unwrap();
    let g = randn(4, &[3, m / 3, n]);
    let layer = Linear::from_weights(w.as_tensor().clone(), Some(b.as_tensor().clone()));
    let before = bf16_products();
    let (y, grads) = autocast(Precision::Bf16, || {
        let y = layer.forward(x.as_tensor()).unwrap();
        let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        (y, grads)
    });
    // The forward product and the two gradient products.
    assert_eq!(bf16_products() - before, 3);
    let (x2, w2, g2) = (
        bf16_f64(&x.flatten_to(1).unwrap()),
        bf16_f64(w.as_tensor()),
        bf16_f64(&g.flatten_to(1).unwrap()),
    );
    let b64 = b.to_dtype(DType::F64).unwrap();
    let want_y = x2
        .matmul(&w2.t().unwrap())
        .unwrap()
        .broadcast_add(&b64)
        .unwrap();
    let want_dx = g2.matmul(&w2).unwrap();
    let want_dw = g2.t().unwrap().matmul(&x2).unwrap();
    let want_db = g.flatten_to(1).unwrap().sum(0).unwrap();
    // Sums of k = 384 products of magnitude ≤ 4: f32's rounding stays below 1e-3.
    let tol = 2e-3;
    let got_y = y.flatten_to(1).unwrap();
    assert!(
        max_gap(&got_y, &want_y) < tol,
        "y: {}",
        max_gap(&got_y, &want_y)
    );
    let got_dx = grads.get(&x).unwrap().flatten_to(1).unwrap();
    assert!(
        max_gap(&got_dx, &want_dx) < tol,
        "dx: {}",
        max_gap(&got_dx, &want_dx)
    );
    let got_dw = grads.get(&w).unwrap();
    assert!(
        max_gap(got_dw, &want_dw) < tol,
        "dw: {}",
        max_gap(got_dw, &want_dw)
    );
    let got_db = grads.get(&b).unwrap();
    assert!(max_gap(got_db, &want_db) < 1e-3, "db");
    // And f32 is not what came out: bf16 keeps 8 bits, so the gaps are far above f32's.
    let exact = layer.forward(x.as_tensor()).unwrap();
    assert!(max_gap(&y, &exact) > 1e-2, "the bf16 output equals f32's");
}

/// Outside the scope, and on another thread while one is inside it, products stay f32.
#[test]
fn the_precision_belongs_to_the_scope_and_its_thread() {
    let x = randn(5, &[128, 256]);
    let layer = Linear::from_weights(randn(6, &[512, 256]), None);
    let exact = layer.forward(&x).unwrap();
    assert_eq!(precision(), Precision::F32);
    autocast(Precision::Bf16, || {
        assert_eq!(precision(), Precision::Bf16);
        let other = std::thread::scope(|s| {
            s.spawn(|| (precision(), layer.forward(&x).unwrap()))
                .join()
                .unwrap()
        });
        assert_eq!(other.0, Precision::F32);
        assert_eq!(max_gap(&other.1, &exact), 0.0);
        let inner = autocast(Precision::F32, || layer.forward(&x).unwrap());
        assert_eq!(max_gap(&inner, &exact), 0.0);
    });
    assert_eq!(precision(), Precision::F32);
    assert_eq!(max_gap(&layer.forward(&x).unwrap(), &exact), 0.0);
}

/// The attention module's training step under autocast sends its projections to bf16 (the
/// packed input projection and the output projection, forward and backward) and stays close
/// to f32's.
#[test]
fn the_attention_modules_projections_take_bf16() {
    let varmap = candle_nn::VarMap::new();
    let vb = seeded_var_builder(&varmap, 7, DType::F32, &Device::Cpu);
    let mha = MultiheadAttention::new(MultiheadAttentionConfig::new(256, 8), vb).unwrap();
    let x = randn(8, &[128, 4, 256]);
    let opts = AttentionOptions::new().with_need_weights(false);
    let exact = mha.forward(&x, &x, &x, &opts).unwrap().output;
    let before = bf16_products();
    let out = autocast(Precision::Bf16, || {
        let out = mha.forward(&x, &x, &x, &opts).unwrap().output;
        out.sum_all().unwrap().backward().unwrap();
        out
    });
    let ran = bf16_products() - before;
    assert!(ran >= 4, "{ran} products in bf16");
    let gap = max_gap(&out, &exact);
    assert!(gap > 0.0 && gap < 0.05, "gap to f32 {gap}");
}

/// Decoding-shaped products (one row against a weight) under autocast: against a variable's
/// bf16 copy and against a plain tensor's f32 rows rounded as read, both the f64 products of
/// rounded operands. The copy is made once per scope (PyTorch's autocast cache): a variable
/// changed inside the scope is read as it was at its first product there, and the next scope
/// reads its new value.
#[test]
fn a_scope_rounds_each_variable_once() {
    let (k, n) = (768, 2304); // large enough for all threads
    let w = Var::from_tensor(&randn(9, &[n, k])).unwrap();
    let kept = Linear::from_weights(w.as_tensor().clone(), None);
    let plain = Linear::from_weights(randn(10, &[n, k]), None);
    let x = randn(11, &[1, k]);
    let want = |w: &Tensor| bf16_f64(&x).matmul(&bf16_f64(w).t().unwrap()).unwrap();
    let tol = 2e-3;
    let w0 = w.as_tensor().copy().unwrap();
    let (first, second, prefill, other) = autocast(Precision::Bf16, || {
        let first = kept.forward(&x).unwrap();
        // Changed in place inside the scope: not seen by the scope's products.
        w.set(&randn(9, &[n, k]).neg().unwrap()).unwrap();
        let second = kept.forward(&x).unwrap();
        let prefill = kept.forward(&randn(13, &[64, k])).unwrap();
        (first, second, prefill, plain.forward(&x).unwrap())
    });
    assert!(max_gap(&first, &want(&w0)) < tol, "first");
    assert_eq!(max_gap(&second, &first), 0.0, "the copy was not reused");
    assert!(max_gap(&other, &want(plain.weight())) < tol, "plain weight");
    let prefill_want = bf16_f64(&randn(13, &[64, k]))
        .matmul(&bf16_f64(&w0).t().unwrap())
        .unwrap();
    assert!(max_gap(&prefill, &prefill_want) < tol, "prefill");
    // A new scope rounds the variable's new value.
    let after = autocast(Precision::Bf16, || kept.forward(&x).unwrap());
    assert!(max_gap(&after, &want(w.as_tensor())) < tol, "next scope");
    assert!(
        max_gap(&after, &first) > 1e-2,
        "the next scope reused the old copy"
    );
}
