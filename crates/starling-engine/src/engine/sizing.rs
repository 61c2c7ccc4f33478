//! The start-up preflight: how many blocks the budget buys and whether one `max_model_len`
//! sequence fits at its peak — every slot, the window's worth when every layer is windowed, the
//! kept tokens under eviction, or each cache group's blocks for a hybrid sliding-window model.

use starling_backend::Backend;
use starling_evict::CompressionConfig;
use starling_kv::{
    group_blocks_for_tokens, preflight_grouped, preflight_with_peak, CacheDtype, CacheLayout,
    Preflight,
};
use starling_models::llama::LlamaModel;

use super::{eviction_peak_tokens, window_peak_tokens, EngineError};
use crate::scheduler::SchedulerConfig;

/// Sizes the cache of `model` (whose per-layer layout is `layout`, in `dtype`) for a budget of
/// `kv_cache_memory_bytes` and the scheduler's limits under the engine-wide `eviction` policy, refusing when one sequence does not fit.
pub(super) fn preflight<B: Backend>(
    model: &LlamaModel<B>,
    kv_cache_memory_bytes: u64,
    sched: &SchedulerConfig,
    layout: &CacheLayout,
    dtype: CacheDtype,
    eviction: &CompressionConfig,
) -> Result<Preflight, EngineError> {
    let (max_len, chunk, bs) = (
        sched.max_model_len_tokens,
        sched.max_num_batched_tokens,
        sched.block_size_tokens,
    );
    let group_windows = model.cache_groups().windows();
    if group_windows.len() > 1 {
        // A hybrid model: each block serves one group's layers (see `CacheGroups`).
        let blocks = group_blocks_for_tokens(&group_windows, bs, max_len, chunk);
        return Ok(preflight_grouped(
            kv_cache_memory_bytes,
            &model.block_layout(dtype),
            bs,
            max_len,
            blocks,
        )?);
    }
    // An evicting engine keeps every slot of a windowed model (see `window.rs`).
    let window_peak =
        window_peak_tokens(model.config(), bs, max_len, chunk).filter(|_| !eviction.evicts());
    let peak = window_peak.unwrap_or_else(|| eviction_peak_tokens(eviction, max_len, chunk));
    Ok(preflight_with_peak(
        kv_cache_memory_bytes,
        layout,
        bs,
        max_len,
        peak,
    )?)
}
