//! `starling bench campaign` end to end on the CPU: two real `starling serve` children on
//! SmolLM2, two tiny points per campaign. One engine boots per context point and cannot fit the
//! longer one in its KV budget (a "boot refused" row, not an error); the other serves every
//! context point at its own fixed window and refuses the longer prompts ("requests refused").

mod common;

use common::stderr;
use serde_json::Value;

/// The SmolLM2 server both engines run, on the CPU, with `extra` flags.
fn serve_command(extra: &str) -> String {
    format!(
        "'{}' serve --device cpu --model smollm2-135m --port {{port}} --max-num-seqs 4 {extra}",
        env!("CARGO_BIN_EXE_starling")
    )
}

#[test]
fn a_campaign_writes_every_row_and_reports_refusals_as_rows() {
    let root = tempfile::tempdir().unwrap();
    // 45 KiB per token in f32: 12 MiB holds 17 blocks (272 tokens), so a 512-token window
    // cannot boot, while 64 tokens can.
    let per_point = format!(
        "per-point={}",
        serve_command("--max-model-len {max_model_len} --kv-cache-memory {kv_cache_memory_bytes}")
    );
    let fixed = format!(
        "fixed={}",
        serve_command("--max-model-len 128 --kv-cache-memory {kv_cache_memory_bytes}")
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_starling"))
        .args([
            "bench", "campaign", "--engine", &per_point, "--engine", &fixed,
        ])
        .args(["--kv-cache-memory", "12MiB", "--max-model-len", "128"])
        .args([
            "--base-port",
            "18300",
            "--boot-timeout-s",
            "120",
            "--seed",
            "5",
        ])
        .args([
            "--concurrency-workloads",
            "random:16:4",
            "--concurrency-points",
            "1,2",
        ])
        .args(["--requests-per-concurrency", "1", "--min-requests", "2"])
        .args(["--context-points", "64,512", "--context-output-tokens", "4"])
        .args([
            "--long-generation-points",
            "4,8",
            "--long-generation-input-tokens",
            "8",
        ])
        .args(["--long-generation-requests", "2"])
        .args(["--scheduler-rates", "40", "--scheduler-requests", "3"])
        .args(["--scheduler-workload", "random:16:4:0.5"])
        .arg("--output-root")
        .arg(root.path())
        .output()
        .expect("run starling");
    assert!(out.status.success(), "stderr: {}", stderr(&out));

    let runs: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "one dated folder: {runs:?}");
    let dir = &runs[0];
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.len() == 15 && name.as_bytes()[8] == b'-',
        "dated YYYYMMDD-HHMMSS: {name}"
    );
    for file in [
        "campaign.json",
        "campaign.md",
        "concurrency-random-16x4.png",
        "context.png",
        "long-generation.png",
        "scheduler.png",
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
        assert!(bytes.len() > 500, "{file}: {} bytes", bytes.len());
    }

    let doc: Value =
        serde_json::from_slice(&std::fs::read(dir.join("campaign.json")).unwrap()).unwrap();
    assert_eq!(doc["bench"], "campaign");
    assert_eq!(doc["kv_cache_memory_bytes"], 12 << 20);
    assert!(doc["command"][1] == "bench" && doc["command"][2] == "campaign");
    let rows = doc["rows"].as_array().unwrap();
    // 2 concurrency + 2 long-generation + 1 scheduler + 2 context points, for each engine.
    assert_eq!(rows.len(), 14, "{rows:#?}");
    let row = |engine: &str, campaign: &str, value: f64| {
        rows.iter()
            .find(|r| r["engine"] == engine && r["campaign"] == campaign && r["value"] == value)
            .unwrap_or_else(|| panic!("no {engine} {campaign} {value} row"))
    };
    for engine in ["per-point", "fixed"] {
        for (campaign, value) in [
            ("concurrency", 1.0),
            ("concurrency", 2.0),
            ("long_generation", 4.0),
            ("long_generation", 8.0),
            ("scheduler", 40.0),
            ("context", 64.0),
        ] {
            let r = row(engine, campaign, value);
            assert_eq!(r["status"], "ok", "{r:#}");
            assert!(
                r["metrics"]["output_throughput"].as_f64().unwrap() > 0.0,
                "{r:#}"
            );
        }
        let scheduler = row(engine, "scheduler", 40.0);
        assert!(
            scheduler["decode_batch"]["observations"].as_f64().unwrap() > 0.0,
            "Starling exports its decode-batch histogram: {scheduler:#}"
        );
        assert!(scheduler["generated_tokens_per_step"].as_f64().unwrap() > 0.0);
    }
    let refused = row("per-point", "context", 512.0);
    assert_eq!(refused["status"], "boot_refused", "{refused:#}");
    assert!(refused["metrics"].is_null());
    assert!(
        refused["detail"].as_str().unwrap().contains("error"),
        "the server's last lines say why: {refused:#}"
    );
    let too_long = row("fixed", "context", 512.0);
    assert_eq!(too_long["status"], "requests_refused", "{too_long:#}");

    // One boot per window for the per-point engine (128 shared, 64 and 512), one in all for
    // the fixed one; each boot that came up recorded its model card.
    let boots = doc["boots"].as_array().unwrap();
    let of = |engine: &str| boots.iter().filter(|b| b["engine"] == engine).count();
    assert_eq!((of("per-point"), of("fixed")), (3, 1), "{boots:#?}");
    for boot in boots.iter().filter(|b| b["status"] == "ok") {
        assert!(
            boot["models"]["data"][0]["kv_cache"].is_object(),
            "{boot:#}"
        );
        let log = dir.join("logs").join(boot["log_file"].as_str().unwrap());
        assert!(log.is_file(), "{}", log.display());
    }
    let md = std::fs::read_to_string(dir.join("campaign.md")).unwrap();
    assert_eq!(md.matches("campaign\n\n| workload").count(), 4, "{md}");
    assert!(md.contains("| boot refused |"), "{md}");
    assert!(md.contains("| requests refused |"), "{md}");
}
