//! `starling bench niah` and `starling bench quality` end to end on the CPU with SmolLM2 (real
//! tokenizer and chat template) and a small essay folder made here (no network): short contexts
//! so each run takes seconds.

use std::path::Path;

use serde_json::Value;

mod common;

use common::{starling, stderr};

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Ten essays of varied sentences (a fixed pseudo-random word walk), so eviction has something
/// to choose between; the last eight by name are the held-out set.
fn write_essays(dir: &Path) {
    const WORDS: [&str; 24] = [
        "startups",
        "grow",
        "when",
        "founders",
        "talk",
        "to",
        "users",
        "every",
        "week",
        "and",
        "investors",
        "notice",
        "the",
        "numbers",
        "rather",
        "than",
        "ideas",
        "which",
        "often",
        "seem",
        "wrong",
        "at",
        "first",
        "glance",
    ];
    let mut state: u64 = 12345;
    for essay in 0..10 {
        let mut text = String::new();
        for _ in 0..40 {
            let length = 6 + (state % 7) as usize;
            let words: Vec<&str> = (0..length)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    WORDS[(state >> 33) as usize % WORDS.len()]
                })
                .collect();
            let sentence = words.join(" ");
            let mut chars = sentence.chars();
            if let Some(first) = chars.next() {
                text.push_str(&first.to_uppercase().collect::<String>());
                text.push_str(chars.as_str());
            }
            text.push_str(". ");
        }
        std::fs::write(dir.join(format!("essay{essay:02}.txt")), text).unwrap();
    }
}

#[test]
fn niah_runs_every_cell_of_every_method_and_writes_the_reports() {
    let root = tempfile::tempdir().unwrap();
    let essays = root.path().join("essays");
    std::fs::create_dir_all(&essays).unwrap();
    write_essays(&essays);
    let out_dir = root.path().join("out");
    // HF answers with empty outputs: the agreement must be computed and report no identical cell.
    let hf_cells: Vec<Value> = [(112, 0.0), (112, 100.0), (144, 0.0), (144, 100.0)]
        .iter()
        .map(|&(context, depth)| {
            serde_json::json!({
                "context_tokens": context, "depth_percent": depth, "prompt_tokens": context,
                "output_ids": [], "answer": "Eat a sandwich."
            })
        })
        .collect();
    let hf = serde_json::json!({ "generator": {"script": "test"}, "cells": hf_cells });
    let hf_path = root.path().join("hf_answers.json");
    std::fs::write(&hf_path, hf.to_string()).unwrap();
    let out = starling(&[
        "bench",
        "niah",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--contexts",
        "112,144",
        "--depths",
        "0,100",
        "--methods",
        "none,streaming_llm@0.5",
        "--max-new-tokens",
        "8",
        "--essays-dir",
        essays.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
        "--dump-prompts",
        "--compare-hf",
        hf_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("not the published essay set"),
        "{}",
        stderr(&out)
    );

    let report = read_json(&out_dir.join("niah_results.json"));
    assert_eq!(
        report["methods"][1]["compression"]["method"],
        "streaming_llm"
    );
    assert_eq!(report["methods"][1]["compression"]["ratio"], 0.5);
    let bytes_per_token = report["kv_bytes_per_token"].as_u64().unwrap();
    let block_tokens = report["kv_cache"]["block_size_tokens"].as_u64().unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 8);
    let find = |method: &str, context: u64, depth: f64| {
        cells
            .iter()
            .find(|c| {
                c["method"] == method
                    && c["context_tokens"] == context
                    && c["depth_percent"].as_f64() == Some(depth)
            })
            .unwrap_or_else(|| panic!("no cell {method} {context} {depth}"))
    };
    for cell in cells {
        assert_eq!(cell["prompt_tokens"], cell["context_tokens"], "{cell}");
        // The bytes of the whole blocks the request holds.
        let kv = cell["kv_tokens_final"].as_u64().unwrap();
        assert_eq!(
            cell["kv_bytes_final"].as_u64().unwrap(),
            kv.div_ceil(block_tokens) * block_tokens * bytes_per_token
        );
        let generated = cell["output_ids"].as_array().unwrap().len();
        assert!((1..=8).contains(&generated), "{cell}");
        let score = cell["fact_score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&score), "{cell}");
    }
    for context in [112, 144] {
        for depth in [0.0, 100.0] {
            let none = find("none", context, depth)["kv_tokens_final"]
                .as_u64()
                .unwrap();
            let evicted = find("streaming_llm@0.5", context, depth)["kv_tokens_final"]
                .as_u64()
                .unwrap();
            assert!(evicted < none, "{context}@{depth}: {evicted} !< {none}");
        }
    }
    // The needle sits right after the chat prefix at depth 0 and right before the question at
    // 100%, whatever the context length.
    let needle = |context, depth| {
        find("none", context, depth)["needle_token_index"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(needle(112, 0.0), needle(144, 0.0));
    assert_eq!(112 - needle(112, 100.0), 144 - needle(144, 100.0));

    let prompts = read_json(&out_dir.join("prompts.json"));
    let lengths: Vec<usize> = prompts["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["prompt_ids"].as_array().unwrap().len())
        .collect();
    assert_eq!(lengths, [112, 112, 144, 144]);
    assert_eq!(prompts["max_new_tokens"], 8);

    let summary = std::fs::read_to_string(out_dir.join("niah_summary.md")).unwrap();
    assert!(
        summary.contains("| method | 112 | 144 | mean |"),
        "{summary}"
    );
    assert!(summary.contains("| streaming_llm@0.5 |"), "{summary}");
    assert!(
        summary.contains("0 of 4 cells generate identical tokens"),
        "{summary}"
    );
    assert!(out_dir.join("hf_agreement.json").is_file());
    for name in ["heatmap_none.png", "heatmap_streaming_llm_0.5.png"] {
        let bytes = std::fs::read(out_dir.join(name)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{name}");
    }
}

#[test]
fn quality_reports_zero_kl_for_none_and_a_positive_one_for_eviction() {
    let root = tempfile::tempdir().unwrap();
    let essays = root.path().join("essays");
    std::fs::create_dir_all(&essays).unwrap();
    write_essays(&essays);
    let out_dir = root.path().join("out");
    let out = starling(&[
        "bench",
        "quality",
        "--device",
        "cpu",
        "--model",
        "smollm2-135m",
        "--context-tokens",
        "96",
        "--eval-tokens",
        "8",
        "--num-windows",
        "2",
        "--methods",
        "none,keydiff@0.5",
        "--essays-dir",
        essays.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report = read_json(&out_dir.join("quality.json"));
    let reference = &report["reference"];
    assert!(reference["mean_kl_nats"].is_null());
    let ppl = reference["perplexity"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{reference}");
    assert_eq!(reference["scored_tokens"], 16);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // The same uncompressed request in the same batch: the same distributions.
    let none_kl = rows[0]["mean_kl_nats"].as_f64().unwrap();
    assert!(none_kl < 1e-6, "{}", rows[0]);
    let keydiff_kl = rows[1]["mean_kl_nats"].as_f64().unwrap();
    assert!(keydiff_kl > 1e-6 && keydiff_kl.is_finite(), "{}", rows[1]);
    assert_eq!(rows[1]["compression"]["method"], "keydiff");
    let kv = |row: &Value| row["kv_tokens_final_mean"].as_f64().unwrap();
    assert!(kv(&rows[1]) < kv(reference), "{report}");
    let md = std::fs::read_to_string(out_dir.join("quality.md")).unwrap();
    assert!(md.contains("| keydiff@0.5 |"), "{md}");
}

#[test]
fn bad_grids_fail_cleanly_before_any_model_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().to_str().unwrap();
    for (args, needle) in [
        (vec!["--methods", "keydiff@1.5"], "ratio"),
        (vec!["--methods", "h2o@0.5"], "unknown method"),
        (vec!["--contexts", "4x"], "context length"),
        (vec!["--depths", "150"], "depth"),
    ] {
        let mut full = vec!["bench", "niah", "--device", "cpu", "--output", output];
        full.extend(args);
        let out = starling(&full);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "expected {needle:?} in: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
