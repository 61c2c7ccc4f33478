//! `x Wᵀ` with a frozen weight, as a candle custom op whose backward returns only the input
//! gradient `g W`. candle's own matmul backward also computes the weight's gradient, which
//! nothing here uses: for SmolLM2 that is every projection and the 49k × 576 head on every
//! step, about a third of the backward's work.

use candle_core::{CpuStorage, CustomOp1, Device, Error, Layout, Shape, Tensor};

use super::DistillError;

/// The op; holds the frozen `W [out, in]` (a shared handle, not a copy).
struct FrozenLinear {
    weight: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| Error::Msg("frozen linear: non-contiguous input".to_owned()))?;
        let x = Tensor::from_slice(
            &storage.as_slice::<f32>()?[start..end],
            layout.shape(),
            &Device::Cpu,
        )?;
        let y = x.matmul(&self.weight.t()?)?;
        let shape = y.shape().clone();
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1::<f32>()?), shape))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.matmul(&self.weight)?))
    }
}

/// `x Wᵀ` for `x [T, in]` and a frozen `W [out, in]`; differentiable in `x` only.
pub(crate) fn frozen_linear(x: &Tensor, weight: &Tensor) -> Result<Tensor, DistillError> {
    let op = FrozenLinear {
        weight: weight.clone(),
    };
    Ok(x.contiguous()?.apply_op1(op)?)
}
