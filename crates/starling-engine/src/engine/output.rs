//! What a step reports per request.

use starling_kv::SeqId;

use crate::sampling::Finished;

/// Log-probability information for one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The generated token.
    pub token_id: u32,
    /// Its raw log-probability.
    pub logprob: f32,
    /// The most likely alternatives (as many as the request asked for), most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One request's progress during one step.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// The request.
    pub seq_id: SeqId,
    /// The token generated this step (none when the step only advanced the prompt or the request
    /// was aborted).
    pub token_id: Option<u32>,
    /// Text that became final this step (stop-string hold-back and UTF-8 completion applied).
    pub text_delta: String,
    /// Log-probabilities of this step's token, when the request asked for them.
    pub logprob: Option<TokenLogprob>,
    /// Set on the request's last output.
    pub finished: Option<Finished>,
    /// Prompt length in tokens.
    pub num_prompt_tokens: usize,
    /// Tokens generated so far.
    pub num_output_tokens: usize,
    /// The raw log-softmax over the vocabulary of the distribution this step's token came from,
    /// when the request asked for it ([`crate::RequestOptions::return_full_logprobs`]).
    pub full_logprobs: Option<Vec<f32>>,
    /// KV slots (tokens) the request holds in the cache after this step: below the number of
    /// tokens seen once eviction has dropped some. A compaction still spread over later steps
    /// (see `Engine::set_compaction_step_budget`) shows in the request's next output.
    pub kv_physical_tokens: usize,
    /// Bytes of the cache blocks the request holds after this step, over every cache group
    /// (a hybrid sliding-window model's windowed layers hold about one window, however long
    /// the request; partly filled blocks count whole).
    pub kv_held_bytes: u64,
    /// Why the request failed, on the output of a request that finished with
    /// [`FinishReason::Error`](crate::sampling::FinishReason::Error).
    pub error: Option<RequestFailure>,
}

/// What ended a request that failed on its own while the others in its step ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The model produced NaN or +inf logits for it (on the device or the host).
    NonFiniteLogits,
    /// Its logits could not be sampled otherwise (every token masked, no logits).
    Sampling,
    /// Its token-eviction compaction failed.
    Compression,
    /// Any other failure confined to this request.
    Internal,
}

/// A request's failure: what kind, and a message for its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFailure {
    /// The kind of failure.
    pub kind: FailureKind,
    /// What happened, for the client and the log.
    pub message: String,
}

impl RequestFailure {
    /// Classifies an engine error that ended one request.
    pub fn from_error(error: &super::EngineError) -> Self {
        use crate::sampling::SamplingError;
        let kind = match error {
            super::EngineError::Sampling(SamplingError::NonFiniteLogit { .. }) => {
                FailureKind::NonFiniteLogits
            }
            super::EngineError::Sampling(_) => FailureKind::Sampling,
            super::EngineError::Compression(_) => FailureKind::Compression,
            _ => FailureKind::Internal,
        };
        RequestFailure {
            kind,
            message: error.to_string(),
        }
    }
}

/// Per-request choices beyond sampling: eviction policy, teacher forcing, full distributions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestOptions {
    /// Token eviction for this request; `None` uses the engine's configured policy.
    pub compression: Option<starling_evict::CompressionConfig>,
    /// Teacher forcing: emit exactly these tokens instead of sampling (each still scored and
    /// reported with its log-probability), then finish with reason `length`.
    pub forced_output_ids: Option<Vec<u32>>,
    /// Report every step's full log-softmax row in [`RequestOutput::full_logprobs`] (quality
    /// measurements; a vocabulary-sized vector per token).
    pub return_full_logprobs: bool,
    /// The context/question split (kvpress's protocol): the prompt's last this many tokens (a
    /// question and the chat template's tail) are never evicted, and the context before them is
    /// compressed once, when the prompt completes, with the question as SnapKV's observation
    /// window; generated tokens are kept. `None`: the whole sequence is compressed as it grows.
    pub question_tokens: Option<usize>,
}
