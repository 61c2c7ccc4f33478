//! `POST /v1/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use starling_engine::RequestOutput;

use super::generation::{
    check_lengths, check_token_ids, finish_fields, for_each_output, prepare, submit, token_text,
};
use super::response::ResponseMeta;
use super::sse::{sse_response, ChunkFormatter};
use crate::api_error::ApiError;
use crate::json_body::JsonBody;
use crate::protocol::common::SinglePrompt;
use crate::protocol::completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, DEFAULT_COMPLETION_MAX_TOKENS,
};
use crate::protocol::Usage;
use crate::state::AppState;

/// Handles a completion request, streamed or not.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(request.model.as_deref())?;
    if request.echo == Some(true) {
        return Err(ApiError::bad_request("echo is not supported", Some("echo")));
    }
    let prompt_ids = match request.prompt.clone().single()? {
        SinglePrompt::Text(text) => {
            let tokenizer = state.tokenizer.clone();
            prepare(move || {
                tokenizer.encode(&text, true).map_err(|e| {
                    ApiError::bad_request(
                        format!("cannot tokenize the prompt: {e}"),
                        Some("prompt"),
                    )
                })
            })
            .await?
        }
        SinglePrompt::Tokens(ids) => {
            check_token_ids(&state, &ids, "prompt")?;
            ids
        }
    };
    let explicit_max = request
        .max_tokens
        .map(|m| usize::try_from(m).unwrap_or(usize::MAX));
    check_lengths(
        &state,
        prompt_ids.len(),
        explicit_max,
        "max_tokens",
        "prompt",
    )?;
    // The implicit default of 16 shrinks to the room left instead of failing.
    let room = state.engine.info().max_model_len_tokens - prompt_ids.len();
    let max_tokens = request
        .max_tokens
        .unwrap_or_else(|| DEFAULT_COMPLETION_MAX_TOKENS.min(room as u64));
    let params = request
        .sampling
        .to_params(Some(max_tokens), request.logprobs)?;
    let options = request.sampling.to_options()?;
    let wants_logprobs = params.logprobs.is_some();
    let events = submit(&state, prompt_ids, params, options).await?;
    let meta = ResponseMeta::new(
        &state,
        "cmpl",
        wants_logprobs,
        request.stream_options.as_ref(),
    );
    if request.stream.unwrap_or(false) {
        let formatter = CompletionFormatter {
            meta,
            text_chars: 0,
        };
        return Ok(sse_response(events, formatter));
    }
    let mut text = String::new();
    let mut logprobs = CompletionLogprobs::default();
    let names = token_text(&state);
    let last = for_each_output(events, |output| {
        if let Some(lp) = &output.logprob {
            logprobs.push(lp, text.chars().count(), &names);
        }
        text.push_str(&output.text_delta);
    })
    .await?;
    let (finish_reason, stop_reason) = finish_fields(&last);
    let choice = CompletionChoice {
        index: 0,
        text,
        logprobs: wants_logprobs.then_some(logprobs),
        finish_reason,
        stop_reason,
    };
    Ok(Json(meta.final_response(OBJECT, choice, &last)).into_response())
}

/// The `object` of a completion response and of each of its streamed chunks.
const OBJECT: &str = "text_completion";

/// Streamed completion chunks.
struct CompletionFormatter {
    meta: ResponseMeta,
    /// Characters streamed so far (logprob text offsets).
    text_chars: usize,
}

impl ChunkFormatter for CompletionFormatter {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn output(&mut self, output: &RequestOutput) -> Vec<String> {
        // An abort without a token and without text still needs its finish chunk; a prompt-only
        // step never reaches here (the engine reports only sampled tokens and finishes).
        let logprobs = match (&output.logprob, self.meta.wants_logprobs) {
            (Some(lp), true) => {
                let mut entry = CompletionLogprobs::default();
                entry.push(lp, self.text_chars, &token_text(&self.meta.state));
                Some(entry)
            }
            _ => None,
        };
        self.text_chars += output.text_delta.chars().count();
        let (finish_reason, stop_reason) = finish_fields(output);
        let choice = CompletionChoice {
            index: 0,
            text: output.text_delta.clone(),
            logprobs,
            finish_reason,
            stop_reason,
        };
        self.meta.chunk(OBJECT, vec![choice]).into_iter().collect()
    }

    fn usage(&mut self, usage: Usage) -> Option<String> {
        self.meta.usage_chunk::<CompletionChoice>(OBJECT, usage)
    }
}
