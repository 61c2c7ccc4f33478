//! Eviction key scores on the GPU (kernels in `kernels/key_scores.cu`): KNorm in one pass over
//! the sequence's keys, KeyDiff in two (unit-key sums per chunk, a fixed-order reduction to the
//! mean direction, then the cosines), and the observation-window scores of SnapKV and TOVA in
//! four (per-tile softmax partials, their merge, the attention mass per token, the pooling).
//! The `[num_kv_heads, len]` f32 scores stay on the device (`select_keep.rs` selects by them).

use cudarc::driver::LaunchConfig;
use starling_backend::cpu::{check_block_table, check_window_scores};
use starling_backend::{HostTensor, KeyScoreKind, WindowScoreSpec};

use crate::device_buf::DeviceBuf;
use crate::tensor::CudaTensor;

use super::kv_ops::int_arg;
use super::{grid_for, CudaBackend, CudaKvCache};
use crate::geometry::{
    KEY_SCORE_MAX_HEAD_DIM, KEY_SCORE_THREADS, WINDOW_TILE_TOKENS, WINDOW_WARPS,
};
use crate::CudaError;

/// Tokens each CUDA block scores (and sums, for KeyDiff's mean).
const TOKENS_PER_BLOCK: usize = 128;
impl CudaBackend {
    pub(super) fn key_scores_impl(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<CudaTensor, CudaError> {
        let spec = &cache.spec;
        check_block_table(
            spec,
            block_table,
            block_size_tokens,
            len_tokens,
            "key_scores",
        )?;
        let (nkv, hd) = cache.full_dims("key_scores")?;
        if hd == 0 || hd > KEY_SCORE_MAX_HEAD_DIM || nkv > 65_535 {
            return Err(CudaError::Shape(format!(
                "key_scores: head_dim {hd} with {nkv} KV heads unsupported on CUDA \
                 (head_dim 1..={KEY_SCORE_MAX_HEAD_DIM}, up to 65535 heads)"
            )));
        }
        if len_tokens == 0 || nkv == 0 {
            // One element: a zero-byte allocation is refused; the shape says it is empty.
            return scores_tensor(self.stream.alloc_zeros::<f32>(1)?, nkv, len_tokens);
        }
        let table = self.upload_u32(block_table)?;
        let chunks = len_tokens.div_ceil(TOKENS_PER_BLOCK);
        let (bs, len) = (
            int_arg(block_size_tokens, "block size")?,
            int_arg(len_tokens, "key_scores: length")?,
        );
        let (nkv_i, hd_i) = (int_arg(nkv, "KV heads")?, int_arg(hd, "head_dim")?);
        // Lanes per head row: the fewest (a power of two) whose 8-element vectors cover it.
        let lpr = int_arg(hd.div_ceil(8).next_power_of_two(), "lanes per row")?;
        let (tpb, chunks_i) = (
            int_arg(TOKENS_PER_BLOCK, "tokens per block")?,
            int_arg(chunks, "key_scores: chunks")?,
        );
        let grid = LaunchConfig {
            grid_dim: (chunks_i as u32, nkv as u32, 1),
            block_dim: (KEY_SCORE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let key_diff = kind == KeyScoreKind::KeyDiff;
        // SAFETY (all allocations below): the kernels write every element before it is read —
        // partials[chunk, h, c], mean[h, c] and mean_norm[h] for every chunk, head and c < hd,
        // scores[h, t] for every t < len.
        let (mean, mean_norm) = if key_diff {
            let mut partials = unsafe { self.stream.alloc::<f32>(chunks * nkv * hd) }?;
            let mut mean = unsafe { self.stream.alloc::<f32>(nkv * hd) }?;
            let mut mean_norm = unsafe { self.stream.alloc::<f32>(nkv) }?;
            launch!(
                self,
                self.kernels.key_direction_partials.get(cache.elem),
                grid,
                &cache.keys,
                &table,
                &bs,
                &len,
                &nkv_i,
                &hd_i,
                &lpr,
                &tpb,
                &mut partials
            )?;
            let per_head = LaunchConfig {
                grid_dim: (nkv as u32, 1, 1),
                block_dim: (KEY_SCORE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self,
                &self.kernels.key_direction_mean,
                per_head,
                &partials,
                &chunks_i,
                &nkv_i,
                &hd_i,
                &len,
                &mut mean,
                &mut mean_norm
            )?;
            (mean, mean_norm)
        } else {
            // KNorm never reads the mean; the kernel still takes the arguments.
            (
                self.stream.alloc_zeros::<f32>(1)?,
                self.stream.alloc_zeros::<f32>(1)?,
            )
        };
        let mut scores = unsafe { self.stream.alloc::<f32>(nkv * len_tokens) }?;
        let key_diff_i = i32::from(key_diff);
        launch!(
            self,
            self.kernels.key_scores.get(cache.elem),
            grid,
            &cache.keys,
            &table,
            &bs,
            &len,
            &nkv_i,
            &hd_i,
            &lpr,
            &tpb,
            &mean,
            &mean_norm,
            &key_diff_i,
            &mut scores
        )?;
        scores_tensor(scores, nkv, len_tokens)
    }
}

impl CudaBackend {
    /// `Backend::window_scores`: O(window × group × len × head_dim) multiply-adds per KV head,
    /// on the GPU; the queries go up (`window × q_size` f32), the scores stay.
    pub(super) fn window_scores_impl(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        queries: &HostTensor,
        score: &WindowScoreSpec,
    ) -> Result<CudaTensor, CudaError> {
        let spec = &cache.spec;
        let window = check_window_scores(
            spec,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            score,
        )?;
        let (nkv, hd) = cache.full_dims("window_scores")?;
        if hd == 0 || hd > KEY_SCORE_MAX_HEAD_DIM || nkv == 0 || nkv > 65_535 {
            return Err(CudaError::Shape(format!(
                "window_scores: head_dim {hd} with {nkv} KV heads unsupported on CUDA \
                 (head_dim 1..={KEY_SCORE_MAX_HEAD_DIM}, 1 to 65535 heads)"
            )));
        }
        let rows = window * score.group;
        let tiles = len_tokens.div_ceil(WINDOW_TILE_TOKENS);
        let table = self.upload_u32(block_table)?;
        self.check_not_recording("a query upload")?;
        let q = self.stream.clone_htod(queries.data())?;
        let (bs, len) = (
            int_arg(block_size_tokens, "block size")?,
            int_arg(len_tokens, "window_scores: length")?,
        );
        let (nkv_i, hd_i) = (int_arg(nkv, "KV heads")?, int_arg(hd, "head_dim")?);
        let (group, window_i) = (
            int_arg(score.group, "group")?,
            int_arg(window, "window_scores: window")?,
        );
        let (tiles_i, total_rows) = (
            int_arg(tiles, "window_scores: tiles")?,
            int_arg(nkv * rows, "window_scores: rows")?,
        );
        let pool = int_arg(score.pool_kernel_tokens, "pool width")?;
        // Row-major float2 pairs (max, sum); cudarc allocations are 256-byte aligned.
        // SAFETY (all allocations below): every element is written before it is read —
        // partials[h, r, tile] for every head, row and tile by the first kernel, stats[h, r] by
        // the second, mass[h, t] for every t < len by the third, scores by the fourth.
        let mut partials = unsafe { self.stream.alloc::<f32>(2 * nkv * rows * tiles) }?;
        let mut stats = unsafe { self.stream.alloc::<f32>(2 * nkv * rows) }?;
        let mut mass = unsafe { self.stream.alloc::<f32>(nkv * len_tokens) }?;
        let mut scores = unsafe { self.stream.alloc::<f32>(nkv * len_tokens) }?;
        let tile_grid = LaunchConfig {
            grid_dim: (tiles_i as u32, nkv as u32, 1),
            block_dim: (KEY_SCORE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            self.kernels.window_softmax_partials.get(cache.elem),
            tile_grid,
            &cache.keys,
            &table,
            &bs,
            &len,
            &nkv_i,
            &hd_i,
            &group,
            &window_i,
            &q,
            &score.scale,
            &tiles_i,
            &mut partials
        )?;
        let combine_grid = LaunchConfig {
            grid_dim: ((nkv * rows).div_ceil(WINDOW_WARPS) as u32, 1, 1),
            block_dim: (KEY_SCORE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            &self.kernels.window_softmax_combine,
            combine_grid,
            &partials,
            &tiles_i,
            &total_rows,
            &mut stats
        )?;
        launch!(
            self,
            self.kernels.window_attention_mass.get(cache.elem),
            tile_grid,
            &cache.keys,
            &table,
            &bs,
            &len,
            &nkv_i,
            &hd_i,
            &group,
            &window_i,
            &q,
            &score.scale,
            &stats,
            &mut mass
        )?;
        launch!(
            self,
            &self.kernels.window_pool_scores,
            grid_for(nkv * len_tokens),
            &mass,
            &len,
            &nkv_i,
            &window_i,
            &pool,
            &mut scores
        )?;
        scores_tensor(scores, nkv, len_tokens)
    }
}

/// `[nkv, len]` f32 scores as a device tensor.
fn scores_tensor(
    scores: cudarc::driver::CudaSlice<f32>,
    nkv: usize,
    len_tokens: usize,
) -> Result<CudaTensor, CudaError> {
    Ok(CudaTensor::new(
        DeviceBuf::F32(scores),
        vec![nkv, len_tokens],
    ))
}
