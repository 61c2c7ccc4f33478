//! What the scheduler knows of one sequence: token counts only. The token
//! ids themselves stay with the engine.

use super::admission::Footprint;

/// Where a sequence is in the scheduler's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued; holds no KV blocks (new, or preempted and to be recomputed).
    Waiting,
    /// Admitted; holds KV blocks for its computed tokens.
    Running,
}

/// A read-only snapshot of one sequence's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqProgress {
    /// Queue the sequence is in.
    pub status: SeqStatus,
    /// Prompt length given to `add_request`.
    pub num_prompt_tokens: usize,
    /// Known tokens: prompt plus generated so far.
    pub num_tokens: usize,
    /// Tokens whose KV is in the cache (or scheduled into it by the last plan).
    pub num_computed_tokens: usize,
    /// The most the sequence is projected to hold (admission under
    /// [`super::AdmissionPolicy::ReservePeak`], and readmission after a preemption).
    pub footprint: Footprint,
    /// How many times it was preempted (recomputed from scratch). A compressing sequence
    /// preempted once is readmitted only when its own peak fits (see [`super::AdmissionPolicy`]).
    pub times_preempted: u32,
}

impl SeqProgress {
    /// Known tokens not yet computed.
    pub fn num_remaining_tokens(&self) -> usize {
        self.num_tokens - self.num_computed_tokens
    }

    /// Exactly one token left to compute: the last sampled one (decode), or
    /// the last prompt token of a chunked prefill. Such sequences go first.
    pub(crate) fn has_one_token_left(&self) -> bool {
        self.num_remaining_tokens() == 1
    }
}
