//! Connection handling (issue 23): slow or idle connections are closed after their timeouts, a
//! connection limit keeps the file table from filling, large bodies get 413, wrong methods 405,
//! a half-closed client still gets its answer, and every error status has OpenAI's body shape.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{openai_error, raw_exchange, start, Setup, TestServer};
use serde_json::json;
use starling_server::{ConnectionLimits, ServeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEEP_ALIVE: Duration = Duration::from_millis(800);
const HEADER_READ: Duration = Duration::from_millis(1500);
const BODY_READ: Duration = Duration::from_millis(1500);
/// What a test waits at most for a timeout of about a second to act; today's code never does.
const PATIENCE: Duration = Duration::from_secs(6);
/// Connections the limited server accepts at once.
const MAX_CONNECTIONS: usize = 6;

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        keep_alive_timeout: KEEP_ALIVE,
        header_read_timeout: HEADER_READ,
        body_read_timeout: BODY_READ,
        ..ConnectionLimits::default()
    }
}

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        start(Setup {
            options: ServeOptions {
                limits: limits(),
                ..ServeOptions::default()
            },
            ..Setup::tiny()
        })
    })
}

/// A separate server for the connection limit, so other tests' connections do not count.
fn limited() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        start(Setup {
            options: ServeOptions {
                limits: ConnectionLimits {
                    max_connections: MAX_CONNECTIONS,
                    ..limits()
                },
                ..ServeOptions::default()
            },
            ..Setup::tiny()
        })
    })
}

fn request(method: &str, path: &str, address: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status code and body of a raw HTTP/1.1 response.
fn status_and_body(response: &str) -> (u16, &str) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_header_is_cut_off_after_the_header_timeout() {
    let address = &server().address;
    let started = Instant::now();
    let partial = format!("POST /v1/completions HTTP/1.1\r\nhost: {address}\r\ncontent-");
    let (seen, closed) = raw_exchange(address, partial.as_bytes(), PATIENCE).await;
    assert!(
        closed,
        "a half-sent header stayed open for {PATIENCE:?}: {seen:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= HEADER_READ - Duration::from_millis(100),
        "closed too early"
    );
    assert!(waited < HEADER_READ + Duration::from_secs(2), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_keep_alive_timeout() {
    let address = &server().address;
    // Never a byte.
    let started = Instant::now();
    let (_, closed) = raw_exchange(address, b"", PATIENCE).await;
    assert!(closed, "an idle connection stayed open for {PATIENCE:?}");
    assert!(
        started.elapsed() < HEADER_READ,
        "the keep-alive timeout is the shorter one"
    );
    // After an answered request, on the same keep-alive connection.
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket
        .write_all(&request("GET", "/health", address, ""))
        .await
        .unwrap();
    let mut buffer = [0u8; 4096];
    let n = socket.read(&mut buffer).await.unwrap();
    assert!(String::from_utf8_lossy(&buffer[..n]).starts_with("HTTP/1.1 200"));
    let idle_started = Instant::now();
    let closed = tokio::time::timeout(PATIENCE, socket.read(&mut buffer)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "kept alive for {PATIENCE:?}"
    );
    assert!(idle_started.elapsed() >= KEEP_ALIVE - Duration::from_millis(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_body_gets_a_408_in_openai_shape() {
    let address = &server().address;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: 400\r\n\r\n{{\"prompt\": \"hel"
    );
    let (seen, closed) = raw_exchange(address, head.as_bytes(), PATIENCE).await;
    assert!(
        closed,
        "a half-sent body stayed open for {PATIENCE:?}: {seen:?}"
    );
    let (status, body) = status_and_body(&seen);
    assert_eq!(status, 408, "{seen}");
    openai_error(body, "body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_413_in_openai_shape() {
    let base = &server().base_url;
    let huge = "x".repeat(3 << 20);
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": huge}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    openai_error(&response.text().await.unwrap(), "too large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_get_405_in_openai_shape() {
    let base = &server().base_url;
    let client = reqwest::Client::new();
    for (method, path) in [
        (reqwest::Method::GET, "/v1/completions"),
        (reqwest::Method::PUT, "/v1/chat/completions"),
        (reqwest::Method::POST, "/v1/models"),
        (reqwest::Method::DELETE, "/health"),
    ] {
        let response = client
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method} {path}");
        assert!(response.headers().contains_key("allow"), "{method} {path}");
        openai_error(&response.text().await.unwrap(), "method");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let address = &server().address;
    let body = json!({"prompt": "Hello", "max_tokens": 3}).to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket
        .write_all(&request("POST", "/v1/completions", address, &body))
        .await
        .unwrap();
    socket.shutdown().await.unwrap();
    let mut seen = String::new();
    tokio::time::timeout(PATIENCE, socket.read_to_string(&mut seen))
        .await
        .expect("no answer after the half-close")
        .unwrap();
    let (status, body) = status_and_body(&seen);
    assert_eq!(status, 200, "{seen}");
    assert!(body.contains("text_completion"), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused_until_the_slow_ones_time_out() {
    let server = limited();
    let address = &server.address;
    // Fill every slot with a slow client that never finishes its header.
    let mut slow = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
        slow.push(socket);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let health = request("GET", "/health", address, "");
    let (seen, closed) = raw_exchange(address, &health, Duration::from_secs(2)).await;
    assert!(
        closed,
        "over the limit: answered and closed at once: {seen:?}"
    );
    let (status, body) = status_and_body(&seen);
    assert_eq!(status, 503, "{seen}");
    openai_error(body, "connections");
    // The slow clients are cut off by the header timeout; /health answers again.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (seen, _) = raw_exchange(address, &health, Duration::from_secs(2)).await;
        if seen.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_json_content_type_is_refused() {
    let base = &server().base_url;
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .header("content-type", "text/plain")
        .body(json!({"prompt": "Hello", "max_tokens": 1}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    openai_error(&response.text().await.unwrap(), "application/json");
}
