//! Errors of the scheduler's public operations.

use starling_kv::{KvError, SeqId};

/// What the scheduler refuses, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// A limit is zero or limits contradict each other.
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),

    /// `add_request` with an id that is already waiting or running.
    #[error("sequence {0} is already scheduled")]
    DuplicateSequence(SeqId),

    /// The id is neither waiting nor running.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),

    /// A request with no prompt tokens.
    #[error("sequence {0} has an empty prompt")]
    EmptyPrompt(SeqId),

    /// The prompt is longer than the model accepts.
    #[error("prompt of {seq_id} has {num_prompt_tokens} tokens, max_model_len is {max_model_len_tokens}")]
    PromptTooLong {
        /// The request.
        seq_id: SeqId,
        /// Its prompt length.
        num_prompt_tokens: usize,
        /// The model's limit.
        max_model_len_tokens: usize,
    },

    /// The prompt alone needs more token slots than the whole KV cache has.
    #[error("prompt of {seq_id} has {num_prompt_tokens} tokens, the KV cache holds only {capacity_tokens}")]
    PromptExceedsCache {
        /// The request.
        seq_id: SeqId,
        /// Its prompt length.
        num_prompt_tokens: usize,
        /// Token slots of the whole pool.
        capacity_tokens: usize,
    },

    /// A compressing request would hold more token slots at its peak than the whole KV cache
    /// has (its kept tokens plus a prefill chunk in flight).
    #[error(
        "{seq_id} holds up to {max_held_tokens} tokens at its peak under its compression \
         policy (kept tokens plus a prefill chunk), the KV cache holds only {capacity_tokens}"
    )]
    PeakExceedsCache {
        /// The request.
        seq_id: SeqId,
        /// Slots it would hold at its peak.
        max_held_tokens: usize,
        /// Token slots of the whole pool.
        capacity_tokens: usize,
    },

    /// `append_token` while the sequence still has known tokens to compute
    /// (a token is appended only after its predecessor's step sampled it).
    #[error("{seq_id} cannot take a token: {num_computed_tokens} of {num_tokens} tokens computed")]
    NotAwaitingToken {
        /// The sequence.
        seq_id: SeqId,
        /// Its known tokens.
        num_tokens: usize,
        /// Tokens whose KV is in the cache.
        num_computed_tokens: usize,
    },

    /// The sequence reached the longest length it may have; the engine must
    /// finish it (finish reason "length").
    #[error("{seq_id} reached its length limit of {limit_tokens} tokens")]
    LengthLimit {
        /// The sequence.
        seq_id: SeqId,
        /// `min(max_model_len, KV capacity)`.
        limit_tokens: usize,
    },

    /// The operation needs a running sequence, and this one is waiting.
    #[error("sequence {0} is not running")]
    NotRunning(SeqId),

    /// The KV-cache manager refused.
    #[error(transparent)]
    Kv(#[from] KvError),
}
