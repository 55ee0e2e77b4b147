//! The `CustomOp2`/`CustomOp3` pair of a CPU op on `x`, a weight and an optional bias
//! (candle has one trait per arity, so each such op implements both: without and with the
//! bias).

/// `CustomOp2` (no bias) and `CustomOp3` (with the bias, named `"{name}-bias"`) for an op on
/// `x`, a weight and an optional bias, from its inherent `fwd(x, w, b)` (each a storage and
/// layout; `b` an `Option`) and `bwd(x, w, res, grad, bias)` (the gradients of x, the weight
/// and, with `bias`, the bias).
macro_rules! op_with_optional_bias {
    ($ty:ty, $name:literal) => {
        impl candle::CustomOp2 for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &candle::CpuStorage,
                l1: &candle::Layout,
                s2: &candle::CpuStorage,
                l2: &candle::Layout,
            ) -> candle::Result<(candle::CpuStorage, candle::Shape)> {
                self.fwd((s1, l1), (s2, l2), None)
            }

            fn bwd(
                &self,
                x: &candle::Tensor,
                w: &candle::Tensor,
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<(Option<candle::Tensor>, Option<candle::Tensor>)> {
                let mut g = self.bwd(x, w, res, grad, false)?.into_iter();
                Ok((g.next(), g.next()))
            }
        }

        impl candle::CustomOp3 for $ty {
            fn name(&self) -> &'static str {
                concat!($name, "-bias")
            }

            fn cpu_fwd(
                &self,
                s1: &candle::CpuStorage,
                l1: &candle::Layout,
                s2: &candle::CpuStorage,
                l2: &candle::Layout,
                s3: &candle::CpuStorage,
                l3: &candle::Layout,
            ) -> candle::Result<(candle::CpuStorage, candle::Shape)> {
                self.fwd((s1, l1), (s2, l2), Some((s3, l3)))
            }

            fn bwd(
                &self,
                x: &candle::Tensor,
                w: &candle::Tensor,
                _b: &candle::Tensor,
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<(
                Option<candle::Tensor>,
                Option<candle::Tensor>,
                Option<candle::Tensor>,
            )> {
                let mut g = self.bwd(x, w, res, grad, true)?.into_iter();
                Ok((g.next(), g.next(), g.next()))
            }
        }
    };
}
pub(crate) use op_with_optional_bias;
