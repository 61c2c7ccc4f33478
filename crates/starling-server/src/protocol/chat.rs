//! `/v1/chat/completions` bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use starling_engine::engine::TokenLogprob;
use starling_models::chat::ChatMessage;

use super::common::{GenerationResponse, SamplingFields, StreamOptions};
use super::completion::finite_logprob;
use crate::api_error::ApiError;

/// A chat request.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The model name; absent means the served one.
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<ChatRequestMessage>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (deprecated OpenAI name).
    pub max_tokens: Option<u64>,
    /// Most tokens to generate (current OpenAI name; wins over `max_tokens`).
    pub max_completion_tokens: Option<u64>,
    /// Return the sampled tokens' log-probabilities.
    pub logprobs: Option<bool>,
    /// With `logprobs`, how many alternatives per token (0..=20).
    pub top_logprobs: Option<u64>,
    /// vLLM extra: top-level variables for the chat template (e.g. Qwen3's
    /// `{"enable_thinking": false}`), as transformers' `apply_chat_template(**kwargs)`.
    pub chat_template_kwargs: Option<BTreeMap<String, serde_json::Value>>,
    /// Everything else.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// One message as clients send it.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequestMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Text, or a list of content parts (only text parts are supported).
    pub content: Option<MessageContent>,
}

/// Message content: a string or a list of typed parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type; only `text` is served.
    #[serde(rename = "type")]
    pub part_type: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

impl ChatRequestMessage {
    /// The template's view of this message; non-text parts are a 400.
    pub fn to_chat_message(&self) -> Result<ChatMessage, ApiError> {
        let content = match &self.content {
            None => String::new(),
            Some(MessageContent::Text(text)) => text.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.part_type.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (other, _) => {
                            return Err(ApiError::bad_request(
                                format!(
                                    "content parts of type `{other}` are not supported; send text"
                                ),
                                Some("messages"),
                            ))
                        }
                    }
                }
                text
            }
        };
        Ok(ChatMessage::new(self.role.clone(), content))
    }
}

/// One alternative token in chat logprobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTopLogprob {
    /// Token text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// UTF-8 bytes of the token text.
    pub bytes: Vec<u8>,
}

/// One sampled token in chat logprobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// Token text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// UTF-8 bytes of the token text.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

impl ChatTokenLogprob {
    /// The chat shape of an engine logprob.
    pub fn new(logprob: &TokenLogprob, token_text: &dyn Fn(u32) -> String) -> Self {
        let token = token_text(logprob.token_id);
        ChatTokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: finite_logprob(logprob.logprob),
            top_logprobs: logprob
                .top
                .iter()
                .map(|&(id, lp)| {
                    let token = token_text(id);
                    ChatTopLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob: finite_logprob(lp),
                    }
                })
                .collect(),
        }
    }
}

/// Chat logprobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant message of a full response, or a chunk's delta.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant` in the message and in the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Text (absent in the final chunk's empty delta).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// The whole message (full responses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatDelta>,
    /// The increment (stream chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatDelta>,
    /// Log-probabilities when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `abort` at the end; `null` before.
    pub finish_reason: Option<String>,
    /// The stop string or token id that matched (vLLM's extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

/// A chat response (`chat.completion`) or chunk (`chat.completion.chunk`).
pub type ChatResponse = GenerationResponse<ChatChoice>;
