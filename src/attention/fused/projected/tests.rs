//! Errors inside the projected self-attention after it took its pooled buffers (a mask of
//! the wrong dtype in the forward pass, a wrong-shaped gradient in the backward pass): the
//! error comes back, and the next good call, on the buffers the failed one returned (filled
//! with NaNs beforehand), gives the results of fresh buffers to the bit.

use candle::{CustomOp3, DType, Device, Result, Tensor, Var};

use super::ProjectedSelfAttention;
use crate::attention::fused::{FusedAttention, Geom};
use crate::cpu::workspace;

const N: usize = 2;
const L: usize = 24;
const H: usize = 2;
const D: usize = 8;
const E: usize = H * D;

fn attn(attn_mask: Option<Tensor>) -> FusedAttention {
    FusedAttention {
        geom: Geom {
            n: N,
            h: H,
            l: L,
            s: L,
            d: D,
            s_masked: L,
            causal: false,
            scale: 1.0 / (D as f64).sqrt(),
            group: 1,
        },
        seq_first: false,
        attn_mask,
        key_padding_mask: None,
        dropout: None,
        lse: Default::default(),
        with_weights: None,
        weights_slot: Default::default(),
    }
}

fn values(shape: &[usize], seed: u64) -> Result<Tensor> {
    let len: usize = shape.iter().product();
    let v: Vec<f32> = (0..len as u64)
        .map(|i| ((i * 2654435761 + seed * 97) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

struct Io {
    x: Tensor,
    w: Tensor,
    b: Tensor,
    grad: Tensor,
}

/// x, w and b are variables: the backward pass gives gradients only to what a variable
/// leads to.
fn io() -> Result<Io> {
    let var = |t: Tensor| Ok::<_, candle::Error>(Var::from_tensor(&t)?.as_tensor().clone());
    Ok(Io {
        x: var(values(&[N, L, E], 1)?)?,
        w: var((values(&[3 * E, E], 2)? * 0.3)?)?,
        b: var(values(&[3 * E], 3)?)?,
        grad: values(&[N, L, E], 4)?,
    })
}

fn bits(ts: &[Tensor]) -> Result<Vec<Vec<u32>>> {
    ts.iter()
        .map(|t| {
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            Ok(v.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

/// Output and the gradients of x, w, b of one good call.
fn good_call(io: &Io) -> Result<Vec<Vec<u32>>> {
    let op = ProjectedSelfAttention::new(attn(None));
    let out = io.x.apply_op3_no_bwd(&io.w, &io.b, &op)?;
    let (dx, dw, db) = CustomOp3::bwd(&op, &io.x, &io.w, &io.b, &out, &io.grad)?;
    let grads = [dx, dw, db].map(|g| g.expect("a gradient"));
    let mut all = vec![out];
    all.extend(grads);
    bits(&all)
}

/// Fills the pool with NaN buffers of this call's sizes.
fn poison(io: &Io) -> Result<()> {
    let nan = Io {
        x: Var::from_tensor(&(io.x.ones_like()? * f64::NAN)?)?
            .as_tensor()
            .clone(),
        w: io.w.clone(),
        b: io.b.clone(),
        grad: (io.grad.ones_like()? * f64::NAN)?,
    };
    good_call(&nan).map(drop)
}

#[test]
fn errors_after_taking_buffers_leave_later_calls_exact() -> Result<()> {
    let io = io()?;
    workspace::release();
    let fresh = good_call(&io)?;

    // Forward: a mask in f64 for an f32 call fails when the kernel reads it, after the
    // projection was written into a pooled buffer.
    poison(&io)?;
    let bad_mask = Tensor::zeros((L, L), DType::F64, &Device::Cpu)?;
    let op = ProjectedSelfAttention::new(attn(Some(bad_mask)));
    let err = io.x.apply_op3_no_bwd(&io.w, &io.b, &op);
    assert!(err.is_err(), "a mask of the wrong dtype must fail");
    assert_eq!(good_call(&io)?, fresh);

    // Backward: a wrong-shaped output gradient fails after the gradient buffer was taken.
    poison(&io)?;
    let op = ProjectedSelfAttention::new(attn(None));
    let out = io.x.apply_op3_no_bwd(&io.w, &io.b, &op)?;
    let wrong = values(&[N, L - 1, E], 5)?;
    let err = CustomOp3::bwd(&op, &io.x, &io.w, &io.b, &out, &wrong);
    assert!(err.is_err(), "a wrong-shaped gradient must fail");
    drop(op);
    assert_eq!(good_call(&io)?, fresh);
    Ok(())
}

/// The path with the output projection as an op of its own (the context and its gradient
/// in pooled buffers): a call after one on NaN inputs (which leaves NaN buffers in the
/// pool) gives the output and every gradient of fresh buffers to the bit.
#[test]
fn output_op_on_reused_buffers_is_exact() -> Result<()> {
    let io = io()?;
    let var = |t: Tensor| Ok::<_, candle::Error>(Var::from_tensor(&t)?.as_tensor().clone());
    let (ow, ob) = (var((values(&[E, E], 6)? * 0.3)?)?, var(values(&[E], 7)?)?);
    let call = |x: &Tensor, r: &Tensor| -> Result<Vec<Vec<u32>>> {
        let (out, _) = super::projected_self_attention_output(
            x,
            (&io.w, Some(&io.b)),
            (&ow, Some(&ob)),
            attn(None),
        )?;
        let grads = (&out * r)?.sum_all()?.backward()?;
        let mut all = vec![out];
        for t in [x, &io.w, &io.b, &ow, &ob] {
            all.push(grads.get(t).expect("a gradient").clone());
        }
        bits(&all)
    };
    workspace::release();
    let fresh = call(&io.x, &io.grad)?;
    // NaN input and output gradient: the context, the projection and both gradients NaN.
    let nan = var((io.x.ones_like()? * f64::NAN)?)?;
    call(&nan, &(io.grad.ones_like()? * f64::NAN)?)?;
    assert_eq!(call(&io.x, &io.grad)?, fresh);
    Ok(())
}
