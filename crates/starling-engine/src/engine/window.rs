//! Sliding-window caching: when every layer of the model attends over a window of the most
//! recent `W` tokens (Mistral), no layer reads a slot again once the next query's window has
//! moved past it, so a sequence holds about `W` tokens whatever its length. After each step
//! the engine gives back the leading blocks wholly before the next query's window
//! ([`starling_kv::KvCacheManager::release_before`]), and the preflight and admission count
//! the window, not the length ([`window_footprint`]).
//!
//! A model with some full-attention layers too (Gemma-3) keeps its windowed layers' blocks in
//! block tables of their own (`starling_kv::CacheGroups`, one pool): after each step every
//! windowed group gives back its blocks behind the window
//! (`starling_kv::KvCacheManager::release_behind_windows`), the full layers keep every slot,
//! and the preflight and admission count each group's blocks
//! (`starling_kv::KvCacheManager::blocks_for_tokens`).
//!
//! Token eviction compacts slots, after which a slot's index is no longer its position; a
//! window over slots would then see further back than the model's. The engine refuses eviction
//! on a windowed model ([`check_eviction`]).

use starling_evict::CompressionConfig;
use starling_models::ModelConfig;

use super::EngineError;
use crate::scheduler::Footprint;

/// The window every layer attends over, when every layer is windowed: the reach the engine
/// releases blocks behind. `None` when some layer attends over the whole context.
pub(crate) fn release_window_tokens(config: &ModelConfig) -> Option<usize> {
    if config.every_layer_windowed() {
        config.sliding_window.as_ref().map(|w| w.tokens)
    } else {
        None
    }
}

/// The most token slots one sequence of `total_tokens` holds when every layer of `config` is
/// windowed (blocks released behind the window; one prefill chunk of `chunk_tokens` in flight):
/// what the preflight and `starling info` count. `None` when some layer attends over the whole
/// context (every slot is kept).
pub fn window_peak_tokens(
    config: &ModelConfig,
    block_size_tokens: usize,
    total_tokens: usize,
    chunk_tokens: usize,
) -> Option<usize> {
    release_window_tokens(config)
        .map(|w| window_footprint(w, block_size_tokens, total_tokens, chunk_tokens).max_held_tokens)
}

/// What a sequence of `total_tokens` holds at most when its blocks are released behind a window
/// of `window_tokens`: the window plus the partial block before it, and one prefill chunk of
/// `chunk_tokens` written before the step's release.
pub(crate) fn window_footprint(
    window_tokens: usize,
    block_size_tokens: usize,
    total_tokens: usize,
    chunk_tokens: usize,
) -> Footprint {
    Footprint::compressed(
        window_tokens.saturating_add(block_size_tokens),
        total_tokens,
        chunk_tokens,
    )
}

/// Refuses token eviction on a model with any windowed layer (see the module doc): the
/// engine-wide policy at start, a request's own when it is added.
pub(crate) fn check_eviction(
    config: &ModelConfig,
    eviction: &CompressionConfig,
) -> Result<(), EngineError> {
    match &config.sliding_window {
        Some(window) if eviction.evicts() => Err(EngineError::InvalidRequest(format!(
            "token eviction is not built for sliding-window attention (this model's windowed \
             layers see the last {} tokens; eviction would widen that window): serve it \
             without --kv-compression",
            window.tokens
        ))),
        _ => Ok(()),
    }
}
