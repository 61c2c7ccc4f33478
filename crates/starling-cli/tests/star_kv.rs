//! STAR-KV through the `starling` binary: `calibrate` writes deterministic SVD checkpoints for
//! SmolLM2-135M, `generate` runs with one (the reference path), `info` sizes the cache per
//! profile, and bad settings or a checkpoint for other weights end in clear errors.

use std::path::Path;
use std::process::{Command, Output};

fn starling(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_starling"))
        .args(args)
        .output()
        .expect("run starling")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a clean failure: exit code 1, an `error:` line containing `needle`, no panic.
fn assert_clean_failure(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("error:"), "stderr: {err}");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
}

fn calibrate(dir: &Path, profiles: &str) -> Output {
    let dir = dir.to_string_lossy();
    starling(&[
        "calibrate",
        "--model",
        "smollm2-135m",
        "--profiles",
        profiles,
        "--strategy",
        "greedy",
        "--seed",
        "9",
        "--output",
        &dir,
    ])
}

fn star_kv_json(dir: &Path, profile: &str) -> String {
    serde_json::json!({
        "method": "star_kv",
        "checkpoint": dir.to_string_lossy(),
        "rank_profile": profile,
    })
    .to_string()
}

#[test]
fn calibrate_generate_and_info_with_smollm2_checkpoints() {
    let first = tempfile::tempdir().unwrap();
    let out = calibrate(first.path(), "balanced,aggressive");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("SVD only"), "{}", stdout(&out));

    let manifest_path = first.path().join("balanced/manifest.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    assert_eq!(manifest["method"], "star_kv");
    assert_eq!(manifest["profile"], "balanced");
    assert_eq!(manifest["seed"], 9);
    assert_eq!(manifest["calibration"]["distillation_steps"], 0);
    assert_eq!(
        manifest["uncompressed_layers"],
        serde_json::json!([0, 1, 29])
    );
    // SmolLM2: 11 520 K/V elements per token; balanced keeps ⌊0.3 · 11 520⌋ = 3456 (bf16).
    assert_eq!(
        manifest["compression"]["kv_bytes_per_token_compressed"],
        2 * 3456
    );
    assert!(!first.path().join("conservative").exists());

    // Deterministic: a second run writes the same bytes.
    let second = tempfile::tempdir().unwrap();
    let out = calibrate(second.path(), "balanced");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    for file in ["manifest.json", "projections.safetensors"] {
        let a = std::fs::read(first.path().join("balanced").join(file)).unwrap();
        let b = std::fs::read(second.path().join("balanced").join(file)).unwrap();
        assert!(a == b, "{file} differs between two runs");
    }

    // The reference path runs and still knows the capital of France at 70% of K/V removed.
    let config = star_kv_json(first.path(), "balanced");
    let out = starling(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--kv-compression",
        &config,
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "6",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stdout(&out).starts_with("The capital of France is"),
        "{}",
        stdout(&out)
    );

    // info: both calibrated profiles, sized at the budget, the selected one marked.
    let out = starling(&[
        "info",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--kv-cache-memory",
        "1GiB",
        "--kv-compression",
        &config,
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(text.contains("balanced"), "{text}");
    assert!(text.contains("aggressive"), "{text}");
    assert!(text.contains("(selected)"), "{text}");
    // f32 on the CPU: 3456 elements × 4 bytes = 13.50 KiB per token vs 45 KiB.
    assert!(text.contains("13.50 KiB per token vs 45.00 KiB"), "{text}");

    // A checkpoint whose recorded weights differ is refused before the engine starts.
    let manifest_text = std::fs::read_to_string(&manifest_path).unwrap();
    let sha = manifest["model"]["weights_sha256"].as_str().unwrap();
    std::fs::write(&manifest_path, manifest_text.replace(sha, &"0".repeat(64))).unwrap();
    let out = starling(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--kv-compression",
        &config,
        "--prompt",
        "hi",
        "--max-tokens",
        "1",
    ]);
    assert_clean_failure(&out, "does not match the model");

    // A profile that was not calibrated.
    let out = starling(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--kv-compression",
        &star_kv_json(first.path(), "conservative"),
        "--prompt",
        "hi",
        "--max-tokens",
        "1",
    ]);
    assert_clean_failure(&out, "conservative");
}

#[test]
fn info_on_a_synthetic_preset_prints_every_profile_from_the_budget() {
    let out = starling(&[
        "info",
        "--device",
        "cpu",
        "--load-format",
        "synthetic",
        "--model",
        "llama2-7b",
        "--kv-cache-memory",
        "8GiB",
        "--max-model-len",
        "4096",
        "--star-kv-budget",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Llama 2 7B: 32 layers × 2 × 4096 elements; conservative keeps half of them (f32: 512 KiB
    // of 1 MiB).
    assert!(text.contains("512.00 KiB per token vs 1.00 MiB"), "{text}");
    for profile in ["aggressive", "balanced", "conservative"] {
        assert!(text.contains(profile), "{text}");
    }
}

#[test]
fn bad_star_kv_settings_fail_cleanly() {
    let bad_flag = |json: &str, needle: &str| {
        let out = starling(&["info", "--kv-compression", json]);
        // clap reports value-parser errors itself, with exit code 2.
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{json}: {err}");
        assert!(err.contains(needle), "{json}: {err}");
        assert!(!err.contains("panicked"), "{json}: {err}");
    };
    bad_flag(
        r#"{"method":"star_kv","checkpoint":"/nowhere"}"#,
        "rank_profile",
    );
    bad_flag(
        r#"{"method":"star_kv","checkpoint":"/nowhere","rank_profile":"tiny"}"#,
        "unknown rank profile",
    );
    bad_flag(
        r#"{"method":"keydiff","ratio":0.5,"checkpoint":"/nowhere"}"#,
        "only method star_kv",
    );

    let out = starling(&[
        "generate",
        "--load-format",
        "synthetic",
        "--model",
        "llama2-7b",
        "--device",
        "cpu",
        "--kv-compression",
        r#"{"method":"star_kv","checkpoint":"/nowhere","rank_profile":"balanced"}"#,
        "--prompt",
        "hi",
    ]);
    assert_clean_failure(&out, "synthetic");
    let calibrate_with =
        |profiles: &str| starling(&["calibrate", "--profiles", profiles, "--output", "/nowhere"]);
    assert_clean_failure(
        &calibrate_with("balanced,medium"),
        "unknown rank profile `medium`",
    );
    assert_clean_failure(&calibrate_with("balanced,balanced"), "twice");
}
