//! [`SingleProcess`]: the communicator of a run in one process.

use candle::{Result, Tensor};

use super::{check_flat, Communicator};

/// One rank: every collective returns its input. A run with it is today's single-process
/// `mha train`, bit for bit.
///
/// PyTorch equivalent: training without `torch.distributed` (or a world of one).
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn backend(&self) -> &'static str {
        "single"
    }

    fn all_reduce_sum(&self, flat: &Tensor, _what: &str) -> Result<Tensor> {
        check_flat(flat, "all_reduce_sum")?;
        Ok(flat.clone())
    }

    fn all_reduce_sum_f64(&self, _values: &mut [f64], _what: &str) -> Result<()> {
        Ok(())
    }

    fn broadcast(&self, flat: &Tensor, root: usize, _what: &str) -> Result<Tensor> {
        check_flat(flat, "broadcast")?;
        if root != 0 {
            candle::bail!("broadcast: root rank {root} is not in a world of 1 rank")
        }
        Ok(flat.clone())
    }

    fn barrier(&self, _what: &str) -> Result<()> {
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}
