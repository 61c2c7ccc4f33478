//! Per-request state the engine keeps beside the scheduler's counters: token ids, sampling
//! parameters and the request's own RNG, stop checker and text stream.

use crate::sampling::{SamplingParams, SequenceRng, StopChecker};

use super::compaction::WindowTail;
use super::compression::SeqCompression;
use super::text::TextStream;

/// One request in flight.
pub(crate) struct Sequence {
    /// Prompt then generated tokens: the scheduler's `num_tokens` indexes into this.
    pub(crate) token_ids: Vec<u32>,
    pub(crate) num_prompt_tokens: usize,
    pub(crate) params: SamplingParams,
    pub(crate) rng: SequenceRng,
    pub(crate) stop: StopChecker,
    pub(crate) text: Option<Box<dyn TextStream>>,
    /// Eviction policy; `None` keeps every token.
    pub(crate) compression: Option<SeqCompression>,
    /// Observation-window queries gathered from the prefill chunks that hold the newest
    /// tokens (SnapKV, TOVA), for the compaction that follows the prefill.
    pub(crate) window_tail: Option<WindowTail>,
    /// A compaction of its prefill departed from what a fresh run does (it kept a shared
    /// prefix whole): its slots register under no compacted state until it is recomputed.
    pub(crate) compacted_off_plan: bool,
    /// Teacher-forced output tokens, when the request gave them.
    pub(crate) forced_output_ids: Option<Vec<u32>>,
    pub(crate) return_full_logprobs: bool,
}

impl Sequence {
    pub(crate) fn output_ids(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }
}
