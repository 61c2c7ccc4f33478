//! A model whose logits are NaN (issue 23): the affected request ends at once with a clear
//! OpenAI-shaped error (a 500 before streaming, an error event then `[DONE]` after), its blocks
//! come back, the requests beside it are untouched, and a model that is NaN for every request is
//! reported as such.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{
    finished, json_of, metric, metrics_text, openai_error, post, sse_data, start, wait_until_idle,
    Setup, TestModel, TestServer,
};
use serde_json::{json, Value};

/// A token no test prompt contains unless it asks for it (a rare byte-level piece).
const POISON_TOKEN: u32 = 31_337;

/// Long enough for any request here to finish or fail; today's code hangs past it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn poisoned() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        start(Setup {
            model: TestModel::SmolLm2NanToken(POISON_TOKEN),
            ..Setup::smollm2(256, 64, 16)
        })
    })
}

fn nan_everywhere() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        start(Setup {
            model: TestModel::SmolLm2NanEverywhere,
            ..Setup::smollm2(256, 32, 8)
        })
    })
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(ANSWER_TIMEOUT)
        .build()
        .unwrap()
}

/// Token ids of "The capital of France is" followed by the poisoned token.
async fn poisoned_prompt(base: &str) -> Vec<u32> {
    let (status, body) = post(
        &client(),
        base,
        "/tokenize",
        &json!({"prompt": "The capital of France is"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<u32> = serde_json::from_value(json_of(&body)["tokens"].clone()).unwrap();
    ids.push(POISON_TOKEN);
    ids
}

async fn greedy(base: &str, prompt: Value) -> (u16, String) {
    let request = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true});
    post(&client(), base, "/v1/completions", &request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nan_request_gets_a_500_while_the_others_finish_unchanged() {
    let base = &poisoned().base_url;
    let prompts: Vec<String> = (0..4)
        .map(|i| format!("Request number {i} says that the sky is"))
        .collect();
    let mut solo = Vec::new();
    for p in &prompts {
        let (status, body) = greedy(base, json!(p)).await;
        assert_eq!(status, 200, "{body}");
        solo.push(json_of(&body)["choices"][0]["text"].clone());
    }
    let bad = poisoned_prompt(base).await;
    let clean_tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let base = base.clone();
            let p = p.clone();
            tokio::spawn(async move { greedy(&base, json!(p)).await })
        })
        .collect();
    let (status, body) = greedy(base, json!(bad)).await;
    assert_eq!(status, 500, "{body}");
    let error = openai_error(&body, "NaN");
    assert_eq!(error["code"], "non_finite_logits", "{body}");
    assert!(
        !body.contains("invalid sampling parameters"),
        "a NaN logit is not a parameter problem: {body}"
    );
    for (task, want) in clean_tasks.into_iter().zip(&solo) {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(&json_of(&body)["choices"][0]["text"], want, "{body}");
    }
    let text = wait_until_idle(&client(), base, Duration::from_secs(10)).await;
    assert_eq!(
        metric(&text, "starling:kv_blocks_free"),
        metric(&text, "starling:kv_blocks_total")
    );
    assert!(finished(&text, "error") >= 1.0, "{text}");
    let health = client().get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(
        health.status(),
        200,
        "one bad prompt does not make the model unhealthy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nan_stream_ends_with_an_error_event_then_done() {
    let base = &poisoned().base_url;
    let bad = poisoned_prompt(base).await;
    let request = json!({"prompt": bad, "max_tokens": 6, "stream": true});
    let (status, body) = post(&client(), base, "/v1/completions", &request).await;
    assert_eq!(status, 200, "headers were sent before the failure: {body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    openai_error(&data[data.len() - 2], "NaN");
    wait_until_idle(&client(), base, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_is_always_nan_is_reported_as_such() {
    let base = &nan_everywhere().base_url;
    for i in 0..6 {
        let (status, body) = greedy(base, json!(format!("Prompt {i}"))).await;
        assert_eq!(status, 500, "{body}");
        openai_error(&body, "NaN");
    }
    let (status, body) = post(
        &client(),
        base,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let error = openai_error(&data[data.len() - 2], "every request");
    assert_eq!(error["code"], "non_finite_logits");

    let health = client().get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 503);
    openai_error(&health.text().await.unwrap(), "non-finite");
    let text = metrics_text(&client(), base).await;
    assert_eq!(metric(&text, "starling:model_output_non_finite"), 1.0);
    assert!(metric(&text, "starling:non_finite_logits_requests_total") >= 7.0);
    let text = wait_until_idle(&client(), base, Duration::from_secs(10)).await;
    assert_eq!(
        metric(&text, "starling:kv_blocks_free"),
        metric(&text, "starling:kv_blocks_total")
    );
}
