//! What every response and streamed chunk of one generation request shares, whichever endpoint:
//! the envelope (id, object, creation time, served model, usage) and the client's choices about
//! logprobs and the usage chunk. The endpoints supply only their choices.

use serde::Serialize;
use starling_engine::RequestOutput;

use super::generation::{new_request_id, unix_now_s};
use crate::protocol::common::GenerationResponse;
use crate::protocol::{StreamOptions, Usage};
use crate::state::AppState;

/// One request's response envelope and stream options.
pub struct ResponseMeta {
    /// The server state (served model name, tokenizer for logprob text).
    pub state: AppState,
    /// The request id (`chatcmpl-…`, `cmpl-…`).
    pub id: String,
    /// Unix seconds at the request's start; every chunk carries the same.
    pub created: u64,
    /// Whether the client asked for logprobs.
    pub wants_logprobs: bool,
    /// Whether the stream ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
}

impl ResponseMeta {
    /// A new request's envelope: a fresh id with `id_prefix`, created now.
    pub fn new(
        state: &AppState,
        id_prefix: &str,
        wants_logprobs: bool,
        stream_options: Option<&StreamOptions>,
    ) -> Self {
        Self {
            state: state.clone(),
            id: new_request_id(id_prefix),
            created: unix_now_s(),
            wants_logprobs,
            include_usage: stream_options.is_some_and(|o| o.include_usage),
        }
    }

    /// A response (or chunk) of `object` holding `choices`.
    pub fn response<C>(
        &self,
        object: &str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> GenerationResponse<C> {
        GenerationResponse {
            id: self.id.clone(),
            object: object.into(),
            created: self.created,
            model: self.state.model.served_name.clone(),
            choices,
            usage,
        }
    }

    /// The whole answer of a finished request (`last`, its final output), with its usage.
    pub fn final_response<C>(
        &self,
        object: &str,
        choice: C,
        last: &RequestOutput,
    ) -> GenerationResponse<C> {
        let usage = Usage::new(last.num_prompt_tokens, last.num_output_tokens);
        self.response(object, vec![choice], Some(usage))
    }

    /// One streamed chunk as JSON text; `None` (logged) if it cannot be serialised.
    pub fn chunk<C: Serialize>(&self, object: &str, choices: Vec<C>) -> Option<String> {
        self.serialise(&self.response(object, choices, None))
    }

    /// The usage chunk that ends a stream (no choices), when the client asked for it.
    pub fn usage_chunk<C: Serialize>(&self, object: &str, usage: Usage) -> Option<String> {
        if !self.include_usage {
            return None;
        }
        self.serialise(&self.response::<C>(object, Vec::new(), Some(usage)))
    }

    fn serialise<C: Serialize>(&self, chunk: &GenerationResponse<C>) -> Option<String> {
        serde_json::to_string(chunk)
            .map_err(|e| tracing::error!("serialising a {} chunk: {e}", chunk.object))
            .ok()
    }
}
