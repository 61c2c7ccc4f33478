//! Locking the server (issue 23): `--api-key` guards `/v1/*` as vLLM does (health, metrics and
//! CORS preflights stay open), cross-origin browser requests need `--allowed-origins`, unknown
//! `Host` headers are refused under `--allowed-hosts` (DNS rebinding), and the weights' path
//! never reaches a client.

mod common;

use std::sync::OnceLock;

use common::{json_of, openai_error, post, start, Setup, TestServer};
use serde_json::json;

const KEY: &str = "sk-starling-test-key";
const GOOD_ORIGIN: &str = "http://good.example";

fn locked() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        start(Setup {
            api_keys: vec!["another-key".into(), KEY.into()],
            allowed_origins: vec![GOOD_ORIGIN.into()],
            allowed_hosts: vec!["127.0.0.1".into(), "localhost".into()],
            ..Setup::tiny()
        })
    })
}

/// Default settings: no key, no origin list, any host.
fn open() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(Setup::tiny()))
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// GETs `url` with one extra header.
async fn get_with(url: &str, name: &str, value: &str) -> reqwest::Response {
    client().get(url).header(name, value).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_routes_need_the_bearer_key() {
    let base = &locked().base_url;
    let models = format!("{base}/v1/models");
    let none = client().get(&models).send().await.unwrap();
    assert_eq!(none.status(), 401);
    assert!(none.headers().contains_key("www-authenticate"));
    let error = openai_error(&none.text().await.unwrap(), "api key");
    assert_eq!(error["code"], "invalid_api_key");
    for wrong in [
        "Bearer nope",
        "Bearer sk-starling-test-ke",
        KEY,
        "Basic c2stc3Rhcmxpbmc=",
    ] {
        let response = get_with(&models, "authorization", wrong).await;
        assert_eq!(response.status(), 401, "{wrong}");
    }
    for good in [format!("Bearer {KEY}"), "bearer another-key".to_owned()] {
        let response = get_with(&models, "authorization", &good).await;
        assert_eq!(response.status(), 200, "{good}");
    }
    let completion = client()
        .post(format!("{base}/v1/completions"))
        .bearer_auth(KEY)
        .json(&json!({"prompt": "Hi", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(completion.status(), 200);
    let refused = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // vLLM guards only /v1: health checks and scrapers need no key.
    for open_path in ["/health", "/metrics"] {
        let response = client()
            .get(format!("{base}{open_path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{open_path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_requests_need_an_allowed_origin() {
    for (server, allowed) in [(locked(), true), (open(), false)] {
        let base = &server.base_url;
        let refused = client()
            .post(format!("{base}/v1/completions"))
            .bearer_auth(KEY)
            .header("origin", "http://evil.example")
            .json(&json!({"prompt": "Hi", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403);
        openai_error(&refused.text().await.unwrap(), "origin");
        let response = client()
            .post(format!("{base}/v1/completions"))
            .bearer_auth(KEY)
            .header("origin", GOOD_ORIGIN)
            .json(&json!({"prompt": "Hi", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        if allowed {
            assert_eq!(response.status(), 200);
            assert_eq!(
                response.headers()["access-control-allow-origin"],
                GOOD_ORIGIN
            );
        } else {
            assert_eq!(response.status(), 403, "no origin is allowed by default");
        }
    }
    // A preflight from the allowed origin: answered without a key, with the CORS headers.
    let preflight = client()
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/chat/completions", locked().base_url),
        )
        .header("origin", GOOD_ORIGIN)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 204);
    let headers = preflight.headers();
    assert_eq!(headers["access-control-allow-origin"], GOOD_ORIGIN);
    let allowed_headers = headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        allowed_headers.contains("authorization"),
        "{allowed_headers}"
    );
    // The same origin as the Host is not cross-origin.
    let own = format!("http://{}", open().address);
    let response = get_with(&format!("{}/v1/models", open().base_url), "origin", &own).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_host_headers_are_refused_when_hosts_are_listed() {
    let server = locked();
    let port = server.address.rsplit(':').next().unwrap();
    let health = format!("{}/health", server.base_url);
    let rebound = get_with(&health, "host", &format!("attacker.example:{port}")).await;
    assert_eq!(rebound.status(), 403);
    openai_error(&rebound.text().await.unwrap(), "host");
    let local = get_with(&health, "host", &format!("localhost:{port}")).await;
    assert_eq!(local.status(), 200);
    // Without --allowed-hosts any Host is served.
    let any = get_with(
        &format!("{}/health", open().base_url),
        "host",
        "whatever.example",
    )
    .await;
    assert_eq!(any.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_path_is_never_shown() {
    let server = open();
    let path = server.model_path.display().to_string();
    let directory = server.model_path.parent().unwrap().display().to_string();
    let models = client()
        .get(format!("{}/v1/models", server.base_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!models.contains(&path), "{models}");
    assert!(!models.contains(&directory), "{models}");
    assert_eq!(json_of(&models)["data"][0]["root"], common::MODEL_NAME);
    let body = json!({"model": "other", "prompt": "Hi"});
    let (status, missing) = post(&client(), &server.base_url, "/v1/completions", &body).await;
    assert_eq!(status, 404);
    assert!(!missing.contains(&directory), "{missing}");
}
