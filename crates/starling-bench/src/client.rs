//! One streamed completion request, timed the way vLLM's benchmark times it.

use std::time::Instant;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::dataset::BenchRequest;
use crate::error::BenchError;

/// What one request measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestResult {
    /// Whether the request finished with a 200 and a complete stream.
    pub success: bool,
    /// Why not, when it failed.
    pub error: Option<String>,
    /// Prompt tokens (the dataset's count).
    pub prompt_len_tokens: usize,
    /// Generated tokens, from the usage chunk (chunks counted when the server sends none).
    pub output_tokens: usize,
    /// Time to the first chunk with a choice, seconds.
    pub ttft_s: f64,
    /// Gaps between consecutive chunks with a choice, seconds.
    pub itl_s: Vec<f64>,
    /// Request sent to stream end, seconds.
    pub latency_s: f64,
}

/// An HTTP client bound to one server and model name.
#[derive(Debug, Clone)]
pub struct StreamClient {
    http: reqwest::Client,
    base_url: String,
    model: String,
}

impl StreamClient {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8000`) asking for `model`.
    pub fn new(base_url: &str, model: &str) -> Self {
        StreamClient {
            http: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
        }
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// GETs `path` and returns the body text (errors on non-200).
    pub async fn get_text(&self, path: &str) -> Result<String, BenchError> {
        let response = self
            .http
            .get(format!("{}{path}", self.base_url))
            .send()
            .await?;
        let status = response.status().as_u16();
        let body = response.text().await?;
        if status != 200 {
            return Err(BenchError::Server {
                what: format!("GET {path}"),
                status,
                body,
            });
        }
        Ok(body)
    }

    async fn post_json(&self, path: &str, body: &Value) -> Result<Value, BenchError> {
        let response = self
            .http
            .post(format!("{}{path}", self.base_url))
            .json(body)
            .send()
            .await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        if status != 200 {
            return Err(BenchError::Server {
                what: format!("POST {path}"),
                status,
                body: text,
            });
        }
        serde_json::from_str(&text).map_err(|source| BenchError::Json {
            context: format!("answer of POST {path}"),
            source,
        })
    }

    /// The server's token count of `text` (no special tokens), via `/tokenize`.
    pub async fn count_tokens(&self, text: &str) -> Result<usize, BenchError> {
        let answer = self
            .post_json(
                "/tokenize",
                &json!({"model": self.model, "prompt": text, "add_special_tokens": false}),
            )
            .await?;
        answer["count"].as_u64().map(|c| c as usize).ok_or_else(|| {
            BenchError::Invalid(format!("/tokenize answered without a count: {answer}"))
        })
    }

    /// The served model's context window, from `/v1/models`.
    pub async fn max_model_len(&self) -> Result<usize, BenchError> {
        let text = self.get_text("/v1/models").await?;
        let models: Value = serde_json::from_str(&text).map_err(|source| BenchError::Json {
            context: "answer of GET /v1/models".into(),
            source,
        })?;
        models["data"][0]["max_model_len"]
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| BenchError::Invalid(format!("/v1/models has no max_model_len: {text}")))
    }

    /// Sends `request` as a streamed greedy completion and times it. Failures are results, not
    /// errors: the benchmark counts them.
    pub async fn send(&self, request: &BenchRequest, ignore_eos: bool) -> RequestResult {
        let body = json!({
            "model": self.model,
            "prompt": request.prompt,
            "max_tokens": request.output_len_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let mut result = RequestResult {
            prompt_len_tokens: request.prompt_len_tokens,
            ..RequestResult::default()
        };
        let started = Instant::now();
        if let Err(message) = self.stream_into(&body, started, &mut result).await {
            result.success = false;
            result.error = Some(message);
        }
        result.latency_s = started.elapsed().as_secs_f64();
        result
    }

    async fn stream_into(
        &self,
        body: &Value,
        started: Instant,
        result: &mut RequestResult,
    ) -> Result<(), String> {
        let response = self
            .http
            .post(format!("{}/v1/completions", self.base_url))
            .json(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {text}"));
        }
        let mut stream = response.bytes_stream();
        let mut buffer = String::new();
        let mut last_chunk_at: Option<Instant> = None;
        let mut chunks_with_choices = 0usize;
        let mut usage_tokens = None;
        let mut done = false;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes.map_err(|e| e.to_string())?;
            let now = Instant::now();
            buffer.push_str(&String::from_utf8_lossy(&bytes));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                    let data = data.trim();
                    if data == "[DONE]" {
                        done = true;
                        continue;
                    }
                    let chunk: Value =
                        serde_json::from_str(data).map_err(|e| format!("bad chunk {data}: {e}"))?;
                    if let Some(error) = chunk.get("error") {
                        return Err(format!("stream error: {error}"));
                    }
                    if chunk["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                        chunks_with_choices += 1;
                        match last_chunk_at {
                            None => result.ttft_s = now.duration_since(started).as_secs_f64(),
                            Some(previous) => result
                                .itl_s
                                .push(now.duration_since(previous).as_secs_f64()),
                        }
                        last_chunk_at = Some(now);
                    }
                    if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
                        usage_tokens = Some(tokens as usize);
                    }
                }
            }
        }
        if !done {
            return Err("the stream ended without [DONE]".into());
        }
        result.output_tokens = usage_tokens.unwrap_or(chunks_with_choices);
        result.success = true;
        Ok(())
    }
}
