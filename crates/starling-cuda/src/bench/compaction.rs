//! One layer's eviction compaction (KeyDiff) timed two ways, for `starling bench compaction`
//! (issue 17): the host path the engine took before session 23 (scores copied back — a wait
//! behind everything queued —, `KeepPlan::keep_lists` on the host, then `compact_kv`) and the
//! device path it takes now (`compact_kv_by_scores`: the selection where the scores are).
//! Wall-clock times on the calling thread, each run starting on an idle device: what the
//! engine thread spends issuing one layer's compaction, and until the device has finished it.

use std::time::Instant;

use starling_backend::keep::keep_count;
use starling_backend::{BackendCore, KeepPlan, KeyScoreKind, KvCacheOps, KvCacheSpec};
use starling_kv::CacheDtype;

use super::{fill_cache, time_ms};
use crate::{CudaBackend, CudaError};

/// Protection of the benchmark's policy (the engine's defaults for KeyDiff).
const SINK_TOKENS: usize = 4;
const WINDOW_TOKENS: usize = 64;

/// One layer's compaction, both paths.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactionRow {
    /// KV heads of the layer.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// The sequence's physical tokens before the compaction.
    pub tokens: usize,
    /// Tokens kept (KeyDiff at `ratio`).
    pub kept_tokens: usize,
    /// Eviction ratio.
    pub ratio: f64,
    /// Host path: the calling thread until `compact_kv` returned (the wait for the scores
    /// included), median ms.
    pub host_path_issue_ms: f64,
    /// Host path until the device finished, median ms.
    pub host_path_total_ms: f64,
    /// Device path: the calling thread until `compact_kv_by_scores` returned, median ms.
    pub device_path_issue_ms: f64,
    /// Device path until the device finished, median ms.
    pub device_path_total_ms: f64,
    /// Device time of the selection kernel alone (events), median ms.
    pub select_kernel_ms: f64,
}

/// Times one full layer of `num_kv_heads × head_dim` holding one sequence of `tokens`, compacted
/// by KeyDiff at `ratio`, `iters` times per path after 3 warm-up runs (the compactions repeat
/// on the same cache: the same work each time).
pub fn bench_compaction(
    backend: &CudaBackend,
    num_kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    ratio: f64,
    iters: usize,
) -> Result<CompactionRow, CudaError> {
    let block_size = 16;
    let blocks = tokens.div_ceil(block_size);
    let spec = KvCacheSpec::full(blocks, block_size, num_kv_heads, head_dim, CacheDtype::BF16);
    let mut cache = backend.alloc_kv_cache(&spec)?;
    fill_cache(backend, &mut cache, 17)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let plan = KeepPlan {
        physical_tokens: tokens,
        target_tokens: keep_count(tokens, ratio, SINK_TOKENS, WINDOW_TOKENS),
        first_evictable_tokens: 0,
        evictable_end_tokens: tokens,
        sink_tokens: SINK_TOKENS,
        window_tokens: WINDOW_TOKENS,
        layer_wide: false,
        lists: num_kv_heads,
        skip_tokens: 0,
    };
    let kind = KeyScoreKind::KeyDiff;
    let (host_path_issue_ms, host_path_total_ms) = wall_ms(backend, iters, || {
        let scores = backend.key_scores(&cache, &table, block_size, tokens, kind)?;
        let keep = plan.keep_lists(&backend.to_host(&scores)?)?;
        backend.compact_kv(&mut cache, &table, block_size, tokens, &keep)?;
        Ok(())
    })?;
    let (device_path_issue_ms, device_path_total_ms) = wall_ms(backend, iters, || {
        let scores = backend.key_scores(&cache, &table, block_size, tokens, kind)?;
        backend.compact_kv_by_scores(&mut cache, &table, block_size, &scores, &plan)?;
        Ok(())
    })?;
    let scores = backend.key_scores(&cache, &table, block_size, tokens, kind)?;
    let select_kernel_ms = time_ms(backend, 3, iters, || {
        backend.select_kept_device(&scores, &plan)?;
        Ok(())
    })?;
    Ok(CompactionRow {
        num_kv_heads,
        head_dim,
        tokens,
        kept_tokens: plan.target_tokens,
        ratio,
        host_path_issue_ms,
        host_path_total_ms,
        device_path_issue_ms,
        device_path_total_ms,
        select_kernel_ms,
    })
}

/// Median wall-clock ms of `f` returning on the calling thread, and until the device is done,
/// over `iters` runs after 3 warm-up runs, each started on an idle device.
fn wall_ms(
    backend: &CudaBackend,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<(f64, f64), CudaError> {
    let (mut issued, mut done) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for run in 0..3 + iters {
        backend.synchronize()?;
        let started = Instant::now();
        f()?;
        let returned = started.elapsed();
        backend.synchronize()?;
        let finished = started.elapsed();
        if run >= 3 {
            issued.push(returned.as_secs_f64() * 1e3);
            done.push(finished.as_secs_f64() * 1e3);
        }
    }
    Ok((median(&mut issued), median(&mut done)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
