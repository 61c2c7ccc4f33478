//! What the engine reports about itself: cumulative counters and a load snapshot, for logs,
//! `/metrics`, result files and tests.

use super::PrefixCacheCounters;
use crate::scheduler::StepStats;

/// Cumulative counters since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineCounters {
    /// Steps run.
    pub steps: u64,
    /// Prompt (and recomputed) tokens pushed through the model.
    pub prefill_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Requests finished (any reason).
    pub finished_requests: u64,
    /// Token-eviction compactions run (one per request per compression, all layers).
    pub compressions: u64,
    /// Tokens evicted per layer, summed over compressions.
    pub evicted_tokens: u64,
    /// KV blocks returned to the pool by eviction.
    pub evicted_blocks: u64,
    /// Cached or shared blocks copied into private ones before a compaction rewrote them
    /// (copy-on-compact: the prefix cache keeps the originals).
    pub forked_blocks: u64,
    /// Wall time spent compacting (scoring, selection, compaction of every layer, with the
    /// device syncs that scoring needs), microseconds: the share of step time eviction costs.
    pub compression_micros: u64,
    /// Layers compacted (a compression of a model of L layers counts L, spread over one or
    /// more steps).
    pub compaction_layers: u64,
    /// Requests ended by a failure of their own (NaN logits, a failed compaction), counted in
    /// `finished_requests` too.
    pub failed_requests: u64,
    /// Decode steps replayed from a recorded graph (the rest ran eagerly).
    pub replayed_steps: u64,
}

/// A snapshot of the engine's load, for logs, metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Requests being computed.
    pub num_running: usize,
    /// Requests queued (new or preempted).
    pub num_waiting: usize,
    /// KV blocks in the pool.
    pub kv_blocks_total: usize,
    /// KV blocks free.
    pub kv_blocks_free: usize,
    /// Preemptions so far.
    pub num_preemptions: u64,
    /// Cumulative counters.
    pub counters: EngineCounters,
    /// The last step's statistics.
    pub last_step: Option<StepStats>,
    /// Prefix-cache counters.
    pub prefix_cache: PrefixCacheCounters,
}
