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
mod kv_checks;
mod kv_transfer;
mod latent;
mod linear;
#[cfg(test)]
mod test_geometry;

use crate::sampling::{sample_host_rows, select_host_rows, RowOutcome, RowSamplingParams};
use crate::{
    AttentionDims, Backend, BackendError, BatchMeta, HeadSpan, HostTensor, KeyScoreKind,
    KvCacheSpec, KvRows, LatentFactors, RopeSpec, RopeStyle, WindowScoreSpec,
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

/// f32 CPU backend. Tensors are [`HostTensor`]s, so "upload" is a copy.
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

impl Backend for CpuBackend {
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

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CpuKvCache, BackendError> {
        if spec.layout.dtype() != starling_kv::CacheDtype::F32 {
            return Err(BackendError::Shape(format!(
                "the CPU backend caches f32, not {:?}",
                spec.layout.dtype()
            )));
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
        cache.write(qkv, dims, &batch.slot_mapping)
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

    fn reconstruct_kv(
        &self,
        latent: &CpuKvCache,
        factors: &LatentFactors<'_, HostTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        block_table: &[u32],
        len_tokens: usize,
        dense: &mut CpuKvCache,
        dense_table: &[u32],
    ) -> Result<(), BackendError> {
        latent::reconstruct_kv(
            latent,
            factors,
            dims,
            rope,
            block_table,
            len_tokens,
            dense,
            dense_table,
        )
    }

    fn compact_kv(
        &self,
        cache: &mut CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), BackendError> {
        compact::compact_kv(
            cache,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        )
    }

    fn read_keys(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, BackendError> {
        compact::read_keys(cache, block_table, block_size_tokens, len_tokens)
    }

    fn copy_kv_blocks(
        &self,
        cache: &mut CpuKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        kv_transfer::copy_kv_blocks(cache, pairs)
    }

    fn gather_kv(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<KvRows<HostTensor>, BackendError> {
        kv_transfer::gather_kv(cache, block_table, block_size_tokens, len_tokens)
    }

    fn scatter_kv(
        &self,
        cache: &mut CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        rows: &KvRows<HostTensor>,
    ) -> Result<(), BackendError> {
        kv_transfer::scatter_kv(cache, block_table, block_size_tokens, rows)
    }

    fn key_scores(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<HostTensor, BackendError> {
        key_scores::key_scores(cache, block_table, block_size_tokens, len_tokens, kind)
    }

    fn window_scores(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        queries: &HostTensor,
        spec: &WindowScoreSpec,
    ) -> Result<HostTensor, BackendError> {
        key_scores::window_scores(
            cache,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            spec,
        )
    }
}

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
