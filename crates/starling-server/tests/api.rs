//! The OpenAI endpoints against a real SmolLM2 server: shapes, streaming, logprobs, errors.
//! Tests here share one server and may run in parallel, so none checks global block counts
//! (tests/load.rs does, on its own server).

mod common;

use std::sync::OnceLock;

use common::{
    json_of, metric, metrics_text, post, sse_chunks, start_server, TestServer, MODEL_NAME,
};
use serde_json::{json, Value};

const MAX_MODEL_LEN: usize = 256;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_server(MAX_MODEL_LEN, 48, 32))
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_non_stream_and_stream_agree_greedily() {
    let base = &server().base_url;
    let request = json!({
        "model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0
    });
    let (status, body) = post(&client(), base, "/v1/completions", &request).await;
    assert_eq!(status, 200, "{body}");
    let full = json_of(&body);
    assert_eq!(full["object"], "text_completion");
    assert_eq!(full["model"], MODEL_NAME);
    let text = full["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(
        text.contains("Paris"),
        "greedy SmolLM2 names Paris: {text:?}"
    );
    let usage = &full["usage"];
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 8
    );

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, body) = post(&client(), base, "/v1/completions", &streamed).await;
    assert_eq!(status, 200, "{body}");
    let chunks = sse_chunks(&body);
    let (usage_chunk, token_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage_chunk["usage"], *usage);
    assert_eq!(token_chunks.len(), 8, "one chunk per generated token");
    let joined: String = token_chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text, "stream and non-stream greedy outputs differ");
    assert_eq!(
        token_chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(token_chunks[0]["choices"][0]["finish_reason"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_non_stream_and_stream_agree_greedily() {
    let base = &server().base_url;
    let request = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_completion_tokens": 12, "temperature": 0, "seed": 1
    });
    let (status, body) = post(&client(), base, "/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{body}");
    let full = json_of(&body);
    assert_eq!(full["object"], "chat.completion");
    let message = &full["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let content = message["content"].as_str().unwrap().to_owned();
    assert!(content.contains("Paris"), "{content:?}");
    let completion_tokens = full["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion_tokens));

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, body) = post(&client(), base, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200, "{body}");
    let chunks = sse_chunks(&body);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "usage only when asked"
    );
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, content);
    assert_eq!(
        chunks.len() as u64,
        completion_tokens + 1,
        "role chunk + one per token"
    );
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_token_ids_stop_and_extra_fields() {
    let base = &server().base_url;
    let tokenized = post(
        &client(),
        base,
        "/tokenize",
        &json!({"prompt": "The capital of France is"}),
    )
    .await;
    assert_eq!(tokenized.0, 200, "{}", tokenized.1);
    let ids = json_of(&tokenized.1)["tokens"].clone();
    assert_eq!(json_of(&tokenized.1)["max_model_len"], MAX_MODEL_LEN);

    // Token-id prompt, top-3 logprobs.
    let (status, body) = post(
        &client(),
        base,
        "/v1/completions",
        &json!({
            "prompt": ids, "max_tokens": 3, "temperature": 0, "logprobs": 3
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let full = json_of(&body);
    let logprobs = &full["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 3);
    let first_top = logprobs["top_logprobs"][0].as_object().unwrap();
    assert_eq!(first_top.len(), 3);
    // Greedy: the chosen token is the most likely one.
    let best = first_top
        .values()
        .map(|v| v.as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert!((logprobs["token_logprobs"][0].as_f64().unwrap() - best).abs() < 1e-5);
    assert_eq!(
        logprobs["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        full["choices"][0]["text"].as_str().unwrap()
    );

    // Chat logprobs with top_logprobs.
    let (status, body) = post(
        &client(),
        base,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
            "max_tokens": 2, "temperature": 0, "logprobs": true, "top_logprobs": 2
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let content = &json_of(&body)["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().unwrap().len(), 2);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);

    // A stop string cuts the text and is reported as vLLM's stop_reason; extra fields accepted.
    let (status, body) = post(&client(), base, "/v1/completions", &json!({
        "prompt": "1, 2, 3, 4,", "max_tokens": 20, "temperature": 0, "stop": [" 7"],
        "ignore_eos": true, "min_tokens": 1, "repetition_penalty": 1.0, "min_p": 0.0, "top_k": -1,
        "top_p": 1.0, "seed": 5, "some_future_field": {"x": 1}
    })).await;
    assert_eq!(status, 200, "{body}");
    let choice = &json_of(&body)["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert_eq!(choice["stop_reason"], " 7");
    assert!(!choice["text"].as_str().unwrap().contains('7'), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_is_reproducible() {
    let base = &server().base_url;
    let request = json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.9,
                         "top_p": 0.95, "top_k": 40, "seed": 1234, "ignore_eos": true});
    let (_, first) = post(&client(), base, "/v1/completions", &request).await;
    let (_, second) = post(&client(), base, "/v1/completions", &request).await;
    assert_eq!(
        json_of(&first)["choices"][0]["text"],
        json_of(&second)["choices"][0]["text"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_detokenize_metrics() {
    let base = &server().base_url;
    let client = client();
    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL_NAME);
    assert_eq!(models["data"][0]["max_model_len"], MAX_MODEL_LEN);
    // Starling's extension: the cache the model is served with, as the engine reports it.
    let cache = &models["data"][0]["kv_cache"];
    assert_eq!(cache["kind"], "full");
    assert_eq!(cache["num_blocks"], server().info.kv_blocks_total);
    assert_eq!(cache["latent_layers"], 0);
    assert!(
        cache["longest_context_tokens"].as_u64().unwrap() > 0,
        "{cache}"
    );

    let (status, body) = post(
        &client,
        base,
        "/tokenize",
        &json!({"prompt": "Hello world", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tokens = json_of(&body)["tokens"].clone();
    let (status, body) = post(&client, base, "/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["prompt"], "Hello world");
    let (status, body) = post(
        &client,
        base,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        json_of(&body)["count"].as_u64().unwrap() > 3,
        "template adds role markers: {body}"
    );

    let text = metrics_text(&client, base).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "starling:kv_blocks_used",
        "starling:kv_blocks_total",
        "starling:decode_steps_total",
        "starling:decode_batch_size_sum",
        "starling:decode_steps_batch1_total",
        "starling:kv_cache_info",
        "starling:kv_cache_bytes_per_token",
        "starling:kv_cache_longest_context_tokens",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ] {
        metric(&text, name);
    }
    assert_eq!(
        metric(&text, "starling:kv_blocks_total"),
        server().info.kv_blocks_total as f64
    );
    // SmolLM2 on the CPU: 30 layers × K+V × 3 heads × 64 × f32.
    assert_eq!(metric(&text, "starling:kv_cache_bytes_per_token"), 46080.0);
    assert!(
        text.contains("starling:kv_cache_info{kind=\"full\",dtype=\"f32\",num_layers=\"30\",latent_layers=\"0\"} 1"),
        "{text}"
    );
}

/// Every bad request gets an OpenAI error body with the right status, and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_4xx_with_openai_bodies() {
    let base = &server().base_url;
    let client = client();
    let long_prompt = "word ".repeat(400);
    let cases: Vec<(&str, Value, u16, Option<&str>, &str)> = vec![
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": "ten"}),
            400,
            Some("max_tokens"),
            "invalid request body",
        ),
        (
            "/v1/completions",
            json!({"prompt": 5}),
            400,
            Some("prompt"),
            "invalid request body",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": -3}),
            400,
            Some("max_tokens"),
            "invalid request body",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": "hot"}),
            400,
            Some("temperature"),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 7}]}),
            400,
            Some("messages"),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                   "top_logprobs": 25}),
            400,
            Some("top_logprobs"),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 1_000_000_000u64}),
            400,
            Some("max_tokens"),
            "maximum context length is 256",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 0}),
            400,
            Some("max_tokens"),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "n": 2}),
            400,
            Some("n"),
            "n must be 1",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": -1}),
            400,
            Some("temperature"),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "top_p": 1.5}),
            400,
            Some("top_p"),
            "top_p",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 50}),
            400,
            Some("logprobs"),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "min_tokens": 9, "max_tokens": 3}),
            400,
            Some("min_tokens"),
            "min_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": ""}),
            400,
            Some("prompt"),
            "empty",
        ),
        (
            "/v1/completions",
            json!({"prompt": [999_999]}),
            400,
            Some("prompt"),
            "vocabulary",
        ),
        (
            "/v1/completions",
            json!({"prompt": long_prompt}),
            400,
            Some("prompt"),
            "input tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "kv_compression": {"method": "keydiff", "ratio": 1.5}}),
            400,
            Some("kv_compression"),
            "ratio",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "kv_compression": {"method": "h2o"}}),
            400,
            Some("kv_compression"),
            "method",
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4", "prompt": "hi"}),
            404,
            Some("model"),
            "does not exist",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
            Some("messages"),
            "empty",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            400,
            Some("messages"),
            "invalid request body",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "n": 3}),
            400,
            Some("n"),
            "n must be 1",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100_000}),
            400,
            Some("max_completion_tokens"),
            "maximum context length",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
            404,
            Some("model"),
            "does not exist",
        ),
    ];
    for (path, body, want_status, want_param, want_text) in cases {
        let (status, text) = post(&client, base, path, &body).await;
        assert_eq!(status, want_status, "{path} {body}: {text}");
        let error = &json_of(&text)["error"];
        assert!(
            error["message"].as_str().unwrap().contains(want_text),
            "{body}: {text}"
        );
        assert_eq!(error["param"].as_str(), want_param, "{body}: {text}");
        assert!(error["type"].is_string());
    }
    // Over-long prompts name both counts.
    let long = json!({"prompt": "word ".repeat(400)});
    let (_, counted) = post(&client, base, "/tokenize", &long).await;
    let count = json_of(&counted)["count"].as_u64().unwrap();
    let (_, text) = post(&client, base, "/v1/completions", &long).await;
    assert!(
        text.contains("256 tokens") && text.contains(&format!("{count} input tokens")),
        "{text}"
    );

    for raw in ["{\"prompt\": \"hi\"", "not json", ""] {
        let response = client
            .post(format!("{base}/v1/completions"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{raw:?}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("malformed JSON"),
            "{body}"
        );
    }
    let missing = client
        .get(format!("{base}/v2/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let (status, body) = post(
        &client,
        base,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "the server keeps serving after errors: {body}");
}

/// A request's own `kv_compression` evicts tokens (seen in /metrics) and still answers; the
/// server-wide policy (none here) is reported too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_kv_compression_evicts_and_is_reported() {
    let base = &server().base_url;
    let client = client();
    let before = metrics_text(&client, base).await;
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    let (status, body) = post(
        &client,
        base,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
                "kv_compression": {"method": "keydiff", "ratio": 0.5, "window_tokens": 8}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["usage"]["completion_tokens"], 8);
    let after = metrics_text(&client, base).await;
    for name in [
        "starling:kv_compressions_total",
        "starling:kv_evicted_tokens_total",
        "starling:kv_evicted_blocks_total",
        "starling:kv_compression_seconds_total",
    ] {
        assert!(
            metric(&after, name) > metric(&before, name),
            "{name} did not grow"
        );
    }
    assert!(
        after.contains("starling:kv_compression_info{method=\"none\""),
        "server-wide policy missing:\n{after}"
    );
}

/// vLLM's `chat_template_kwargs` reach the template render: SmolLM2's template reads none of
/// them, so an unused kwarg changes nothing, while one naming a variable the render sets is
/// refused with the field named (the render itself checks, so the 400 shows the kwargs got
/// there), on `/tokenize` and on chat completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_the_template() {
    let base = &server().base_url;
    let client = client();
    let messages = json!([{"role": "user", "content": "hi"}]);
    let tokenize = |kwargs: Value| json!({"messages": messages, "chat_template_kwargs": kwargs});
    let (status, plain) = post(&client, base, "/tokenize", &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{plain}");
    let (status, unused) = post(
        &client,
        base,
        "/tokenize",
        &tokenize(json!({"enable_thinking": false})),
    )
    .await;
    assert_eq!(status, 200, "{unused}");
    assert_eq!(json_of(&unused)["tokens"], json_of(&plain)["tokens"]);

    let (status, body) = post(
        &client,
        base,
        "/tokenize",
        &tokenize(json!({"add_generation_prompt": false})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(json_of(&body)["error"]["param"], "chat_template_kwargs");

    let chat = json!({
        "model": MODEL_NAME, "messages": messages, "max_tokens": 2,
        "chat_template_kwargs": {"messages": []}
    });
    let (status, body) = post(&client, base, "/v1/chat/completions", &chat).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("chat_template_kwargs"), "{body}");

    let not_an_object = json!({
        "model": MODEL_NAME, "messages": messages, "max_tokens": 2,
        "chat_template_kwargs": [true]
    });
    let (status, body) = post(&client, base, "/v1/chat/completions", &not_an_object).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("chat_template_kwargs"), "{body}");
}
