//! The CPU backend: f32 everywhere, rayon for parallelism, the `gemm` crate for matrix products.
//!
//! It is the numerical reference for every accelerated backend: each CUDA kernel is tested against
//! the function here that does the same job.

mod attention;
mod compact;
mod elementwise;
mod head_norm;
mod key_scores;
mod kv_cache;
mod kv_cache_ops;
mod kv_checks;
mod kv_transfer;
mod latent;
mod linear;
mod model_ops;
#[cfg(test)]
mod test_geometry;

use crate::sampling::{sample_host_rows, select_host_rows, RowOutcome, RowSamplingParams};
use crate::{
    BackendCore, BackendError, BatchMeta, DeviceSampling, GraphCapture, HostTensor, KvCacheSpec,
    RopeStyle,
};

pub use attention::dense_causal_attention;
pub use compact::{compact_kv, read_keys};
pub use head_norm::{check_head_span, rms_norm_heads};
pub use key_scores::{key_scores, window_scores};
pub use kv_cache::CpuKvCache;
pub use kv_checks::{
    check_block_copies, check_block_table, check_compaction, check_distinct_blocks,
    check_window_scores, kept_count, physical_slots, scatter_len,
};
pub use kv_transfer::{copy_kv_blocks, gather_kv, scatter_kv};
pub use latent::{latent_attention, reconstruct_kv, rope_q_write_latents};

/// f32 CPU backend. Tensors are [`HostTensor`]s, so "upload" is a copy. Each op trait's
/// implementation sits with its concern: [`BackendCore`] and [`DeviceSampling`] here, the
/// forward pass in `model_ops.rs`, cache management in `kv_cache_ops.rs`.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// A CPU backend using rayon's global thread pool.
    pub fn new() -> Self {
        Self
    }
}

/// Checks that `t` is a matrix and returns `(rows, cols)`; 1-D tensors count as one row.
pub(crate) fn matrix_dims(t: &HostTensor, what: &str) -> Result<(usize, usize), BackendError> {
    match t.shape() {
        [n] => Ok((1, *n)),
        [r, c] => Ok((*r, *c)),
        s => Err(BackendError::Shape(format!(
            "{what}: expected a matrix, got shape {s:?}"
        ))),
    }
}

impl BackendCore for CpuBackend {
    type Tensor = HostTensor;

    type KvCache = CpuKvCache;

    type Batch = BatchMeta;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn kv_cache_dtype(&self) -> starling_kv::CacheDtype {
        starling_kv::CacheDtype::F32
    }

    fn upload(&self, host: &HostTensor) -> Result<HostTensor, BackendError> {
        Ok(host.clone())
    }

    fn upload_owned(&self, host: HostTensor) -> Result<HostTensor, BackendError> {
        Ok(host)
    }

    fn to_host(&self, t: &HostTensor) -> Result<HostTensor, BackendError> {
        Ok(t.clone())
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CpuKvCache, BackendError> {
        use starling_kv::CacheDtype;
        match (&spec.layout, spec.layout.dtype()) {
            (_, CacheDtype::F32) => {}
            // fp8 full K/V and fp8 STAR-KV latents: e4m3-rounded values in f32 slots
            // (`CpuKvCache::set_slot`); a latent layer's positions stay exact.
            (_, CacheDtype::Fp8) => {}
            // int8 with a scale per vector and int4 with a scale per group of 32: the
            // dequantised values in f32 slots, likewise.
            (_, CacheDtype::Int8 | CacheDtype::Int4) => {}
            (_, dtype) => {
                return Err(BackendError::Shape(format!(
                    "the CPU backend caches f32 (and fp8, int8, int4), not {dtype:?} for {:?}",
                    spec.layout
                )))
            }
        }
        CpuKvCache::new(spec.clone())
    }

    fn prepare_batch(
        &self,
        meta: &BatchMeta,
        num_cache_blocks: usize,
    ) -> Result<BatchMeta, BackendError> {
        meta.validate(num_cache_blocks)?;
        Ok(meta.clone())
    }
}

impl DeviceSampling for CpuBackend {
    fn sample_rows(
        &self,
        logits: &HostTensor,
        rows: &[RowSamplingParams],
    ) -> Result<Vec<RowOutcome>, BackendError> {
        sample_host_rows(logits, rows)
    }

    fn logits_rows_to_host(
        &self,
        logits: &HostTensor,
        rows: &[u32],
    ) -> Result<HostTensor, BackendError> {
        select_host_rows(logits, rows)
    }
}

/// No recorded steps: every CPU step runs eagerly.
impl GraphCapture for CpuBackend {}

/// Applies rotary embedding to one head vector at `position` (the CPU reference for RoPE kernels).
pub fn rope_head(head: &mut [f32], position: u32, inv_freqs: &[f32], style: RopeStyle) {
    let half = head.len() / 2;
    for (i, &inv_freq) in inv_freqs.iter().enumerate().take(half) {
        // f32 product then f32 cos/sin, as HF computes its rotary tables.
        let angle = position as f32 * inv_freq;
        let (sin, cos) = angle.sin_cos();
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}
