//! `--synthetic-latent-share`: synthetic presets whose every layer caches random STAR-KV
//! latents of a chosen share. `info` sizes them (about twice the blocks at 0.5), `serve` starts
//! on them and reports the latent cache in its log, `/metrics` and `/v1/models`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

mod common;

use common::{assert_clean_failure, starling, stderr, stdout, synthetic_on_cpu};

#[test]
fn info_sizes_llama2_7b_at_half_its_kv_elements_to_twice_the_blocks() {
    let out = synthetic_on_cpu(
        "info",
        "llama2-7b",
        &[
            "--synthetic-latent-share",
            "0.5",
            "--kv-cache-memory",
            "8GiB",
            "--max-model-len",
            "4096",
        ],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // f32: full K/V 32 × 2 × 4096 × 4 = 1 MiB per token → 512 blocks of 16 in 8 GiB. The 50%
    // shape: (32 × 64 + 2048) × 4 + 4 = 16 388 bytes a layer, 512.125 KiB per token → 1023.
    assert!(
        text.contains(
            "synthetic latents (f32, cpu; every layer, key rank 64 per head, value rank 2048): \
             512.12 KiB per token vs 1.00 MiB (50.0% removed) → 1023 blocks vs 512 (2.00×)"
        ),
        "{text}"
    );
    // Real weights take their latents from a checkpoint, and shares are in (0, 1].
    let out = starling(&["info", "--synthetic-latent-share", "0.5"]);
    assert_clean_failure(&out, "--load-format synthetic");
    let out = starling(&[
        "info",
        "--load-format",
        "synthetic",
        "--model",
        "llama2-7b",
        "--synthetic-latent-share",
        "1.5",
    ]);
    assert_clean_failure(&out, "outside (0, 1]");
}

/// A `starling serve` child, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        // The child is ours: end it by its handle and reap it.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` over plain HTTP/1.1; the body.
fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[test]
fn serve_warms_up_on_synthetic_latents_and_reports_them() {
    let child = Command::new(env!("CARGO_BIN_EXE_starling"))
        .args([
            "serve",
            "--device",
            "cpu",
            "--load-format",
            "synthetic",
            "--model",
            "tiny-llama",
            "--synthetic-latent-share",
            "0.5",
            "--kv-cache-memory",
            "1MiB",
            "--port",
            "0",
            "--warm-up-tokens",
            "40",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start starling serve");
    let mut server = Server(child);
    let mut log = BufReader::new(server.0.stderr.take().expect("stderr"));
    let (mut cache_line, mut address) = (None, None);
    let mut seen = String::new();
    let mut line = String::new();
    while address.is_none() {
        line.clear();
        if log.read_line(&mut line).unwrap() == 0 {
            panic!("serve exited before listening:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(rest) = line.strip_prefix("KV cache: ") {
            cache_line = Some(rest.trim().to_owned());
        }
        if let Some((_, rest)) = line.split_once(" on http://") {
            address = rest.split_whitespace().next().map(str::to_owned);
        }
    }
    assert!(seen.contains("warm-up: 40 prompt tokens"), "{seen}");
    // Tiny preset: 2 layers × 2 KV heads × 16; half of that is rank 8 per head and 16.
    let cache_line = cache_line.unwrap_or_default();
    assert!(
        cache_line.starts_with(
            "synthetic latents (2 of 2 layers, key rank 8 per head, value rank 16) in f32"
        ),
        "{seen}"
    );
    assert!(
        cache_line.contains("longest bootable context 256 tokens"),
        "{seen}"
    );
    let address = address.unwrap_or_default();
    let metrics = get(&address, "/metrics");
    assert!(
        metrics.contains("starling:kv_cache_latent_layers 2\n"),
        "{metrics}"
    );
    // The warm-up's request left no count behind.
    for counter in [
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{counter}{{")))
            .unwrap_or_else(|| panic!("no {counter} in {metrics}"));
        assert!(line.ends_with(" 0"), "{line}");
    }
    // (8 + 8 + 16) × 4 + 4 = 132 bytes a layer.
    assert!(
        metrics.contains("starling:kv_cache_bytes_per_token 264\n"),
        "{metrics}"
    );
    let models: serde_json::Value = serde_json::from_str(&get(&address, "/v1/models")).unwrap();
    let cache = &models["data"][0]["kv_cache"];
    assert_eq!(cache["kind"], "latent", "{models}");
    assert_eq!(cache["latent_ranks"]["value_rank_max"], 16, "{models}");
    assert_eq!(cache["star_kv"], serde_json::Value::Null, "{models}");
}
