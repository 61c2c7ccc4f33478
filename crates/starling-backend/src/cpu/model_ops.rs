//! The CPU reference of the forward-pass ops ([`ModelOps`]).

use super::{attention, elementwise, head_norm, latent, linear, CpuBackend, CpuKvCache};
use crate::{
    AttentionDims, BackendError, BatchMeta, HeadSpan, HostTensor, LatentFactors, ModelOps, RopeSpec,
};

impl ModelOps for CpuBackend {
    fn embedding(&self, table: &HostTensor, ids: &[u32]) -> Result<HostTensor, BackendError> {
        elementwise::embedding(table, ids)
    }

    fn linear(
        &self,
        x: &HostTensor,
        w: &HostTensor,
        bias: Option<&HostTensor>,
    ) -> Result<HostTensor, BackendError> {
        linear::linear(x, w, bias)
    }

    fn logits(&self, x: &HostTensor, w: &HostTensor) -> Result<HostTensor, BackendError> {
        linear::linear(x, w, None)
    }

    fn rms_norm(
        &self,
        x: &HostTensor,
        w: &HostTensor,
        eps: f32,
    ) -> Result<HostTensor, BackendError> {
        elementwise::rms_norm(x, w, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut HostTensor,
        delta: &HostTensor,
        w: &HostTensor,
        eps: f32,
    ) -> Result<HostTensor, BackendError> {
        elementwise::add_inplace(residual, delta)?;
        elementwise::rms_norm(residual, w, eps)
    }

    fn rms_norm_heads(
        &self,
        x: &mut HostTensor,
        w: &HostTensor,
        span: HeadSpan,
        eps: f32,
    ) -> Result<(), BackendError> {
        head_norm::rms_norm_heads(x, w, span, eps)
    }

    fn add_inplace(&self, x: &mut HostTensor, delta: &HostTensor) -> Result<(), BackendError> {
        elementwise::add_inplace(x, delta)
    }

    fn silu_mul(&self, gate_up: &HostTensor) -> Result<HostTensor, BackendError> {
        elementwise::silu_mul(gate_up)
    }

    fn gelu_tanh_mul(&self, gate_up: &HostTensor) -> Result<HostTensor, BackendError> {
        elementwise::gelu_tanh_mul(gate_up)
    }

    fn scale_inplace(&self, x: &mut HostTensor, factor: f32) -> Result<(), BackendError> {
        x.data_mut().iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn gather_rows(&self, x: &HostTensor, rows: &[u32]) -> Result<HostTensor, BackendError> {
        elementwise::gather_rows(x, rows)
    }

    fn rope_qk(
        &self,
        qkv: &mut HostTensor,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &BatchMeta,
    ) -> Result<(), BackendError> {
        elementwise::rope_qk(qkv, dims, rope, &batch.positions)
    }

    fn write_kv(
        &self,
        cache: &mut CpuKvCache,
        qkv: &HostTensor,
        dims: &AttentionDims,
        batch: &BatchMeta,
    ) -> Result<(), BackendError> {
        cache.write(qkv, dims, batch.group_slot_mapping(dims.cache_group)?)
    }

    fn paged_attention(
        &self,
        qkv: &HostTensor,
        cache: &CpuKvCache,
        dims: &AttentionDims,
        batch: &BatchMeta,
    ) -> Result<HostTensor, BackendError> {
        attention::paged_attention(qkv, cache, dims, batch)
    }

    fn rope_q_write_latents(
        &self,
        qkv: &mut HostTensor,
        cache: &mut CpuKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &BatchMeta,
    ) -> Result<(), BackendError> {
        latent::rope_q_write_latents(qkv, cache, dims, rope, batch)
    }

    fn latent_attention(
        &self,
        qkv: &HostTensor,
        cache: &CpuKvCache,
        factors: &LatentFactors<'_, HostTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &BatchMeta,
    ) -> Result<HostTensor, BackendError> {
        latent::latent_attention(qkv, cache, factors, dims, rope, batch)
    }
}
