//! The `CustomOp2`/`CustomOp3` pair of a CPU op on `x`, a weight and an optional bias
//! (candle has one trait per arity, so each such op implements both: without and with the
//! bias), and which of those arguments a backward pass has to give a gradient.

use candle::Tensor;

/// The gradients of `(x, w, b)` the graph uses: an argument that no variable leads to (data
/// input, a frozen weight, a detached tensor) gets none, so its product is not computed and
/// candle does not add it into a fresh zero tensor.
///
/// PyTorch equivalent: `ctx.needs_input_grad` of a custom `autograd.Function`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NeedsGrad {
    pub(crate) x: bool,
    pub(crate) w: bool,
    pub(crate) b: bool,
}

impl NeedsGrad {
    /// From the op's arguments (`b`: `None` when the op has no bias).
    pub(crate) fn of(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Self {
        Self {
            x: x.track_op(),
            w: w.track_op(),
            b: b.is_some_and(Tensor::track_op),
        }
    }
}

/// One argument of a CPU op's forward pass: its storage and layout.
pub(crate) type CpuArg<'a> = (&'a candle::CpuStorage, &'a candle::Layout);

/// The gradients of an op's `N` arguments, `None` where not needed (what [`custom_op!`]'s
/// backward methods return).
pub(crate) type Grads<const N: usize> = [Option<Tensor>; N];

/// The gradients of `(x, w, b)`, `None` where not needed.
pub(crate) type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// `candle::CustomOp1`/`CustomOp2`/`CustomOp3` for a type from its inherent methods, which
/// take the op's arguments as one array (candle's traits spell each argument out):
///
/// - `fwd(&self, [CpuArg; N]) -> Result<(CpuStorage, Shape)>`;
/// - `bwd(&self, [&Tensor; N], res: &Tensor, grad: &Tensor) -> Result<Grads<N>>`;
/// - with `cuda: f`, under the `cuda` feature,
///   `f(&self, [(&CudaStorage, &Layout); N]) -> Result<(CudaStorage, Shape)>`.
///
/// ```ignore
/// custom_op!(CustomOp2 for EmbeddingSum, "embedding-sum", fwd: fwd, bwd: bwd);
/// ```
macro_rules! custom_op {
    (CustomOp1 for $ty:ty, $name:expr, fwd: $fwd:ident, bwd: $bwd:ident $(, cuda: $cuda:ident)?) => {
        $crate::cpu::custom_op!(@impl CustomOp1 $ty, $name, $fwd, $bwd, [$($cuda)?], (s1 l1 a1 d1));
    };
    (CustomOp2 for $ty:ty, $name:expr, fwd: $fwd:ident, bwd: $bwd:ident $(, cuda: $cuda:ident)?) => {
        $crate::cpu::custom_op!(@impl CustomOp2 $ty, $name, $fwd, $bwd, [$($cuda)?],
            (s1 l1 a1 d1) (s2 l2 a2 d2));
    };
    (CustomOp3 for $ty:ty, $name:expr, fwd: $fwd:ident, bwd: $bwd:ident $(, cuda: $cuda:ident)?) => {
        $crate::cpu::custom_op!(@impl CustomOp3 $ty, $name, $fwd, $bwd, [$($cuda)?],
            (s1 l1 a1 d1) (s2 l2 a2 d2) (s3 l3 a3 d3));
    };
    (@impl $trait:ident $ty:ty, $name:expr, $fwd:ident, $bwd:ident, [$($cuda:ident)?],
        $(($s:ident $l:ident $a:ident $d:ident))+) => {
        impl candle::$trait for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                $($s: &candle::CpuStorage, $l: &candle::Layout),+
            ) -> candle::Result<(candle::CpuStorage, candle::Shape)> {
                self.$fwd([$(($s, $l)),+])
            }

            $crate::cpu::custom_op!(@cuda [$($cuda)?] $(($s $l))+);

            // One argument: `(T)` is `T`.
            #[allow(unused_parens)]
            fn bwd(
                &self,
                $($a: &candle::Tensor,)+
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<($($crate::cpu::custom_op!(@grad $d)),+)> {
                let [$($d),+] = self.$bwd([$($a),+], res, grad)?;
                Ok(($($d),+))
            }
        }
    };
    (@grad $d:ident) => { Option<candle::Tensor> };
    (@cuda [] $(($s:ident $l:ident))+) => {};
    (@cuda [$cuda:ident] $(($s:ident $l:ident))+) => {
        #[cfg(feature = "cuda")]
        fn cuda_fwd(
            &self,
            $($s: &candle::CudaStorage, $l: &candle::Layout),+
        ) -> candle::Result<(candle::CudaStorage, candle::Shape)> {
            self.$cuda([$(($s, $l)),+])
        }
    };
}
pub(crate) use custom_op;

/// `CustomOp2` (no bias) and `CustomOp3` (with the bias, named `"{name}-bias"`) for an op on
/// `x`, a weight and an optional bias, from its inherent `fwd(x, w, b)` (each a [`CpuArg`];
/// `b` an `Option`) and `bwd([x, w, res, grad], needs: NeedsGrad) -> Result<Grads3>`.
macro_rules! op_with_optional_bias {
    ($ty:ty, $name:literal) => {
        impl $ty {
            fn fwd_no_bias(
                &self,
                [x, w]: [$crate::cpu::CpuArg; 2],
            ) -> candle::Result<(candle::CpuStorage, candle::Shape)> {
                self.fwd(x, w, None)
            }

            fn fwd_bias(
                &self,
                [x, w, b]: [$crate::cpu::CpuArg; 3],
            ) -> candle::Result<(candle::CpuStorage, candle::Shape)> {
                self.fwd(x, w, Some(b))
            }

            fn bwd_no_bias(
                &self,
                [x, w]: [&candle::Tensor; 2],
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<$crate::cpu::Grads<2>> {
                let needs = $crate::cpu::NeedsGrad::of(x, w, None);
                let (dx, dw, _) = self.bwd([x, w, res, grad], needs)?;
                Ok([dx, dw])
            }

            fn bwd_bias(
                &self,
                [x, w, b]: [&candle::Tensor; 3],
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<$crate::cpu::Grads<3>> {
                let needs = $crate::cpu::NeedsGrad::of(x, w, Some(b));
                let (dx, dw, db) = self.bwd([x, w, res, grad], needs)?;
                Ok([dx, dw, db])
            }
        }

        $crate::cpu::custom_op!(CustomOp2 for $ty, $name, fwd: fwd_no_bias, bwd: bwd_no_bias);
        $crate::cpu::custom_op!(CustomOp3 for $ty, concat!($name, "-bias"),
            fwd: fwd_bias, bwd: bwd_bias);
    };
}
pub(crate) use op_with_optional_bias;
