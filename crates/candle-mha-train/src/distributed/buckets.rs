//! [`GradientBuckets`]: the gradient all-reduce of a data-parallel step. The gradients are
//! flattened in the optimizer's fixed order of variables into buckets of about
//! [`DEFAULT_BUCKET_BYTES`], and the buckets are all-reduced one after the other in that
//! order, so the sums do not depend on which gradient was ready first (PyTorch's DDP reduces
//! buckets as the backward pass fills them; here the backward pass is over before the first
//! all-reduce, so nothing is lost by a fixed order).

use candle::backprop::GradStore;
use candle::{DType, Result, Tensor, Var};

use super::Communicator;

/// The bucket size: 4 MiB (a million f32), large enough that the per-call latency of an
/// all-reduce is small against its transfer, small enough that a bucket's flat copy is not a
/// second model in memory.
pub const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

/// Consecutive variables (in the optimizer's order) grouped into buckets of one dtype and at
/// most `bucket_bytes` (a larger variable is a bucket of its own).
///
/// PyTorch equivalent: the gradient buckets of `DistributedDataParallel(bucket_cap_mb=...)`.
#[derive(Clone, Debug)]
pub struct GradientBuckets {
    /// For each bucket, the indices of its variables.
    buckets: Vec<Vec<usize>>,
    /// Bytes of one all-reduce of every bucket.
    bytes: usize,
}

impl GradientBuckets {
    /// The buckets of `vars` (in this order); errors on `bucket_bytes == 0`.
    pub fn new(vars: &[Var], bucket_bytes: usize) -> Result<Self> {
        if bucket_bytes == 0 {
            candle::bail!("gradient buckets: bucket_bytes must be at least 1, got 0")
        }
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let (mut size, mut dtype, mut bytes) = (0usize, None::<DType>, 0usize);
        for (i, v) in vars.iter().enumerate() {
            let b = v.elem_count() * v.dtype().size_in_bytes();
            bytes += b;
            let fits = size + b <= bucket_bytes && dtype == Some(v.dtype());
            match buckets.last_mut() {
                Some(last) if fits => {
                    last.push(i);
                    size += b;
                }
                _ => {
                    buckets.push(vec![i]);
                    size = b;
                    dtype = Some(v.dtype());
                }
            }
        }
        Ok(Self { buckets, bytes })
    }

    /// The number of buckets (all-reduce calls per step).
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether there is no variable.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The bytes each rank sends into the all-reduces of one step: every gradient once (4 ×
    /// parameters in f32, 8 × in f64).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Replaces the gradient of every variable in `grads` by its sum over all ranks (a
    /// variable without a gradient on this rank counts as zeros). `vars` must be those the
    /// buckets were made from; `step` names the collectives in a timeout's message.
    ///
    /// PyTorch equivalent: DDP's gradient all-reduce hooks, with the division by the world
    /// size left out (each rank's loss is already divided by the global token count).
    pub fn all_reduce(
        &self,
        comm: &dyn Communicator,
        vars: &[Var],
        grads: &mut GradStore,
        step: u64,
    ) -> Result<()> {
        let n = self.buckets.len();
        for (b, bucket) in self.buckets.iter().enumerate() {
            let mut parts = Vec::with_capacity(bucket.len());
            for &i in bucket {
                let v = vars.get(i).ok_or_else(|| {
                    candle::Error::Msg(format!(
                        "gradient buckets: variable {i} missing ({} given)",
                        vars.len()
                    ))
                })?;
                let part = match grads.get(v.as_tensor()) {
                    Some(g) => g.detach().flatten_all()?.to_dtype(v.dtype())?,
                    None => Tensor::zeros(v.elem_count(), v.dtype(), v.device())?,
                };
                parts.push(part);
            }
            let flat = Tensor::cat(&parts, 0)?;
            let what = format!(
                "step {step}: all-reduce of gradient bucket {} of {n}",
                b + 1
            );
            let sum = comm.all_reduce_sum(&flat, &what)?;
            let mut offset = 0;
            for &i in bucket {
                let v = &vars[i];
                let g = sum.narrow(0, offset, v.elem_count())?.reshape(v.shape())?;
                offset += v.elem_count();
                grads.insert(v.as_tensor(), g);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle::Device;

    use super::super::SingleProcess;
    use super::*;

    #[test]
    fn buckets_keep_the_order_and_the_size_limit() -> Result<()> {
        let dev = Device::Cpu;
        let sizes = [10usize, 300, 20, 20, 5];
        let vars: Vec<Var> = sizes
            .iter()
            .map(|&n| Var::zeros(n, DType::F32, &dev))
            .collect::<Result<_>>()?;
        // 4-byte floats, 160-byte buckets: [10] [300] [20, 20] [5]... 20 + 20 = 40 floats.
        let b = GradientBuckets::new(&vars, 160)?;
        assert_eq!(b.buckets, vec![vec![0], vec![1], vec![2, 3], vec![4]]);
        assert_eq!(b.bytes(), 4 * sizes.iter().sum::<usize>());
        assert!(GradientBuckets::new(&vars, 0).is_err());

        // One rank: the sum is the gradient itself; a missing gradient becomes zeros.
        let x = vars[2].as_tensor().sum_all()?;
        let mut grads = x.backward()?;
        b.all_reduce(&SingleProcess, &vars, &mut grads, 1)?;
        assert_eq!(
            grads.get(vars[2].as_tensor()).unwrap().to_vec1::<f32>()?,
            vec![1.0; 20]
        );
        assert_eq!(
            grads.get(vars[4].as_tensor()).unwrap().to_vec1::<f32>()?,
            vec![0.0; 5]
        );
        Ok(())
    }
}
