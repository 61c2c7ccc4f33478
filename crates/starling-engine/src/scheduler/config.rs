//! Scheduler limits, validated once at construction.

use super::admission::AdmissionPolicy;
use super::error::SchedulerError;

/// Limits of one scheduling step and of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running (holding KV blocks) at once.
    pub max_num_seqs: usize,
    /// Most tokens scheduled in one step, prefill chunks and decodes together.
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub max_model_len_tokens: usize,
    /// Token slots per KV block; must match the cache manager's.
    pub block_size_tokens: usize,
    /// When a waiting request may start.
    pub admission: AdmissionPolicy,
}

impl SchedulerConfig {
    /// Refuses zero limits, and a token budget smaller than `max_num_seqs`:
    /// every running decoder must get its one token each step, or the newest
    /// ones could wait forever behind the budget (vLLM's rule too).
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let fields = [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len_tokens", self.max_model_len_tokens),
            ("block_size_tokens", self.block_size_tokens),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, v)| *v == 0) {
            return Err(SchedulerError::InvalidConfig(format!("{name} must be > 0")));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(SchedulerError::InvalidConfig(format!(
                "max_num_batched_tokens ({}) must be >= max_num_seqs ({})",
                self.max_num_batched_tokens, self.max_num_seqs
            )));
        }
        Ok(())
    }
}
