//! `POST /v1/chat/completions`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use starling_engine::sampling::MAX_TOP_LOGPROBS;
use starling_engine::RequestOutput;
use starling_models::chat::ChatTemplateError;

use super::generation::{
    check_lengths, finish_fields, for_each_output, prepare, submit, token_text,
};
use super::response::ResponseMeta;
use super::sse::{sse_response, ChunkFormatter};
use crate::api_error::ApiError;
use crate::json_body::JsonBody;
use crate::protocol::chat::{
    ChatChoice, ChatDelta, ChatLogprobs, ChatRequest, ChatRequestMessage, ChatTokenLogprob,
};
use crate::protocol::Usage;
use crate::state::AppState;

/// Renders `messages` through the model's chat template, with the request's
/// `chat_template_kwargs` (`kwargs`) as extra template variables, and encodes the result.
pub fn encode_chat(
    state: &AppState,
    messages: &[ChatRequestMessage],
    add_generation_prompt: bool,
    kwargs: &BTreeMap<String, serde_json::Value>,
) -> Result<Vec<u32>, ApiError> {
    let template = state.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions",
            Some("messages"),
        )
    })?;
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let messages = messages
        .iter()
        .map(ChatRequestMessage::to_chat_message)
        .collect::<Result<Vec<_>, _>>()?;
    let text = template
        .render_with_kwargs(&messages, add_generation_prompt, kwargs)
        .map_err(|e| {
            let param = match &e {
                ChatTemplateError::ReservedKwarg { .. } => "chat_template_kwargs",
                _ => "messages",
            };
            ApiError::bad_request(format!("cannot apply the chat template: {e}"), Some(param))
        })?;
    // The template already placed BOS and the other special tokens.
    state.tokenizer.encode(&text, false).map_err(|e| {
        ApiError::bad_request(
            format!("cannot tokenize the conversation: {e}"),
            Some("messages"),
        )
    })
}

/// Handles a chat request, streamed or not.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    state.check_model(request.model.as_deref())?;
    let prompt_ids = {
        let (state, messages) = (state.clone(), request.messages.clone());
        let kwargs = request.chat_template_kwargs.clone().unwrap_or_default();
        prepare(move || encode_chat(&state, &messages, true, &kwargs)).await?
    };
    let (max_tokens, max_param) = match (request.max_completion_tokens, request.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let explicit_max = max_tokens.map(|m| usize::try_from(m).unwrap_or(usize::MAX));
    check_lengths(
        &state,
        prompt_ids.len(),
        explicit_max,
        max_param,
        "messages",
    )?;
    if let Some(top) = request.top_logprobs {
        if top > MAX_TOP_LOGPROBS as u64 {
            return Err(ApiError::bad_request(
                format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}"),
                Some("top_logprobs"),
            ));
        }
    }
    let logprobs = match request.logprobs {
        Some(true) => Some(request.top_logprobs.unwrap_or(0)),
        _ => None,
    };
    let params = request.sampling.to_params(max_tokens, logprobs)?;
    let options = request.sampling.to_options()?;
    let wants_logprobs = params.logprobs.is_some();
    let events = submit(&state, prompt_ids, params, options).await?;
    let meta = ResponseMeta::new(
        &state,
        "chatcmpl",
        wants_logprobs,
        request.stream_options.as_ref(),
    );
    if request.stream.unwrap_or(false) {
        return Ok(sse_response(events, ChatFormatter(meta)));
    }
    let mut text = String::new();
    let mut logprobs = ChatLogprobs::default();
    let names = token_text(&state);
    let last = for_each_output(events, |output| {
        if let Some(lp) = &output.logprob {
            logprobs.content.push(ChatTokenLogprob::new(lp, &names));
        }
        text.push_str(&output.text_delta);
    })
    .await?;
    let (finish_reason, stop_reason) = finish_fields(&last);
    let choice = ChatChoice {
        index: 0,
        message: Some(ChatDelta {
            role: Some("assistant".into()),
            content: Some(text),
        }),
        delta: None,
        logprobs: wants_logprobs.then_some(logprobs),
        finish_reason,
        stop_reason,
    };
    Ok(Json(meta.final_response("chat.completion", choice, &last)).into_response())
}

/// The `object` of a streamed chat chunk.
const CHUNK: &str = "chat.completion.chunk";

/// Streamed chat chunks.
struct ChatFormatter(ResponseMeta);

impl ChunkFormatter for ChatFormatter {
    fn start(&mut self) -> Vec<String> {
        let role = ChatChoice {
            index: 0,
            message: None,
            delta: Some(ChatDelta {
                role: Some("assistant".into()),
                content: Some(String::new()),
            }),
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
        };
        self.0.chunk(CHUNK, vec![role]).into_iter().collect()
    }

    fn output(&mut self, output: &RequestOutput) -> Vec<String> {
        let logprobs = match (&output.logprob, self.0.wants_logprobs) {
            (Some(lp), true) => Some(ChatLogprobs {
                content: vec![ChatTokenLogprob::new(lp, &token_text(&self.0.state))],
            }),
            _ => None,
        };
        let (finish_reason, stop_reason) = finish_fields(output);
        let choice = ChatChoice {
            index: 0,
            message: None,
            delta: Some(ChatDelta {
                role: None,
                content: Some(output.text_delta.clone()),
            }),
            logprobs,
            finish_reason,
            stop_reason,
        };
        self.0.chunk(CHUNK, vec![choice]).into_iter().collect()
    }

    fn usage(&mut self, usage: Usage) -> Option<String> {
        self.0.usage_chunk::<ChatChoice>(CHUNK, usage)
    }
}
