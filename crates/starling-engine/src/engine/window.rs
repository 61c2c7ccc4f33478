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
//! Token eviction compacts slots, after which a slot's index is no longer its position. A
//! window over slots still sees exactly the model's window when every token it reaches was
//! kept: the engine raises the policy's protected recent tokens to at least the window
//! ([`protect_window`]), so evicted tokens are all older than any query's window. An engine
//! started with an evicting policy keeps every layer's slots in one table (no release behind
//! the window: the kept old tokens live there), and compaction frees what eviction drops. An
//! engine that releases behind the window refuses a request's own eviction
//! ([`check_request_eviction`]).

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

/// The eviction policy `eviction` as it runs on `config`'s model: on a model with windowed
/// layers its protected recent tokens (`window_tokens`) are raised to at least the model's
/// window, so every query's window of slots holds exactly the last `W` positions (evicted
/// tokens are all older than the protected tail; see the module doc). Unchanged otherwise.
pub fn protect_window(config: &ModelConfig, eviction: &CompressionConfig) -> CompressionConfig {
    match &config.sliding_window {
        Some(window) if eviction.evicts() && eviction.window_tokens < window.tokens => {
            CompressionConfig {
                window_tokens: window.tokens,
                ..eviction.clone()
            }
        }
        _ => eviction.clone(),
    }
}

/// The engine-wide `eviction` as it runs on `model` ([`protect_window`]); when it evicts on a
/// sliding-window model, puts every layer in one block table first
/// (`LlamaModel::keep_every_slot`): compaction keeps old tokens that the windowed layers'
/// release would have given back.
pub(crate) fn prepare_for_eviction<B: starling_backend::Backend>(
    model: &mut starling_models::llama::LlamaModel<B>,
    eviction: &CompressionConfig,
) -> CompressionConfig {
    let eviction = protect_window(model.config(), eviction);
    if eviction.evicts() && model.config().sliding_window.is_some() {
        model.keep_every_slot();
        tracing::info!(
            "sliding-window model under eviction: every layer keeps its slots in one block \
             table, {} recent tokens protected",
            eviction.window_tokens
        );
    }
    eviction
}

/// Refuses a request's own eviction policy on an engine that releases windowed layers' blocks
/// behind the window (`releases_windows`): compaction would need the released slots. Such an
/// engine evicts only when started with an evicting engine-wide policy, which keeps every slot.
pub(crate) fn check_request_eviction(
    config: &ModelConfig,
    releases_windows: bool,
    eviction: &CompressionConfig,
) -> Result<(), EngineError> {
    match &config.sliding_window {
        Some(window) if releases_windows && eviction.evicts() => {
            Err(EngineError::InvalidRequest(format!(
                "this engine gives back the blocks behind the sliding window (the model's \
                 windowed layers see the last {} tokens), which a compaction would need: a \
                 request may evict only on an engine started with an evicting \
                 --kv-compression policy (that engine keeps every slot until it compacts)",
                window.tokens
            )))
        }
        _ => Ok(()),
    }
}
