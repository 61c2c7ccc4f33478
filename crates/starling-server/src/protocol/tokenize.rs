//! `/tokenize`, `/detokenize` and `/v1/models` bodies (vLLM's shapes).

use serde::{Deserialize, Serialize};

use super::chat::ChatRequestMessage;

/// `/tokenize`: either a prompt or chat messages.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The model name; absent means the served one.
    pub model: Option<String>,
    /// Text to encode.
    pub prompt: Option<String>,
    /// A conversation to render through the chat template and encode.
    pub messages: Option<Vec<ChatRequestMessage>>,
    /// Add BOS etc. to a plain prompt (default true).
    pub add_special_tokens: Option<bool>,
    /// End a rendered conversation with the assistant prompt (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM extra: top-level variables for the chat template, as in a chat request.
    pub chat_template_kwargs: Option<std::collections::BTreeMap<String, serde_json::Value>>,
}

/// `/tokenize` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// The server's context window.
    pub max_model_len: usize,
    /// The ids.
    pub tokens: Vec<u32>,
}

/// `/detokenize` request.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// The model name; absent means the served one.
    pub model: Option<String>,
    /// Ids to decode.
    pub tokens: Vec<u32>,
}

/// `/detokenize` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The served name.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// `starling`.
    pub owned_by: String,
    /// vLLM's field for where the weights came from; here the served name again, since a
    /// client has no business knowing paths on the server.
    pub root: String,
    /// The context window.
    pub max_model_len: usize,
    /// Starling's extension: the KV cache the model is served with (`starling_engine::
    /// CacheReport` as JSON: layout, bytes per token, blocks, longest context), so a benchmark
    /// client can record what it measured against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<serde_json::Value>,
}

/// `/v1/models` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The one served model.
    pub data: Vec<ModelCard>,
}
