//! Engine configuration: scheduler limits, the KV-cache memory budget and what the cache does
//! (eviction, STAR-KV, prefix caching).

use starling_backend::Backend;
use starling_evict::{KvCacheDtype, KvCompression};
use starling_kv::CacheDtype;

use crate::scheduler::{AdmissionPolicy, SchedulerConfig};

/// Everything the engine needs to size its cache and batch requests.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Batching limits and the context window.
    pub scheduler: SchedulerConfig,
    /// Bytes of device memory given to the KV cache (all layers).
    pub kv_cache_memory_bytes: u64,
    /// What the cache stores and keeps, validated once when the engine starts
    /// ([`KvCompression::validate`]): the STAR-KV checkpoint the model runs with
    /// ([`crate::Engine::from_weights`] builds the model for it: latent layers, or the reference
    /// path; `None` caches full K/V), the token eviction of every request that does not choose
    /// its own ([`crate::RequestOptions::compression`]; the default evicts nothing), and the
    /// cache's element type.
    pub kv_compression: KvCompression,
    /// Automatic prefix caching (vLLM's `enable_prefix_caching`): full blocks are addressed
    /// by content hash and reused by later requests with the same prefix, so only the
    /// uncached tail of a prompt is computed. Greedy outputs are unchanged for requests that
    /// do not evict; an evicting request never compacts the blocks it shares (it compresses
    /// its private tail only, see ARCHITECTURE.md). Off: the engine behaves exactly as one
    /// without a prefix cache.
    pub enable_prefix_caching: bool,
    /// What identifies the weights in every block hash (e.g. the model file and load format);
    /// `None`: a description of the model's shapes, enough within one engine, whose weights
    /// never change. Under STAR-KV the checkpoint's manifest (which records the weights'
    /// digest) is folded in as well.
    pub model_identity: Option<String>,
}

impl EngineConfig {
    /// vLLM-like defaults for a model with context window `max_model_len_tokens`: 16-token blocks,
    /// 256 sequences, a 2048-token step budget (at least one full context when smaller, so a
    /// long prompt is never split into chunks smaller than needed). Prefix caching is off here
    /// (a library caller opts in; `starling serve` turns it on, as vLLM does).
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
            kv_compression: KvCompression::default(),
            enable_prefix_caching: false,
            model_identity: None,
        }
    }
}

/// The element type the cache stores under `kv_dtype` on `backend`: what sizing counts and
/// every backend allocates (the CPU reference holds fp8 values rounded to e4m3 in f32 slots,
/// so its arithmetic is the GPU's; CUDA stores one byte per element).
pub(crate) fn cache_dtype<B: Backend>(kv_dtype: KvCacheDtype, backend: &B) -> CacheDtype {
    match kv_dtype {
        KvCacheDtype::Auto => backend.kv_cache_dtype(),
        KvCacheDtype::Fp8 => CacheDtype::Fp8,
        KvCacheDtype::Int8 => CacheDtype::Int8,
        KvCacheDtype::Int4 => CacheDtype::Int4,
    }
}
