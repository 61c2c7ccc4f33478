//! Fuzzing request bodies (issue 23) with the stable-Rust mutation fuzzer of `starling-fuzz`,
//! seeded from `fuzz/corpus/request_body`: byte and structural JSON mutations, each for a
//! bounded time (`STARLING_FUZZ_SECONDS`). Two targets:
//! - the parsing and validation every handler does (fast, many cases);
//! - whole requests to a live server on the tiny model: whatever the body, the answer is never
//!   a 5xx, and every error has OpenAI's shape.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::{start, Setup, TestServer};
use serde_json::Value;
use starling_fuzz::{Budget, Target, Verdict};
use starling_models::chat::ChatTemplate;
use starling_server::json_body::parse_json;
use starling_server::protocol::chat::ChatRequest;
use starling_server::protocol::completion::CompletionRequest;
use starling_server::protocol::tokenize::{DetokenizeRequest, TokenizeRequest};

/// Mutation time per target in CI (both run at once).
const DEFAULT_SECONDS: u64 = 25;
/// SmolLM2's vocabulary, for validating token ids and stop ids.
const VOCAB: usize = 49_152;
/// Most tokens a fuzzed request may ask the live server for (the rest of the body is kept).
const MAX_GENERATED_TOKENS: u64 = 4;

/// Request fields, for structural mutations.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "echo",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "kv_compression",
    "method",
    "ratio",
    "window_tokens",
    "sink_tokens",
    "every_n_tokens",
    "star_kv",
    "tokens",
    "add_special_tokens",
    "add_generation_prompt",
];

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/request_body")
}

fn target(name: &str) -> Target {
    Target::new(name, corpus())
        .dictionary(&[
            b"\"messages\": [{\"role\": \"user\", \"content\": \"",
            b"\"prompt\": ",
            b"\"max_tokens\": ",
            b"\"logprobs\": ",
            b"\"stream\": true",
            b"null",
            b"-1",
            b"1e309",
            b"18446744073709551616",
            b"[[",
            b"\\u0000",
            b"\\ud800",
        ])
        .json(FIELDS)
        .max_len(32 << 10)
}

fn budget() -> Budget {
    Budget::from_env(Duration::from_secs(DEFAULT_SECONDS))
}

fn template() -> &'static ChatTemplate {
    static TEMPLATE: OnceLock<ChatTemplate> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let source = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fuzz/corpus/chat_template/smollm2-135m.jinja"),
        )
        .unwrap();
        ChatTemplate::new(&source, "<|im_start|>", "<|im_end|>").unwrap()
    })
}

/// What the handlers do with a body before the engine: parse, unwrap the prompt, turn sampling
/// fields into validated engine parameters, render chat messages.
fn parse_and_validate(bytes: &[u8]) -> Verdict {
    let mut accepted = false;
    if let Ok(request) = parse_json::<CompletionRequest>(bytes) {
        let prompt_ok = request.prompt.clone().single().is_ok();
        let params = request
            .sampling
            .to_params(request.max_tokens, request.logprobs);
        let params_ok = params.is_ok_and(|p| p.validate(VOCAB).is_ok());
        let options_ok = request.sampling.to_options().is_ok();
        accepted |= prompt_ok && params_ok && options_ok;
    }
    if let Ok(request) = parse_json::<ChatRequest>(bytes) {
        let messages: Result<Vec<_>, _> = request
            .messages
            .iter()
            .map(|m| m.to_chat_message())
            .collect();
        if let Ok(messages) = messages {
            accepted |= template().render(&messages, true).is_ok();
        }
        let _ = request.sampling.to_params(request.max_tokens, None);
    }
    accepted |= parse_json::<TokenizeRequest>(bytes).is_ok();
    accepted |= parse_json::<DetokenizeRequest>(bytes).is_ok();
    if accepted {
        Verdict::Accepted
    } else {
        Verdict::Rejected
    }
}

#[test]
fn fuzz_request_body_parsing_and_validation() {
    let report = target("request_body").run(budget(), parse_and_validate);
    assert!(report.accepted > 0, "no seed parses: {report}");
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(Setup::tiny()))
}

/// Caps the generation a body asks for, so each case stays cheap; other fields are untouched.
fn cap_generation(bytes: &[u8]) -> Vec<u8> {
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(bytes) else {
        return bytes.to_vec();
    };
    for field in ["max_tokens", "max_completion_tokens"] {
        let too_many = match body.get(field) {
            Some(Value::Null) => true,
            Some(value) => value.as_u64().is_some_and(|n| n > MAX_GENERATED_TOKENS),
            None => false,
        };
        if too_many {
            body.insert(field.into(), Value::from(MAX_GENERATED_TOKENS));
        }
    }
    if body.contains_key("prompt") || body.contains_key("messages") {
        body.entry("max_tokens")
            .or_insert(Value::from(MAX_GENERATED_TOKENS));
    }
    serde_json::to_vec(&body).unwrap_or_else(|_| bytes.to_vec())
}

#[test]
fn fuzz_requests_to_a_live_server_never_get_a_5xx() {
    let base = server().base_url.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
    ];
    let next_path = std::sync::atomic::AtomicUsize::new(0);
    let report = target("request_body_http").run(budget(), |bytes| {
        let body = cap_generation(bytes);
        let path =
            paths[next_path.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % paths.len()];
        let (status, text) = runtime.block_on(async {
            let response = client
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("the server answers every body");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        });
        assert!(
            status < 500,
            "{path} answered {status}: {text}\nbody: {}",
            String::from_utf8_lossy(&body)
        );
        if status == 200 {
            return Verdict::Accepted;
        }
        let error: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path} {status} is not JSON ({e}): {text}"));
        assert!(
            error["error"]["message"].is_string() && error["error"]["type"].is_string(),
            "{path} {status} is not an OpenAI error: {text}"
        );
        Verdict::Rejected
    });
    assert!(report.accepted > 0, "no seed was served: {report}");
}
