//! What both generation endpoints share: length checks, submission, collecting a full answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use starling_engine::sampling::{SamplingParams, StopMatch};
use starling_engine::RequestOptions;
use starling_engine::RequestOutput;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api_error::ApiError;
use crate::engine_thread::RequestEvent;
use crate::state::AppState;

/// Runs CPU-heavy request preparation (tokenizing a long prompt, rendering a chat template) on
/// the blocking pool, so a large request never holds one of the few async workers every other
/// connection needs.
pub async fn prepare<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Unix time now, seconds.
pub fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A process-unique response id such as `cmpl-5f3a…-17`.
pub fn new_request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start_nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{start_nanos:08x}{:06x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Refuses prompts that leave no room in the context window, and explicit output limits that
/// overflow it (vLLM's rule and message). `max_tokens_param` names the field that set the limit.
pub fn check_lengths(
    state: &AppState,
    num_prompt_tokens: usize,
    max_tokens: Option<usize>,
    max_tokens_param: &str,
    prompt_param: &str,
) -> Result<(), ApiError> {
    let max_model_len = state.engine.info().max_model_len_tokens;
    if num_prompt_tokens == 0 {
        return Err(ApiError::bad_request(
            "the prompt is empty",
            Some(prompt_param),
        ));
    }
    if num_prompt_tokens >= max_model_len {
        return Err(ApiError::bad_request(
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your \
                 request has {num_prompt_tokens} input tokens, which leaves no room for output. \
                 Please reduce the length of the input."
            ),
            Some(prompt_param),
        ));
    }
    if let Some(max_tokens) = max_tokens {
        if max_tokens.saturating_add(num_prompt_tokens) > max_model_len {
            return Err(ApiError::bad_request(
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you \
                     requested {} tokens ({num_prompt_tokens} in the input, {max_tokens} in the \
                     completion). Please reduce the length of the input or of the completion.",
                    num_prompt_tokens.saturating_add(max_tokens)
                ),
                Some(max_tokens_param),
            ));
        }
    }
    Ok(())
}

/// Checks token ids against the vocabulary.
pub fn check_token_ids(state: &AppState, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = state.engine.info().vocab_size;
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(bad) => Err(ApiError::bad_request(
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
            Some(param),
        )),
        None => Ok(()),
    }
}

/// Validates `params` (400 naming the field), then queues the request and waits for the engine
/// to accept it, so a refusal is still an HTTP error and not a broken stream.
pub async fn submit(
    state: &AppState,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    options: RequestOptions,
) -> Result<UnboundedReceiver<RequestEvent>, ApiError> {
    params
        .validate(state.engine.info().vocab_size)
        .map_err(|e| ApiError::bad_request(e.to_string(), e.field()))?;
    let mut events = state
        .engine
        .submit(prompt_ids, params, options)
        .ok_or_else(|| ApiError::unavailable("the engine is shutting down"))?;
    match events.recv().await {
        Some(RequestEvent::Accepted) => Ok(events),
        Some(RequestEvent::Rejected(e)) => Err(ApiError::from_engine(&e)),
        Some(RequestEvent::Failed(error)) => Err(error),
        Some(RequestEvent::Output(_)) => Err(ApiError::internal(
            "the engine sent an output before accepting the request",
        )),
        None => Err(ApiError::unavailable("the engine is shutting down")),
    }
}

/// The OpenAI `finish_reason` and vLLM `stop_reason` of a finished output.
pub fn finish_fields(output: &RequestOutput) -> (Option<String>, Option<serde_json::Value>) {
    match &output.finished {
        None => (None, None),
        Some(finished) => {
            let stop_reason = match &finished.stop_match {
                Some(StopMatch::StopString(s)) => Some(serde_json::Value::from(s.clone())),
                Some(StopMatch::StopTokenId(id)) => Some(serde_json::Value::from(*id)),
                Some(StopMatch::EosToken) | None => None,
            };
            (Some(finished.reason.as_str().to_owned()), stop_reason)
        }
    }
}

/// Calls `on_output` for every output until the request finishes; errors if the engine failed
/// or went away first.
pub async fn for_each_output(
    mut events: UnboundedReceiver<RequestEvent>,
    mut on_output: impl FnMut(&RequestOutput),
) -> Result<RequestOutput, ApiError> {
    loop {
        match events.recv().await {
            Some(RequestEvent::Output(output)) => {
                on_output(&output);
                if output.finished.is_some() {
                    return Ok(output);
                }
            }
            Some(RequestEvent::Failed(error)) => return Err(error),
            Some(RequestEvent::Accepted) | Some(RequestEvent::Rejected(_)) => {}
            None => {
                return Err(ApiError::unavailable(
                    "the engine stopped before the request finished",
                ))
            }
        }
    }
}

/// The text of one token as logprob entries show it (special tokens spelled out).
pub fn token_text(state: &AppState) -> impl Fn(u32) -> String + '_ {
    move |id| state.tokenizer.decode(&[id], false).unwrap_or_default()
}
