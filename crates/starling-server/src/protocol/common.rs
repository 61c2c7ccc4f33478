//! Pieces shared by the completion and chat bodies.

use serde::{Deserialize, Serialize};
use starling_engine::sampling::SamplingParams;
use starling_engine::RequestOptions;

use crate::api_error::ApiError;

/// A prompt as OpenAI accepts it: text, token ids, or a one-element batch of either.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Plain text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of texts (only one is served per request).
    Texts(Vec<String>),
    /// A batch of token-id lists (only one is served per request).
    TokenBatches(Vec<Vec<u32>>),
}

/// The prompt of a request once batches of one are unwrapped.
#[derive(Debug, Clone, PartialEq)]
pub enum SinglePrompt {
    /// Text to encode (with the tokenizer's special tokens).
    Text(String),
    /// Ready token ids.
    Tokens(Vec<u32>),
}

impl PromptInput {
    /// The one prompt; batches of several are refused (n=1 serving, one choice per response).
    pub fn single(self) -> Result<SinglePrompt, ApiError> {
        let batch_error = |len: usize| {
            ApiError::bad_request(
                format!(
                    "prompt batches are not supported: got {len} prompts, send one per request"
                ),
                Some("prompt"),
            )
        };
        match self {
            PromptInput::Text(text) => Ok(SinglePrompt::Text(text)),
            PromptInput::Tokens(ids) => Ok(SinglePrompt::Tokens(ids)),
            PromptInput::Texts(mut texts) if texts.len() == 1 => {
                Ok(SinglePrompt::Text(texts.remove(0)))
            }
            PromptInput::Texts(texts) => Err(batch_error(texts.len())),
            PromptInput::TokenBatches(mut batches) if batches.len() == 1 => {
                Ok(SinglePrompt::Tokens(batches.remove(0)))
            }
            PromptInput::TokenBatches(batches) => Err(batch_error(batches.len())),
        }
    }
}

/// `stop` as a string or a list of strings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A generation response or one streamed chunk, either endpoint's: the envelope is OpenAI's for
/// both, only the choices differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationResponse<C> {
    /// Request id.
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// One choice (none in a usage-only chunk).
    pub choices: Vec<C>,
    /// Token counts (always in a full response; in the stream only in the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields common to both endpoints, OpenAI names plus vLLM's extras. Absent or `null`
/// fields take the engine defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SamplingFields {
    /// Softmax temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k; `-1` or `0` mean off.
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Seed of the request's own random stream.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Stop token ids.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep generating past EOS.
    pub ignore_eos: Option<bool>,
    /// Tokens before a stop may end the request.
    pub min_tokens: Option<u64>,
    /// HF repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Drop special tokens from the text.
    pub skip_special_tokens: Option<bool>,
    /// Keep the matched stop string in the output.
    pub include_stop_str_in_output: Option<bool>,
    /// Choices per prompt; only 1 is served.
    pub n: Option<u64>,
    /// Starling extra: this request's token-eviction policy (the `--kv-compression` JSON),
    /// overriding the server's.
    pub kv_compression: Option<serde_json::Value>,
}

impl SamplingFields {
    /// Engine options beyond sampling: the request's eviction policy, validated (400 naming
    /// `kv_compression` when it does not parse).
    pub fn to_options(&self) -> Result<RequestOptions, ApiError> {
        let compression = match &self.kv_compression {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(
                starling_evict::CompressionConfig::from_value(value).map_err(|e| {
                    ApiError::bad_request(format!("kv_compression: {e}"), Some("kv_compression"))
                })?,
            ),
        };
        Ok(RequestOptions {
            compression,
            ..RequestOptions::default()
        })
    }

    /// Engine parameters for these fields plus the endpoint-specific `max_tokens` and `logprobs`.
    pub fn to_params(
        &self,
        max_tokens: Option<u64>,
        logprobs: Option<u64>,
    ) -> Result<SamplingParams, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::bad_request(
                    format!("n must be 1 (this server returns one choice per request), got {n}"),
                    Some("n"),
                ));
            }
        }
        let defaults = SamplingParams::default();
        let to_usize = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self
                .top_k
                .filter(|&k| k > 0)
                .map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            seed: self.seed,
            max_tokens: max_tokens.map(to_usize),
            min_tokens: self.min_tokens.map_or(0, to_usize),
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(list)) => list.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs: logprobs.map(to_usize),
            skip_special_tokens: self
                .skip_special_tokens
                .unwrap_or(defaults.skip_special_tokens),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
        })
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of a request with these counts.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_map_to_params_with_openai_defaults() {
        let fields: SamplingFields = serde_json::from_str(
            r#"{"temperature": 0, "top_k": -1, "stop": "\n", "seed": 3, "ignore_eos": true,
                "min_tokens": 2, "repetition_penalty": 1.1, "min_p": 0.05, "unknown": [1]}"#,
        )
        .unwrap();
        let params = fields.to_params(Some(7), Some(2)).unwrap();
        assert_eq!(params.temperature, 0.0);
        assert_eq!(params.top_k, None);
        assert_eq!(params.stop, vec!["\n".to_string()]);
        assert_eq!(params.seed, Some(3));
        assert!(params.ignore_eos);
        assert_eq!(params.min_tokens, 2);
        assert_eq!(params.max_tokens, Some(7));
        assert_eq!(params.logprobs, Some(2));
        assert_eq!(params.repetition_penalty, 1.1);
        assert_eq!(params.min_p, 0.05);
        assert_eq!(params.top_p, 1.0);
    }

    #[test]
    fn n_above_one_is_a_400_naming_n() {
        let fields = SamplingFields {
            n: Some(2),
            ..SamplingFields::default()
        };
        let err = fields.to_params(None, None).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("n"));
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn prompt_shapes_unwrap_batches_of_one_only() {
        let one: PromptInput = serde_json::from_str(r#"["hi"]"#).unwrap();
        assert_eq!(one.single().unwrap(), SinglePrompt::Text("hi".into()));
        let ids: PromptInput = serde_json::from_str("[1, 2, 3]").unwrap();
        assert_eq!(ids.single().unwrap(), SinglePrompt::Tokens(vec![1, 2, 3]));
        let nested: PromptInput = serde_json::from_str("[[4, 5]]").unwrap();
        assert_eq!(nested.single().unwrap(), SinglePrompt::Tokens(vec![4, 5]));
        let two: PromptInput = serde_json::from_str(r#"["a", "b"]"#).unwrap();
        assert_eq!(two.single().unwrap_err().param.as_deref(), Some("prompt"));
    }
}
