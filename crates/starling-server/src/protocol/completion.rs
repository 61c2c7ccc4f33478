//! `/v1/completions` bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use starling_engine::engine::TokenLogprob;

use super::common::{GenerationResponse, PromptInput, SamplingFields, StreamOptions};

/// vLLM's default `max_tokens` for completions when the request gives none (OpenAI's too).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u64 = 16;

/// A completion request.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The model name; absent means the served one.
    pub model: Option<String>,
    /// The prompt.
    pub prompt: PromptInput,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (default 16).
    pub max_tokens: Option<u64>,
    /// Top log-probabilities per token (0..=20).
    pub logprobs: Option<u64>,
    /// Repeat the prompt in the answer (not supported: must be false).
    pub echo: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// Log-probabilities in the legacy completions shape (parallel lists).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// Per token, the most likely alternatives by text.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the completion text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token whose text starts at `text_offset` characters into the completion.
    pub fn push(
        &mut self,
        logprob: &TokenLogprob,
        text_offset: usize,
        token_text: &dyn Fn(u32) -> String,
    ) {
        self.tokens.push(token_text(logprob.token_id));
        self.token_logprobs.push(finite_logprob(logprob.logprob));
        self.top_logprobs.push(
            logprob
                .top
                .iter()
                .map(|&(id, lp)| (token_text(id), finite_logprob(lp)))
                .collect(),
        );
        self.text_offset.push(text_offset);
    }
}

/// JSON has no -inf; vLLM reports impossible tokens as -9999.
pub fn finite_logprob(logprob: f32) -> f32 {
    logprob.max(-9999.0)
}

/// One choice of a completion (or a completion chunk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// The text (the whole completion, or this chunk's delta).
    pub text: String,
    /// Log-probabilities when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop`, `length` or `abort` on the last choice; `null` before.
    pub finish_reason: Option<String>,
    /// The stop string or token id that matched (vLLM's extension).
    pub stop_reason: Option<serde_json::Value>,
}

/// A completion response, or one streamed chunk (same shape, `text_completion` both).
pub type CompletionResponse = GenerationResponse<CompletionChoice>;
