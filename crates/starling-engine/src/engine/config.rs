//! Engine configuration: scheduler limits plus the KV-cache memory budget.

use starling_evict::{CompressionConfig, StarKvSelection};

use crate::scheduler::{AdmissionPolicy, SchedulerConfig};

/// Everything the engine needs to size its cache and batch requests.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Batching limits and the context window.
    pub scheduler: SchedulerConfig,
    /// Bytes of device memory given to the KV cache (all layers).
    pub kv_cache_memory_bytes: u64,
    /// Token eviction applied to every request that does not choose its own
    /// ([`crate::RequestOptions::compression`]); the default evicts nothing.
    pub compression: CompressionConfig,
    /// The STAR-KV checkpoint the model runs with ([`crate::Engine::from_weights`] builds the
    /// model for it: latent layers, or the reference path); `None` caches full K/V.
    pub star_kv: Option<StarKvSelection>,
}

impl EngineConfig {
    /// vLLM-like defaults for a model with context window `max_model_len_tokens`: 16-token blocks,
    /// 256 sequences, a 2048-token step budget (at least one full context when smaller, so a
    /// long prompt is never split into chunks smaller than needed).
    pub fn with_defaults(max_model_len_tokens: usize, kv_cache_memory_bytes: u64) -> Self {
        Self {
            scheduler: SchedulerConfig {
                max_num_seqs: 256,
                max_num_batched_tokens: 2048,
                max_model_len_tokens,
                block_size_tokens: 16,
                admission: AdmissionPolicy::Optimistic,
            },
            kv_cache_memory_bytes,
            compression: CompressionConfig::default(),
            star_kv: None,
        }
    }
}
