//! STAR-KV through the `starling` binary: `calibrate` writes deterministic whitened (and, with
//! `--no-whiten`, weight-only) SVD checkpoints for SmolLM2-135M, `generate` runs with one (the
//! reference path), `info` sizes the cache per profile, and bad settings or a checkpoint for
//! other weights end in clear errors.

use std::path::Path;
use std::process::Output;

mod common;

use common::{assert_clean_failure, starling, stderr, stdout, synthetic_on_cpu};

/// The Paul Graham essay set's digest (`starling-hub`'s `EssaySource::paul_graham`).
const ESSAYS_SHA256: &str = "425faac798858e4240d7f4be9b3440b658e805b1289e0bdae72b83a4a1bcdfde";

/// Calibrates on the CPU with 2048 calibration tokens (4 windows of 512: enough to test the
/// path, small enough for CI), without distillation unless `extra` asks for it; `extra` adds
/// flags.
fn calibrate(dir: &Path, profiles: &str, extra: &[&str]) -> Output {
    let dir = dir.to_string_lossy();
    let mut args = vec![
        "calibrate",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--profiles",
        profiles,
        "--strategy",
        "greedy",
        "--seed",
        "9",
        "--calibration-tokens",
        "2048",
        "--output",
        &dir,
    ];
    if !extra.contains(&"--distill-steps") {
        args.extend_from_slice(&["--distill-steps", "0"]);
    }
    args.extend_from_slice(extra);
    starling(&args)
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
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
    let out = calibrate(first.path(), "balanced,aggressive", &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stdout(&out).contains("whitened SVD (2048"),
        "{}",
        stdout(&out)
    );

    let manifest_path = first.path().join("balanced/manifest.json");
    let manifest = read_json(&manifest_path);
    assert_eq!(manifest["method"], "star_kv");
    assert_eq!(manifest["profile"], "balanced");
    assert_eq!(manifest["seed"], 9);
    // Whitened by default, on 4 windows of 512 tokens from the 41 essays not held out.
    let calibration = &manifest["calibration"];
    assert_eq!(calibration["distillation_steps"], 0);
    assert_eq!(calibration["whitened"], true);
    assert_eq!(calibration["tokens"], 2048);
    assert_eq!(calibration["windows"], 4);
    assert_eq!(calibration["window_tokens"], 512);
    assert_eq!(calibration["dataset_sha256"], ESSAYS_SHA256);
    assert_eq!(calibration["data"].as_array().map(Vec::len), Some(41));
    assert_eq!(
        manifest["uncompressed_layers"],
        serde_json::json!([0, 1, 29])
    );
    // SmolLM2: 11 520 K/V elements per token; balanced keeps ⌊0.85 · 11 520⌋ = 9792 (bf16).
    assert_eq!(
        manifest["compression"]["kv_bytes_per_token_compressed"],
        2 * 9792
    );
    assert!(!first.path().join("conservative").exists());

    // Deterministic: a second run writes the same bytes.
    let second = tempfile::tempdir().unwrap();
    let out = calibrate(second.path(), "balanced", &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    for file in ["manifest.json", "projections.safetensors"] {
        let a = std::fs::read(first.path().join("balanced").join(file)).unwrap();
        let b = std::fs::read(second.path().join("balanced").join(file)).unwrap();
        assert!(a == b, "{file} differs between two runs");
    }

    // The weight-only ablation: no calibration text, other projections, the same budget.
    let plain = tempfile::tempdir().unwrap();
    let out = calibrate(plain.path(), "balanced", &["--no-whiten"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("weight SVD only"), "{}", stdout(&out));
    let plain_manifest = read_json(&plain.path().join("balanced/manifest.json"));
    let plain_calibration = &plain_manifest["calibration"];
    assert_eq!(plain_calibration["whitened"], false);
    assert_eq!(plain_calibration["tokens"], 0);
    assert_eq!(plain_calibration["dataset_sha256"], serde_json::Value::Null);
    // Equal KV bytes (greedy may split them differently between keys and values).
    let kv_bytes =
        |m: &serde_json::Value| m["compression"]["kv_bytes_per_token_compressed"].clone();
    assert_eq!(kv_bytes(&plain_manifest), kv_bytes(&manifest));
    let projections = |dir: &Path| std::fs::read(dir.join("balanced/projections.safetensors"));
    assert!(projections(plain.path()).unwrap() != projections(first.path()).unwrap());

    // The reference path runs and still knows the capital of France at 15% of K/V removed.
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

    // bench quality compares the compressed model with the original one (a first pass records
    // the uncompressed distributions): KL > 0 against it, and the reference is uncompressed.
    let quality_dir = first.path().join("quality");
    let keys_only = serde_json::json!({
        "method": "star_kv",
        "checkpoint": first.path().to_string_lossy(),
        "rank_profile": "balanced",
        "factors": "keys",
    })
    .to_string();
    let out = starling(&[
        "bench",
        "quality",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--context-tokens",
        "64",
        "--eval-tokens",
        "8",
        "--num-windows",
        "1",
        "--methods",
        "none",
        "--kv-compression",
        &keys_only,
        "--output",
        &quality_dir.to_string_lossy(),
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report = read_json(&quality_dir.join("quality.json"));
    assert_eq!(
        report["reference"]["method"],
        "none (uncompressed reference)"
    );
    assert_eq!(report["reference"]["scored_tokens"], 8);
    let row = &report["rows"][0];
    assert_eq!(row["method"], "star_kv balanced (keys low-rank)");
    assert_eq!(row["scored_tokens"], 8);
    let kl = row["mean_kl_nats"].as_f64().unwrap();
    assert!(kl > 1e-4 && kl.is_finite(), "{report}");
    assert_ne!(row["perplexity"], report["reference"]["perplexity"]);

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
    // f32 on the CPU: 9792 elements × 4 bytes = 38.25 KiB of ranks per token vs 45 KiB; the
    // cache stores them in multiples of 8 with each token's position: 39.54 KiB.
    assert!(text.contains("39.54 KiB per token vs 45.00 KiB"), "{text}");
    assert!(text.contains("the ranks alone 38.25 KiB"), "{text}");

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

/// Distillation from the CLI: two KD steps on 32-token windows, then two steps refining the
/// projections at the distilled ranks (enough to run every part — teacher, student forward
/// and backward, the budget projection, the refined factors — in CI time).
#[test]
fn calibrate_with_distillation_records_the_steps_and_meets_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let out = calibrate(
        dir.path(),
        "aggressive",
        &[
            "--distill-steps",
            "2",
            "--distill-window-tokens",
            "32",
            "--refine-steps",
            "2",
        ],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("distilled 2 steps"), "{text}");
    assert!(text.contains("refined 2 steps, last-step KL"), "{text}");
    let manifest = read_json(&dir.path().join("aggressive/manifest.json"));
    assert_eq!(manifest["rank_strategy"], "distilled_thresholds");
    assert_eq!(manifest["calibration"]["distillation_steps"], 2);
    assert_eq!(manifest["calibration"]["refinement_steps"], 2);
    assert_eq!(manifest["calibration"]["steps"], 4);
    let refinement = &manifest["refinement"];
    assert_eq!(refinement["window_tokens"], 32);
    let last_kl = refinement["last_step_kl"].as_f64().unwrap();
    assert!(last_kl.is_finite() && last_kl > 0.0, "{refinement}");
    assert_eq!(manifest["calibration"]["whitened"], true);
    // SmolLM2: 11 520 K/V elements per token; aggressive keeps ⌊0.7 · 11 520⌋ = 8064 (bf16).
    assert_eq!(
        manifest["compression"]["kv_bytes_per_token_compressed"],
        2 * 8064
    );
    // Distillation starts from uniform or greedy ranks, not from learned thresholds.
    let refused = starling(&[
        "calibrate",
        "--model",
        "smollm2-135m",
        "--strategy",
        "learned",
        "--distill-steps",
        "1",
        "--output",
        &dir.path().to_string_lossy(),
    ]);
    assert_clean_failure(&refused, "--distill-steps");
    // A negative refinement step size is refused before the model is loaded.
    let refused = starling(&[
        "calibrate",
        "--model",
        "smollm2-135m",
        "--refine-steps",
        "1",
        "--refine-lr=-0.1",
        "--output",
        &dir.path().to_string_lossy(),
    ]);
    assert_clean_failure(&refused, "--refine-lr");
}

#[test]
fn info_on_a_synthetic_preset_prints_every_profile_from_the_budget() {
    let out = synthetic_on_cpu(
        "info",
        "llama2-7b",
        &[
            "--kv-cache-memory",
            "8GiB",
            "--max-model-len",
            "4096",
            "--star-kv-budget",
        ],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Llama 2 7B: 32 layers × 2 × 4096 elements; conservative keeps 92% of them (f32: 942.08
    // KiB of 1 MiB), and the cache stores 955.24 KiB: the ranks in multiples of 8 and each
    // token's position in the 29 latent layers.
    assert!(text.contains("955.24 KiB per token vs 1.00 MiB"), "{text}");
    assert!(text.contains("the ranks alone 942.08 KiB"), "{text}");
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
    // More calibration text than the essays hold.
    let dir = tempfile::tempdir().unwrap();
    let out = starling(&[
        "calibrate",
        "--device",
        "cpu",
        "--profiles",
        "balanced",
        "--calibration-tokens",
        "100000000",
        "--output",
        &dir.path().to_string_lossy(),
    ]);
    assert_clean_failure(&out, "calibration-tokens");
    assert!(!dir.path().join("balanced").exists());
}
