//! Tiny random models made by HF transformers' own architecture code — `Qwen3ForCausalLM`
//! (`tests/fixtures/qwen3_tiny`), `MistralForCausalLM` (`tests/fixtures/mistral_tiny`) and
//! `Gemma3ForCausalLM` (`tests/fixtures/gemma3_tiny`), all by `scripts/make_hf_fixture.py` —
//! loaded from their HF directories and run on the CPU
//! backend: logits at every position of each fixture's prompts and greedy continuations against
//! transformers' float32 CPU logits.

use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use serde::Deserialize;
use starling_backend::cpu::CpuBackend;
use starling_models::llama::LlamaModel;
use starling_models::{
    load_model, Architecture, ModelConfig, ModelError, SlidingWindow, WeightMap,
};

/// Mean |dlogit| allowed between Starling's f32 CPU backend and transformers' f32 CPU forward.
/// Both compute in f32 and differ only in summation order and in `rsqrt` vs `1/sqrt`; over two
/// layers of 64-wide sums that is a few f32 ulps of logits of magnitude ~1–10, i.e. around 1e-6
/// (measured: see the test's output). 1e-4 leaves room for other BLAS orders while staying four
/// orders of magnitude under what a missing head norm costs
/// (`dropping_the_head_norms_is_detected`).
const MEAN_ABS_DLOGIT_TOLERANCE: f32 = 1e-4;
/// HF's top two logits closer than this are a tie: either token is an agreement.
const TIE_MARGIN: f32 = 1e-4;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    /// `[prompt + greedy, vocab]`: the logits after every position.
    logits: Vec<Vec<f32>>,
}

const QWEN3: &str = "qwen3_tiny";
const MISTRAL: &str = "mistral_tiny";
const GEMMA3: &str = "gemma3_tiny";

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn fixture(name: &str) -> Fixture {
    let path = fixture_dir(name).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Whether `token` is HF's top-1 of `row`, or within [`TIE_MARGIN`] of it.
fn agrees(row: &[f32], token: usize) -> bool {
    row[token] >= row[argmax(row)] - TIE_MARGIN
}

/// Mean |dlogit| over every case, position and vocabulary entry of fixture `name`, and the
/// positions whose top-1 differs from HF's (ties aside), running `config` with `weights`.
fn compare(name: &str, config: &ModelConfig, weights: WeightMap) -> (f32, Vec<String>) {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights).unwrap();
    let (mut sum, mut count) = (0.0f64, 0usize);
    let mut disagreements = Vec::new();
    for (c, case) in fixture(name).cases.iter().enumerate() {
        let ids: Vec<u32> = case
            .prompt_ids
            .iter()
            .chain(&case.greedy_ids)
            .copied()
            .collect();
        assert_eq!(case.logits.len(), ids.len(), "case {c}: fixture rows");
        let ours = model.sequence_logits(&backend, &ids).unwrap();
        for (p, (got, want)) in ours.iter().zip(&case.logits).enumerate() {
            assert_eq!(got.len(), want.len(), "case {c}: vocabulary");
            for (a, b) in got.iter().zip(want) {
                sum += f64::from((a - b).abs());
                count += 1;
            }
            if !agrees(want, argmax(got)) {
                disagreements.push(format!("case {c} position {p}"));
            }
        }
    }
    ((sum / count as f64) as f32, disagreements)
}

#[test]
fn tiny_qwen3_matches_transformers_logits_and_greedy_tokens() {
    let loaded = load_model(fixture_dir(QWEN3)).unwrap();
    assert_eq!(loaded.config.architecture, Architecture::Qwen3);
    assert!(loaded.config.tie_word_embeddings);
    assert!(!loaded.config.attention_bias);
    assert_matches_transformers(QWEN3, &loaded.config, loaded.weights);
}

/// Fixture `name` run with `config` and `weights` matches transformers: mean |dlogit| under
/// [`MEAN_ABS_DLOGIT_TOLERANCE`] and HF's top-1 at every teacher-forced position (ties aside),
/// so the greedy continuations are HF's too.
fn assert_matches_transformers(name: &str, config: &ModelConfig, weights: WeightMap) {
    let (mean, disagreements) = compare(name, config, weights);
    println!("{name}: mean |dlogit| vs transformers (f32 CPU) = {mean:.3e}");
    assert!(
        mean < MEAN_ABS_DLOGIT_TOLERANCE,
        "mean |dlogit| {mean:.3e} over {MEAN_ABS_DLOGIT_TOLERANCE:e}"
    );
    assert!(
        disagreements.is_empty(),
        "top-1 differs at {disagreements:?}"
    );
}

/// The same weights run as a plain Llama (no q/k norm): the comparison must fail clearly, or
/// the test above could not see a missing or misplaced head norm.
#[test]
fn dropping_the_head_norms_is_detected() {
    let loaded = load_model(fixture_dir(QWEN3)).unwrap();
    let mut config = loaded.config.clone();
    config.architecture = Architecture::Llama;
    let (mean, _) = compare(QWEN3, &config, loaded.weights);
    println!("qwen3_tiny without head norms: mean |dlogit| = {mean:.3e}");
    assert!(
        mean > 100.0 * MEAN_ABS_DLOGIT_TOLERANCE,
        "without head norms the logits moved only {mean:.3e}"
    );
}

/// The fixture directory with one tensor left out of its safetensors file.
fn fixture_without(name: &str, tensor: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir(name).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let bytes = std::fs::read(fixture_dir(name).join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != tensor)
        .collect();
    assert!(kept.len() < file.len(), "the fixture has no {tensor}");
    safetensors::serialize_to_file(kept, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

#[test]
fn a_missing_head_norm_is_named() {
    for tensor in [
        "model.layers.1.self_attn.k_norm.weight",
        "model.layers.0.self_attn.q_norm.weight",
    ] {
        let dir = fixture_without(QWEN3, tensor);
        let err = load_model(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingTensor { name } if name == tensor),
            "{err}"
        );
        assert!(err.to_string().contains(tensor), "{err}");
    }
    // Building the model from a weight map (a caller that skipped the load-time check) names it
    // too.
    let mut loaded = load_model(fixture_dir(QWEN3)).unwrap();
    let name = "model.layers.1.self_attn.q_norm.weight";
    loaded.weights.take(name, &[16]).unwrap();
    let err = LlamaModel::load(&CpuBackend::new(), &loaded.config, loaded.weights)
        .err()
        .unwrap();
    assert!(
        matches!(&err, ModelError::MissingTensor { name: n } if n == name),
        "{err}"
    );
}

#[test]
fn tiny_mistral_matches_transformers_logits_and_greedy_tokens() {
    let loaded = load_model(fixture_dir(MISTRAL)).unwrap();
    assert_eq!(loaded.config.architecture, Architecture::Mistral);
    assert!(!loaded.config.tie_word_embeddings);
    assert!(!loaded.config.attention_bias);
    // Every layer attends over the last 5 tokens: shorter than two of the prompts, so the
    // logits past position 4 are the window's (full attention gives others).
    assert_eq!(loaded.config.max_position_embeddings, 512);
    assert_eq!(
        loaded.config.sliding_window,
        Some(SlidingWindow::every_layer(5, 2))
    );
    assert_matches_transformers(MISTRAL, &loaded.config, loaded.weights);
}

/// The same weights with full attention: the logits past the window must move clearly, or the
/// test above could not see a window ignored or off by one.
#[test]
fn ignoring_the_mistral_window_is_detected() {
    let loaded = load_model(fixture_dir(MISTRAL)).unwrap();
    for window in [None, Some(SlidingWindow::every_layer(4, 2))] {
        let mut config = loaded.config.clone();
        config.sliding_window = window.clone();
        let (mean, _) = compare(MISTRAL, &config, loaded.weights.clone());
        println!("mistral_tiny with window {window:?}: mean |dlogit| = {mean:.3e}");
        assert!(
            mean > 100.0 * MEAN_ABS_DLOGIT_TOLERANCE,
            "with window {window:?} the logits moved only {mean:.3e}"
        );
    }
}

#[test]
fn a_mistral_without_its_lm_head_is_named() {
    let tensor = "lm_head.weight";
    let err = load_model(fixture_without(MISTRAL, tensor).path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name == tensor),
        "{err}"
    );
}

/// Gemma-3: two windowed layers (5 tokens, local RoPE base 1e4) and a full one (1e6), one KV
/// head, q/k norms, a softmax scale of 24^-0.5, embeddings scaled by 8, GeGLU, four norms a
/// layer stored as offsets from one.
#[test]
fn tiny_gemma3_matches_transformers_logits_and_greedy_tokens() {
    let loaded = load_model(fixture_dir(GEMMA3)).unwrap();
    let config = &loaded.config;
    assert_eq!(config.architecture, Architecture::Gemma3);
    assert!(config.tie_word_embeddings);
    assert_eq!(config.layer_window_tokens(0), Some(5));
    assert_eq!(config.layer_window_tokens(2), None);
    assert_eq!(config.layer_rope(1).theta, 10_000.0);
    assert_eq!(config.layer_rope(2).theta, 1_000_000.0);
    assert!(!config.every_layer_windowed());
    assert_matches_transformers(GEMMA3, config, loaded.weights);
}

/// Each Gemma-3 ingredient left out moves the logits past ten times the tolerance (the faithful
/// run is near 1e-6), so the test above sees every one of them. The local RoPE base moves them
/// least: the fixture's positions stop at 25, where bases 1e4 and 1e6 differ little.
#[test]
fn each_gemma3_ingredient_is_detected() {
    let loaded = load_model(fixture_dir(GEMMA3)).unwrap();
    let mut variants: Vec<(&str, ModelConfig, WeightMap)> = Vec::new();
    let mut no_window = loaded.config.clone();
    no_window.sliding_window = None;
    variants.push(("no window", no_window, loaded.weights.clone()));
    let mut one_rope = loaded.config.clone();
    if let Some(w) = one_rope.sliding_window.as_mut() {
        w.rope = None;
    }
    variants.push(("global RoPE everywhere", one_rope, loaded.weights.clone()));
    let mut default_scale = loaded.config.clone();
    default_scale.attention_scale = None;
    variants.push((
        "1/sqrt(head_dim) scale",
        default_scale,
        loaded.weights.clone(),
    ));
    // The norms as stored by HF (offsets), without the one the loader adds.
    let offsets: WeightMap = loaded
        .weights
        .clone()
        .into_inner()
        .into_iter()
        .map(|(name, mut t)| {
            if starling_models::loader::weight_names::is_norm_weight(&name) {
                t.data_mut().iter_mut().for_each(|w| *w -= 1.0);
            }
            (name, t)
        })
        .collect();
    variants.push(("norm offsets", loaded.config.clone(), offsets));
    for (what, config, weights) in variants {
        let (mean, _) = compare(GEMMA3, &config, weights);
        println!("gemma3_tiny with {what}: mean |dlogit| = {mean:.3e}");
        assert!(
            mean > 10.0 * MEAN_ABS_DLOGIT_TOLERANCE,
            "{what}: the logits moved only {mean:.3e}"
        );
    }
}
