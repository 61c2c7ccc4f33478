//! Per-sequence stop conditions: EOS, stop token ids, stop strings and the length limit.

use serde::Serialize;

use super::params::SamplingParams;
use super::stop_strings::{StopStringMatcher, StringMatch};

/// Why a sequence ended, as the OpenAI `finish_reason` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context window was reached.
    Length,
    /// The client or the engine cancelled the request.
    Abort,
    /// The request failed on its own (NaN logits, a failed compaction): its output carries the
    /// [`crate::RequestFailure`] (vLLM's `FinishReason.ERROR`).
    Error,
}

impl FinishReason {
    /// The OpenAI spelling: `"stop"`, `"length"`, `"abort"` or `"error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// Which stop condition ended a [`FinishReason::Stop`] sequence (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopMatch {
    /// The model's end-of-sequence token (vLLM reports `stop_reason: null`).
    EosToken,
    /// One of the request's `stop_token_ids`.
    StopTokenId(u32),
    /// One of the request's `stop` strings.
    StopString(String),
}

/// How a sequence finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The OpenAI finish reason.
    pub reason: FinishReason,
    /// What matched, for [`FinishReason::Stop`]; `None` otherwise.
    pub stop_match: Option<StopMatch>,
}

/// The result of feeding one token to a [`StopChecker`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopUpdate {
    /// Text that may be streamed to the client now (possibly empty while text is held back).
    pub text: String,
    /// Set once the sequence is finished; the engine must not sample it further.
    pub finished: Option<Finished>,
}

/// Decides, token by token, what output text to stream and when a sequence ends.
///
/// Text that could be the start of a stop string is held back until the next tokens show
/// whether it is; a matched stop string is cut off (unless `include_stop_str_in_output`), as is the
/// text of an EOS or stop token. Stop checks run in vLLM's order: EOS, stop token ids, stop strings,
/// then length; EOS, stop ids and stop strings are ignored until `min_tokens` tokens (counting the
/// current one) have been generated.
#[derive(Debug, Clone)]
pub struct StopChecker {
    eos_token_ids: Vec<u32>,
    stop_token_ids: Vec<u32>,
    min_tokens: usize,
    max_output_tokens: usize,
    include_stop_in_output: bool,
    generated_tokens: usize,
    strings: StopStringMatcher,
    finished: Option<Finished>,
}

impl StopChecker {
    /// A checker for one sequence of a request with `params`, for a model whose EOS tokens are
    /// `eos_token_ids`. `max_output_tokens` is the resolved length limit, usually
    /// `params.resolve_max_tokens(context_window - prompt_tokens)`.
    pub fn new(params: &SamplingParams, eos_token_ids: &[u32], max_output_tokens: usize) -> Self {
        StopChecker {
            eos_token_ids: if params.ignore_eos {
                Vec::new()
            } else {
                eos_token_ids.to_vec()
            },
            stop_token_ids: params.stop_token_ids.clone(),
            min_tokens: params.min_tokens,
            max_output_tokens,
            include_stop_in_output: params.include_stop_str_in_output,
            generated_tokens: 0,
            strings: StopStringMatcher::new(&params.stop, params.include_stop_str_in_output),
            finished: None,
        }
    }

    /// Feeds the sampled `token_id` and the text it added to the detokenised output.
    ///
    /// When this update finishes the sequence for any reason other than a stop string, its `text`
    /// already includes everything held back. Calls after the sequence finished emit nothing and
    /// repeat the finish.
    pub fn push(&mut self, token_id: u32, new_text: &str) -> StopUpdate {
        if let Some(finished) = &self.finished {
            return StopUpdate {
                text: String::new(),
                finished: Some(finished.clone()),
            };
        }
        self.generated_tokens += 1;
        let may_stop = self.generated_tokens >= self.min_tokens;

        if let Some(stop_match) = self.stop_token_match(token_id).filter(|_| may_stop) {
            let mut text = self.strings.take_held();
            if self.include_stop_in_output {
                text.push_str(new_text);
            }
            return self.finish(text, FinishReason::Stop, Some(stop_match));
        }
        match self.strings.push(new_text, may_stop) {
            StringMatch::Matched { text, stop } => {
                self.finish(text, FinishReason::Stop, Some(StopMatch::StopString(stop)))
            }
            StringMatch::Released(mut text) => {
                if self.generated_tokens >= self.max_output_tokens {
                    text.push_str(&self.strings.take_held());
                    self.finish(text, FinishReason::Length, None)
                } else {
                    StopUpdate {
                        text,
                        finished: None,
                    }
                }
            }
        }
    }

    /// Releases text still held back, for a sequence the engine ends itself (abort, context full).
    /// Returns an empty string when nothing is held, including after a stop-string match (the held
    /// text was the stop string).
    pub fn flush(&mut self) -> String {
        self.strings.take_held()
    }

    /// How the sequence finished, once it has.
    pub fn finished(&self) -> Option<&Finished> {
        self.finished.as_ref()
    }

    /// Tokens fed so far.
    pub fn generated_tokens(&self) -> usize {
        self.generated_tokens
    }

    fn stop_token_match(&self, token_id: u32) -> Option<StopMatch> {
        if self.eos_token_ids.contains(&token_id) {
            Some(StopMatch::EosToken)
        } else if self.stop_token_ids.contains(&token_id) {
            Some(StopMatch::StopTokenId(token_id))
        } else {
            None
        }
    }

    fn finish(
        &mut self,
        text: String,
        reason: FinishReason,
        stop_match: Option<StopMatch>,
    ) -> StopUpdate {
        let finished = Finished { reason, stop_match };
        self.finished = Some(finished.clone());
        StopUpdate {
            text,
            finished: Some(finished),
        }
    }
}
