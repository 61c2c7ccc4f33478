//! Automatic prefix caching in the engine: the one [`CacheIdentity`] every block hash is rooted
//! in, and each request's hash chain, extended as its tokens become known. The bookkeeping
//! (hash → block, ref counts, the LRU of cached free blocks) is `starling-kv`'s; the scheduler
//! admits a request at its hit and registers blocks after the forward pass; eviction's side of
//! the contract (never compact a shared block) is in `compaction.rs`.
//!
//! **Identity.** A block's K/V is a function of its tokens, every token before it, the weights
//! and how the cache stores it. The identity folds in the model identity (the caller's, or a
//! description of the model's shapes), the cache layout (full K/V or latents, ranks, dtype) and,
//! under STAR-KV, the checkpoint's manifest (weights digest, ranks, calibration recipe) with how
//! it is applied: two engines that could store different K/V for the same tokens never agree on
//! a hash.

use starling_kv::{BlockHash, BlockHasher, CacheIdentity, CacheIdentityParts, CacheLayout, SeqId};

use super::star_kv::StarKvInfo;
use super::{Engine, EngineError};
use starling_backend::Backend;

/// The identity of the cache an engine runs: see the module docs.
pub(crate) fn cache_identity(
    model_identity: &str,
    layout: &CacheLayout,
    star_kv: Option<&StarKvInfo>,
) -> CacheIdentity {
    let checkpoint = star_kv.map(|s| {
        format!(
            "cache={};factors={};profile={};manifest={}",
            s.cache, s.factors, s.profile, s.checkpoint_identity
        )
    });
    CacheIdentity::new(&CacheIdentityParts {
        model_identity,
        layout,
        checkpoint_identity: checkpoint.as_deref(),
    })
}

impl<B: Backend> Engine<B> {
    /// Whether automatic prefix caching is on.
    pub fn prefix_caching_enabled(&self) -> bool {
        self.hasher.is_some()
    }

    /// Hands the scheduler the hashes of `seq_id`'s full blocks beyond those it has (a no-op
    /// with caching off, or while the last block is still partial).
    pub(crate) fn extend_block_hashes(&mut self, seq_id: SeqId) -> Result<(), EngineError> {
        let Some(hasher) = &self.hasher else {
            return Ok(());
        };
        let seq = self
            .seqs
            .get(&seq_id)
            .ok_or(EngineError::UnknownRequest(seq_id))?;
        let bs = hasher.block_size_tokens();
        let known = self.scheduler.block_hashes(seq_id);
        let num_full = seq.token_ids.len() / bs;
        if num_full <= known.len() {
            return Ok(());
        }
        let mut parent = known.last().copied();
        let new: Vec<BlockHash> = (known.len()..num_full)
            .map(|i| {
                let hash = BlockHash::of_block(
                    hasher.identity(),
                    parent,
                    &seq.token_ids[i * bs..(i + 1) * bs],
                );
                parent = Some(hash);
                hash
            })
            .collect();
        self.scheduler.extend_block_hashes(seq_id, &new)?;
        Ok(())
    }

    /// After a forward pass: registers the blocks it filled for every request it ran. A
    /// failure only loses the reuse of those blocks (they stay private), so it is logged, not
    /// raised.
    pub(crate) fn register_computed_blocks(&mut self, plan: &crate::scheduler::StepPlan) {
        if self.hasher.is_none() {
            return;
        }
        for s in &plan.scheduled {
            if let Err(e) = self.scheduler.register_computed_blocks(s.seq_id) {
                tracing::warn!(
                    "{:?}: blocks not registered in the prefix cache: {e}",
                    s.seq_id
                );
            }
        }
    }
}

/// The hasher of an engine with prefix caching on.
pub(crate) fn hasher(
    identity: CacheIdentity,
    block_size_tokens: usize,
) -> Result<BlockHasher, EngineError> {
    Ok(BlockHasher::new(identity, block_size_tokens)?)
}

/// Prefix-cache figures since the engine started, for logs and `/metrics` (vLLM's
/// `prefix_cache_queries` and `prefix_cache_hits` count tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefixCacheCounters {
    /// Whether prefix caching is on.
    pub enabled: bool,
    /// Requests (and recomputes after preemption) admitted through the cache.
    pub queries_requests: u64,
    /// Tokens those requests knew when admitted (`vllm:prefix_cache_queries`).
    pub queries_tokens: u64,
    /// Of those, tokens found cached and not computed (`vllm:prefix_cache_hits`).
    pub hits_tokens: u64,
    /// Blocks found cached.
    pub hits_blocks: u64,
    /// Cached free blocks evicted (hash dropped) to serve an allocation.
    pub evicted_blocks: u64,
    /// Blocks registered in the cache now, free or held.
    pub cached_blocks: usize,
}

impl PrefixCacheCounters {
    /// `hits_tokens / queries_tokens`, 0 before any query.
    pub fn hit_rate(&self) -> f64 {
        if self.queries_tokens == 0 {
            return 0.0;
        }
        self.hits_tokens as f64 / self.queries_tokens as f64
    }
}

impl<B: Backend> Engine<B> {
    /// The prefix cache's counters since start-up.
    pub fn prefix_cache_counters(&self) -> PrefixCacheCounters {
        let kv = self.scheduler.kv();
        let stats = kv.prefix_cache_stats();
        PrefixCacheCounters {
            enabled: kv.prefix_caching_enabled(),
            queries_requests: stats.requests,
            queries_tokens: stats.query_tokens,
            hits_tokens: stats.hit_tokens,
            hits_blocks: stats.hit_blocks,
            evicted_blocks: stats.evicted_blocks,
            cached_blocks: kv.num_cached_blocks(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_kv::{CacheDtype, LayerLayout};

    fn info(manifest: &str) -> StarKvInfo {
        StarKvInfo {
            profile: "balanced".into(),
            cache: "latent".into(),
            factors: "both".into(),
            checkpoint_name: "ckpt".into(),
            compressed_layers: 2,
            kv_bytes_per_token_compressed: 10,
            kv_bytes_per_token_original: 20,
            checkpoint_identity: manifest.into(),
        }
    }

    #[test]
    fn the_checkpoint_and_the_layout_are_part_of_every_hash() {
        let dense = CacheLayout::uniform(
            2,
            LayerLayout::Full {
                num_kv_heads: 2,
                head_dim: 16,
                dtype: CacheDtype::F32,
            },
        );
        let latent = CacheLayout::uniform(
            2,
            LayerLayout::low_rank_padded(&[8, 8], 16, CacheDtype::F32),
        );
        let ids = [
            cache_identity("m", &dense, None),
            cache_identity("m2", &dense, None),
            cache_identity("m", &latent, None),
            cache_identity("m", &latent, Some(&info("{\"seed\":1}"))),
            cache_identity("m", &latent, Some(&info("{\"seed\":2}"))),
            cache_identity(
                "m",
                &latent,
                Some(&StarKvInfo {
                    factors: "keys".into(),
                    ..info("{\"seed\":1}")
                }),
            ),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            ids[3],
            cache_identity("m", &latent, Some(&info("{\"seed\":1}")))
        );
    }
}
