//! Load behaviour on a small KV cache: concurrent streams stay independent, a dropped client's
//! blocks come back, and a soak at ~4× capacity ends clean. The tests share one server and run
//! one at a time (they check global block counts).

mod common;

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{metric, metrics_text, post, sse_chunks, start_server, wait_until_idle, TestServer};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 16 blocks of 16 tokens: 256 token slots, so ~12 of the soak's requests (~20 tokens each)
/// fit at once; its 48 clients keep about four times that in flight.
const KV_BLOCKS: u64 = 16;
const MAX_MODEL_LEN: usize = 128;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start_server(MAX_MODEL_LEN, KV_BLOCKS, 64))
}

/// Runs `test` alone on the shared server, on its own runtime.
fn exclusive<F: std::future::Future<Output = ()>>(test: impl FnOnce(String) -> F) {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let base = server().base_url.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test(base));
}

fn prompt(i: usize) -> String {
    const SUBJECTS: [&str; 8] = [
        "The sun",
        "A cat",
        "My teacher",
        "The river",
        "Our city",
        "This book",
        "The ocean",
        "A robot",
    ];
    const VERBS: [&str; 4] = ["is", "looks", "seems", "was"];
    format!("{} {} number {}", SUBJECTS[i % 8], VERBS[(i / 8) % 4], i)
}

async fn greedy_text(client: &reqwest::Client, base: &str, i: usize, stream: bool) -> String {
    let request = json!({"prompt": prompt(i), "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stream": stream});
    let (status, body) = post(client, base, "/v1/completions", &request).await;
    assert_eq!(status, 200, "{body}");
    if stream {
        sse_chunks(&body)
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    } else {
        let full: Value = serde_json::from_str(&body).unwrap();
        full["choices"][0]["text"].as_str().unwrap().to_owned()
    }
}

#[test]
fn thirty_two_concurrent_streams_match_their_solo_runs() {
    exclusive(|base| async move {
        let client = reqwest::Client::new();
        let mut solo = Vec::new();
        for i in 0..32 {
            solo.push(greedy_text(&client, &base, i, false).await);
        }
        let before = metrics_text(&client, &base).await;
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let client = client.clone();
                let base = base.clone();
                tokio::spawn(async move { greedy_text(&client, &base, i, true).await })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            assert_eq!(
                task.await.unwrap(),
                solo[i],
                "request {i} changed when batched"
            );
        }
        let after = wait_until_idle(&client, &base, Duration::from_secs(10)).await;
        let decode_steps = metric(&after, "starling:decode_steps_total")
            - metric(&before, "starling:decode_steps_total");
        let decoded = metric(&after, "starling:decode_batch_size_sum")
            - metric(&before, "starling:decode_batch_size_sum");
        assert!(
            decoded / decode_steps > 4.0,
            "requests were batched: mean decode batch {}",
            decoded / decode_steps
        );
    });
}

#[test]
fn a_client_dropped_mid_stream_frees_its_blocks() {
    exclusive(|base| async move {
        let client = reqwest::Client::new();
        let aborted_before = aborted(&metrics_text(&client, &base).await);
        // A raw socket, so "the client went away" means exactly a closed TCP connection.
        let address = base.trim_start_matches("http://");
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        let body = json!({"prompt": "Tell me a long story about", "max_tokens": 100, "ignore_eos": true, "stream": true}).to_string();
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut seen = String::new();
        let mut buffer = [0u8; 4096];
        while seen.matches("data: ").count() < 3 {
            let n = socket.read(&mut buffer).await.unwrap();
            assert!(n > 0, "server closed the stream early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
        let text = metrics_text(&client, &base).await;
        assert!(
            metric(&text, "starling:kv_blocks_used") > 0.0,
            "the request holds blocks: {text}"
        );
        drop(socket);
        let started = Instant::now();
        let text = wait_until_idle(&client, &base, Duration::from_secs(5)).await;
        assert_eq!(
            metric(&text, "starling:kv_blocks_free"),
            metric(&text, "starling:kv_blocks_total")
        );
        assert_eq!(aborted(&text), aborted_before + 1.0, "{text}");
        assert!(metric(&text, "vllm:generation_tokens_total") > 0.0);
        eprintln!("blocks freed {:?} after the client left", started.elapsed());
    });
}

fn aborted(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("vllm:request_success_total") && l.contains("finished_reason=\"abort\"")
        })
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

/// 528 short requests from 48 clients (about 4× what the cache holds at once), streamed and not,
/// some dropped early: no 5xx, every block back at the end.
#[test]
fn soak_at_four_times_capacity_ends_clean() {
    exclusive(|base| async move {
        let client = reqwest::Client::new();
        const CLIENTS: usize = 48;
        const PER_CLIENT: usize = 11;
        let started = Instant::now();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let client = client.clone();
                let base = base.clone();
                tokio::spawn(async move {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(c as u64);
                    let mut statuses = Vec::new();
                    for r in 0..PER_CLIENT {
                        let words = rng.gen_range(2..16);
                        let prompt = "lorem ipsum ".repeat(words / 2) + &prompt(c * PER_CLIENT + r);
                        let stream = rng.gen_bool(0.5);
                        let request = json!({"prompt": prompt, "max_tokens": rng.gen_range(1..6),
                                             "temperature": 0.8, "seed": r, "stream": stream});
                        let response = client
                            .post(format!("{base}/v1/completions"))
                            .json(&request)
                            .send()
                            .await
                            .unwrap();
                        statuses.push(response.status().as_u16());
                        if stream && rng.gen_bool(0.1) {
                            drop(response); // walk away without reading
                        } else {
                            let body = response.text().await.unwrap();
                            if stream {
                                assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
                            }
                        }
                    }
                    statuses
                })
            })
            .collect();
        let mut total = 0;
        for task in tasks {
            let statuses = tokio::time::timeout(Duration::from_secs(240), task)
                .await
                .expect("soak took too long")
                .unwrap();
            total += statuses.len();
            assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
        }
        assert_eq!(total, CLIENTS * PER_CLIENT);
        let text = wait_until_idle(&client, &base, Duration::from_secs(10)).await;
        assert_eq!(
            metric(&text, "starling:kv_blocks_free"),
            metric(&text, "starling:kv_blocks_total")
        );
        let max_used = metric(&text, "starling:kv_blocks_used_max");
        assert!(
            max_used > (KV_BLOCKS as f64) * 0.7,
            "the soak filled the cache: max {max_used} blocks"
        );
        eprintln!(
            "soak: {total} requests in {:?}, {} preemptions, peak {max_used} of {KV_BLOCKS} blocks",
            started.elapsed(),
            metric(&text, "vllm:num_preemptions_total")
        );
        let health = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    });
}
