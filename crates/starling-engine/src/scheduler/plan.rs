//! The plain-data result of one `schedule()` call, consumed by the runners.

use starling_kv::SeqId;

/// One sequence's share of a step: compute tokens
/// `[start_position, start_position + num_tokens)` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Logical (RoPE) position of the first scheduled token; also the index
    /// of that token in the engine's token list.
    pub start_position: usize,
    /// Tokens scheduled (at least 1).
    pub num_tokens: usize,
    /// Index of the first scheduled token among the sequence's physical KV
    /// slots: pass `physical_start_index..physical_start_index + num_tokens`
    /// to `KvCacheManager::slot_mapping`. Equals `start_position` unless
    /// tokens were evicted.
    pub physical_start_index: usize,
    /// The chunk reaches the end of the known tokens, so the engine must
    /// sample the next token from its last position.
    pub samples_next_token: bool,
}

/// Counters describing one step, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StepStats {
    /// Sequences scheduled this step.
    pub batch_size: usize,
    /// Tokens scheduled this step.
    pub num_scheduled_tokens: usize,
    /// Of those, tokens of prefill chunks (prompt, or recompute after preemption).
    pub num_prefill_tokens: usize,
    /// Of those, single new tokens of decoding sequences.
    pub num_decode_tokens: usize,
    /// Sequences preempted this step.
    pub num_preempted: usize,
    /// KV blocks held after scheduling.
    pub num_blocks_in_use: usize,
    /// KV blocks free after scheduling.
    pub num_free_blocks: usize,
    /// Sequences waiting after scheduling.
    pub num_waiting: usize,
    /// Sequences running after scheduling.
    pub num_running: usize,
}

/// What to compute in one step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepPlan {
    /// Sequences to run, decodes first, then prefill chunks.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences preempted this step (blocks freed, to be recomputed later);
    /// the engine drops any per-sequence device state it keeps for them.
    pub preempted: Vec<SeqId>,
    /// Sum of `num_tokens` over `scheduled`.
    pub num_scheduled_tokens: usize,
    /// Counters for this step.
    pub stats: StepStats,
}

impl StepPlan {
    /// Nothing to compute this step.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}
