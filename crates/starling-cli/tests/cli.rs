//! The `starling` binary end to end: real generation, and bad input that must end in a clear
//! error and a non-zero exit code, never a panic.

use std::path::Path;

mod common;

use common::{assert_clean_failure, starling, stderr, synthetic_on_cpu};

#[test]
fn generate_continues_the_capital_of_france_with_paris() {
    let out = starling(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("The capital of France is Paris"),
        "stdout: {text}"
    );
}

#[test]
fn info_prints_kv_figures_and_preflight_refuses_a_tiny_budget() {
    let out = starling(&[
        "info",
        "--model",
        "smollm2-135m",
        "--kv-cache-memory",
        "1GiB",
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // 30 layers × (K+V) × 3 kv heads × 64 × 4 bytes = 46080 bytes = 45 KiB per token in f32.
    assert!(text.contains("45.00 KiB per token"), "stdout: {text}");
    assert!(text.contains("max concurrency"), "stdout: {text}");
    let out = starling(&[
        "info",
        "--model",
        "smollm2-135m",
        "--kv-cache-memory",
        "1MiB",
    ]);
    assert_clean_failure(&out, "available");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn malformed_model_files_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let not_gguf = write(
        dir.path(),
        "wrong-magic.gguf",
        b"NOPE\x03\x00\x00\x00 not a model at all",
    );
    let out = starling(&["info", "--model", &not_gguf]);
    assert_clean_failure(&out, "gguf");

    // A real header cut short: the magic and version of GGUF v3, then nothing.
    let truncated = write(
        dir.path(),
        "truncated.gguf",
        b"GGUF\x03\x00\x00\x00\x05\x00",
    );
    let out = starling(&["generate", "--model", &truncated, "--prompt", "hi"]);
    assert_clean_failure(&out, "truncated");

    let out = starling(&["info", "--model", "no-such-model-or-path"]);
    assert_clean_failure(&out, "smollm2-135m");
}

#[test]
fn over_long_prompts_and_bad_parameters_fail_cleanly() {
    let long = "word ".repeat(64);
    let out = starling(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--max-model-len",
        "32",
        "--prompt",
        &long,
    ]);
    assert_clean_failure(&out, "max_model_len");
    let out = starling(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "hi",
        "--top-p",
        "1.5",
    ]);
    assert_clean_failure(&out, "top_p");
}

#[test]
fn synthetic_load_format_builds_a_preset_and_refuses_unknown_presets() {
    let out = synthetic_on_cpu(
        "generate",
        "smollm2-135m",
        &[
            "--prompt",
            "hello",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--ignore-eos",
        ],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("3 generated"),
        "stderr: {}",
        stderr(&out)
    );
    let out = starling(&["info", "--load-format", "synthetic", "--model", "gpt-17"]);
    assert_clean_failure(&out, "preset");
}
