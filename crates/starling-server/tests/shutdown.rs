//! Shutdown (issue 23): the first signal drains (new connections refused, in-flight streams
//! finish), a second one while draining ends `serve` at once with `ForcedShutdown`.

mod common;

use std::time::{Duration, Instant};

use common::{sse_data, start, Setup, TestServer};
use futures_util::StreamExt;
use serde_json::json;
use starling_server::{ServeOptions, ServerError};

fn server() -> TestServer {
    start(Setup {
        options: ServeOptions {
            shutdown_grace: Duration::from_secs(600),
            ..ServeOptions::default()
        },
        ..Setup::smollm2(512, 64, 8)
    })
}

/// Starts a long stream and returns its byte stream once the first chunk arrived.
async fn long_stream(
    base: &str,
) -> impl futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Unpin {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": true,
                      "temperature": 0, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    body
}

fn served(server: &TestServer) -> Option<String> {
    server
        .served
        .lock()
        .unwrap()
        .as_ref()
        .map(|r| format!("{r:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_serve_at_once() {
    let server = server();
    let mut body = long_stream(&server.base_url).await;
    server.signals.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served(&server), None, "the first signal drains");
    assert!(
        body.next().await.is_some(),
        "the stream goes on while draining"
    );
    let signalled = Instant::now();
    server.signals.send(()).unwrap();
    loop {
        if let Some(result) = served(&server) {
            assert_eq!(
                result,
                format!("{:?}", Err::<(), _>(ServerError::ForcedShutdown))
            );
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(2),
            "serve did not end after the second signal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_signal_drains_the_streams_in_flight_then_ends() {
    let server = server();
    let mut body = long_stream(&server.base_url).await;
    server.signals.send(()).unwrap();
    let mut rest = Vec::new();
    while let Some(chunk) = body.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let data = sse_data(&String::from_utf8_lossy(&rest));
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while served(&server).is_none() {
        assert!(
            Instant::now() < deadline,
            "serve did not return after draining"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served(&server).as_deref(), Some("Ok(())"));
    // Nothing listens any more.
    assert!(tokio::net::TcpStream::connect(&server.address)
        .await
        .is_err());
}
