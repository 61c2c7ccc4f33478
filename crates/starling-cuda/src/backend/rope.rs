//! RoPE on the GPU (kernels in `kernels/ops.cu`): Q and K rotated in place, or rotated with the
//! K/V write fused into the same launch, from a frequency table uploaded once.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig};
use starling_backend::{AttentionDims, BackendError, RopeSpec, RopeStyle};

use super::{err, CudaBackend, CudaBatch, CudaKvCache};
use crate::{CudaError, CudaTensor};

/// The `(rows, width)` of a fused QKV tensor RoPE can rotate for `batch`: the QKV width, one row
/// per batch token, and a frequency per pair of a head.
fn rope_rows(
    qkv: &CudaTensor,
    dims: &AttentionDims,
    rope: &RopeSpec,
    batch: &CudaBatch,
) -> Result<(usize, usize), BackendError> {
    let (n, width) = qkv.matrix_dims().map_err(err)?;
    if width != dims.qkv_size()
        || n != batch.meta.num_tokens()
        || rope.inv_freqs.len() * 2 != dims.head_dim
    {
        return Err(BackendError::Shape(format!(
            "rope: [{n}, {width}] for {dims:?} and {} frequencies",
            rope.inv_freqs.len()
        )));
    }
    Ok((n, width))
}

/// Threads per block of `rope_qk_bf16` and `rope_write_kv_bf16`, whose grid is (token, chunk of
/// per-token work items).
const ROPE_THREADS: u32 = 256;

/// The launch of a RoPE kernel over `tokens` rows of `items_per_token` work items (rotated pairs,
/// plus copied K/V pairs for the fused write).
pub(super) fn rope_grid(tokens: usize, items_per_token: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            tokens as u32,
            items_per_token.div_ceil(ROPE_THREADS as usize) as u32,
            1,
        ),
        block_dim: (ROPE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// The device copy of a RoPE frequency table, uploaded the first time it is passed and kept
    /// (a model passes one or two: Gemma-3's windowed layers rotate with their own base). Eager
    /// steps run before any graph is recorded, so a recording finds every table already there.
    pub(super) fn rope_freqs(&self, inv_freqs: &[f32]) -> Result<Arc<CudaSlice<f32>>, CudaError> {
        /// More distinct tables than any model has: a caller passing fresh ones each step
        /// (a bug) then recycles the oldest instead of growing without bound.
        const MAX_TABLES: usize = 8;
        let mut tables = self
            .rope_tables
            .lock()
            .map_err(|_| CudaError::Shape("rope table lock poisoned".into()))?;
        if let Some((_, dev)) = tables.iter().find(|(host, _)| host.as_slice() == inv_freqs) {
            return Ok(dev.clone());
        }
        self.check_not_recording("the RoPE table")?;
        let dev = Arc::new(self.stream.clone_htod(inv_freqs)?);
        if tables.len() == MAX_TABLES {
            tables.remove(0);
        }
        tables.push((inv_freqs.to_vec(), dev.clone()));
        Ok(dev)
    }

    /// `Backend::rope_qk`: Q and K rotated in place.
    pub(super) fn rope_qk_impl(
        &self,
        qkv: &mut CudaTensor,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = rope_rows(qkv, dims, rope, batch)?;
        let freqs = self.rope_freqs(&rope.inv_freqs).map_err(err)?;
        let (width_i, rot_heads, hd, interleaved) = (
            width as i32,
            (dims.num_heads + dims.num_kv_heads) as i32,
            dims.head_dim as i32,
            i32::from(rope.style == RopeStyle::Interleaved),
        );
        if n == 0 {
            return Ok(());
        }
        let config = rope_grid(n, (dims.num_heads + dims.num_kv_heads) * dims.head_dim / 2);
        let q = qkv.bf16_mut().map_err(err)?;
        launch!(
            self,
            &self.kernels.rope_qk,
            config,
            q,
            &batch.positions(),
            freqs.as_ref(),
            &width_i,
            &rot_heads,
            &hd,
            &interleaved
        )
        .map_err(err)
    }

    /// `Backend::rope_qk_write_kv`: RoPE and the K/V write in one launch.
    pub(super) fn rope_qk_write_kv_impl(
        &self,
        qkv: &mut CudaTensor,
        cache: &mut CudaKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = rope_rows(qkv, dims, rope, batch)?;
        if cache.full_dims("rope_qk_write_kv").map_err(err)? != (dims.num_kv_heads, dims.head_dim) {
            return Err(BackendError::Shape(format!(
                "rope + write_kv: {dims:?} into {:?}",
                cache.spec
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let freqs = self.rope_freqs(&rope.inv_freqs).map_err(err)?;
        let config = rope_grid(
            n,
            (dims.num_heads + dims.num_kv_heads) * dims.head_dim / 2 + dims.kv_size() / 2,
        );
        let (width_i, heads_i, kv_heads_i, hd_i, interleaved) = (
            width as i32,
            dims.num_heads as i32,
            dims.num_kv_heads as i32,
            dims.head_dim as i32,
            i32::from(rope.style == RopeStyle::Interleaved),
        );
        let function = self.kernels.rope_write_kv.get(cache.elem);
        let CudaKvCache { keys, values, .. } = cache;
        let q = qkv.bf16_mut().map_err(err)?;
        launch!(
            self,
            function,
            config,
            q,
            &batch.positions(),
            freqs.as_ref(),
            &batch.slots(dims.cache_group),
            keys,
            values,
            &width_i,
            &heads_i,
            &kv_heads_i,
            &hd_i,
            &interleaved
        )
        .map_err(err)
    }
}
