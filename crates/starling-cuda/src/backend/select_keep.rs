//! Eviction's selection on the GPU (`select_kept_tokens` in `kernels/kv_cache.cu`): a layer's
//! kept-index lists chosen from scores that never left the device, then compacted from them
//! (`kv_ops.rs`). A compaction is thus a queue of launches with no copy back and no wait, so
//! the engine thread does not stall on the device once per layer. The definition and CPU
//! reference is `starling_backend::KeepPlan::keep_lists`.

use cudarc::driver::{CudaSlice, LaunchConfig};
use starling_backend::cpu::{check_block_table, check_distinct_blocks};
use starling_backend::KeepPlan;

use super::kv_ops::int_arg;
use super::{CudaBackend, CudaKvCache};
use crate::{CudaError, CudaTensor};

/// Threads per CUDA block of `select_kept_tokens` (its `SELECT_THREADS`).
const SELECT_THREADS: u32 = 1024;

impl CudaBackend {
    /// `Backend::compact_kv_by_scores`: selects on the device, then moves the kept rows.
    pub(super) fn compact_kv_by_scores_impl(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        scores: &CudaTensor,
        plan: &KeepPlan,
    ) -> Result<(), CudaError> {
        let table = plan.rewritten_table(block_table, block_size_tokens)?;
        let len = plan.rewritten_tokens();
        let op = "compact_kv_by_scores";
        check_block_table(&cache.spec, table, block_size_tokens, len, op)?;
        check_distinct_blocks(table, block_size_tokens, len, op)?;
        let lists = cache.spec.keep_lists();
        if plan.lists != lists {
            return Err(CudaError::Shape(format!(
                "{op}: a plan of {} lists for a layer that takes {lists}",
                plan.lists
            )));
        }
        let Some(kept) = self.select_kept_device(scores, plan)? else {
            return Ok(());
        };
        let table = self.upload_u32(table)?;
        let count = plan.rewritten_kept_tokens();
        self.move_kept_rows(cache, &table, block_size_tokens, &kept, count, lists)
    }

    /// The plan's kept-index lists selected on the device, copied back (what
    /// `KeepPlan::keep_lists` returns for the same scores; for tests and benchmarks).
    pub fn select_kept_tokens(
        &self,
        scores: &CudaTensor,
        plan: &KeepPlan,
    ) -> Result<Vec<Vec<u32>>, CudaError> {
        let count = plan.rewritten_kept_tokens();
        let Some(kept) = self.select_kept_device(scores, plan)? else {
            return Ok(vec![Vec::new(); plan.lists]);
        };
        let flat: Vec<u32> = self.stream.clone_dtoh(&kept)?;
        Ok(flat.chunks_exact(count).map(<[u32]>::to_vec).collect())
    }

    /// `[lists, count]` kept indices on the device (relative to `plan.skip_tokens`), `None`
    /// when no row moves (nothing kept after the skipped slots).
    pub(crate) fn select_kept_device(
        &self,
        scores: &CudaTensor,
        plan: &KeepPlan,
    ) -> Result<Option<CudaSlice<u32>>, CudaError> {
        let n = plan.physical_tokens;
        let heads = plan.score_rows(scores.shape())?;
        plan.check(heads)?;
        let count = plan.rewritten_kept_tokens();
        if count == 0 {
            return Ok(None);
        }
        let (_, _, room) = plan.candidate_counts();
        let first = plan.first_evictable_tokens;
        // Counted inside the candidates, so the kernel's sums cannot overflow.
        let (sinks, window) = plan.protection();
        let lists = int_arg(plan.lists, "kept-index lists")?;
        let args = [
            int_arg(n, "select: length")?,
            int_arg(heads, "select: score rows")?,
            i32::from(plan.layer_wide),
            int_arg(first, "select: first evictable")?,
            int_arg(plan.evictable_end_tokens, "select: evictable end")?,
            int_arg(sinks, "select: sinks")?,
            int_arg(window, "select: window")?,
            int_arg(room, "select: room")?,
            int_arg(plan.skip_tokens, "select: skipped slots")?,
        ];
        let count_i = int_arg(count, "select: kept count")?;
        // Zeroed: an index the kernel did not write (it writes all of them; the plan was
        // checked) would still name a slot of the sequence, never one out of range.
        let mut kept = self.stream.alloc_zeros::<u32>(plan.lists * count)?;
        let config = LaunchConfig {
            grid_dim: (lists as u32, 1, 1),
            block_dim: (SELECT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let [n_i, heads_i, wide, first_i, end_i, sinks_i, window_i, room_i, skip_i] = args;
        launch!(
            self,
            &self.kernels.select_kept_tokens,
            config,
            scores.f32()?,
            &n_i,
            &heads_i,
            &wide,
            &first_i,
            &end_i,
            &sinks_i,
            &window_i,
            &room_i,
            &skip_i,
            &mut kept,
            &count_i
        )?;
        Ok(Some(kept))
    }
}
