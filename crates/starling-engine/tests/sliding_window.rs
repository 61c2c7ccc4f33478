//! Sliding-window models through the engine: the same greedy tokens as the reference path
//! (one private cache per step, every slot kept), blocks released behind the window when every
//! layer is windowed (so a context the full-attention preflight refuses boots and serves), all
//! blocks kept when some layer attends over everything, and eviction refused.

mod common;

use common::{tiny_weights, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::testing::{EngineTester, Trace, TraceOutcome};
use starling_engine::{Engine, EngineConfig};
use starling_evict::{CompressionConfig, CompressionMethod, KvCompression};
use starling_models::llama::{ForwardOptions, LlamaModel};
use starling_models::{ModelConfig, SlidingWindow};

const WINDOW_TOKENS: usize = 24;
const CHUNK_TOKENS: usize = 32;

fn windowed_config(layers: Vec<bool>) -> ModelConfig {
    let mut cfg = ModelConfig::tiny_llama_for_tests();
    cfg.max_position_embeddings = 4096;
    cfg.sliding_window = Some(SlidingWindow {
        tokens: WINDOW_TOKENS,
        layers,
        rope: None,
    });
    cfg
}

fn model(cfg: &ModelConfig) -> LlamaModel<CpuBackend> {
    LlamaModel::load(&CpuBackend::new(), cfg, tiny_weights(cfg, 11)).unwrap()
}

fn engine(
    cfg: &ModelConfig,
    kv_blocks: usize,
    max_model_len_tokens: usize,
    eviction: CompressionConfig,
) -> Result<Engine<CpuBackend>, starling_engine::EngineError> {
    let model = model(cfg);
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: CHUNK_TOKENS,
            max_model_len_tokens,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes_per_block * kv_blocks as u64,
        kv_compression: KvCompression {
            eviction,
            ..Default::default()
        },
        enable_prefix_caching: false,
        model_identity: None,
    };
    Engine::new(CpuBackend::new(), model, None, config)
}

/// Greedy continuation of every trace request by the reference path: each token from a fresh
/// single-sequence pass over the prompt and the tokens so far (every slot cached).
fn reference_tokens(cfg: &ModelConfig, trace: &Trace, outcome: &TraceOutcome) -> Vec<Vec<u32>> {
    let model = model(cfg);
    let backend = CpuBackend::new();
    trace
        .requests
        .iter()
        .zip(&outcome.requests)
        .map(|(request, result)| {
            let mut ids = request.prompt_ids.clone();
            for _ in 0..result.token_ids.len() {
                let last = ids.len() as u32 - 1;
                let logits = model
                    .forward_sequence(&backend, &ids, vec![last], ForwardOptions::default())
                    .unwrap();
                let row = logits.data();
                let best = (0..row.len())
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                    .unwrap();
                ids.push(best as u32);
            }
            ids[request.prompt_ids.len()..].to_vec()
        })
        .collect()
}

fn assert_matches_reference(cfg: &ModelConfig, trace: &Trace, outcome: &TraceOutcome) {
    let want = reference_tokens(cfg, trace, outcome);
    for (i, (got, want)) in outcome.requests.iter().zip(&want).enumerate() {
        assert_eq!(&got.token_ids, want, "request {i}");
    }
}

/// Every layer windowed: chunked, batched requests far longer than the window give the
/// reference's tokens while no request ever holds more than the window, a partial block and
/// one chunk.
#[test]
fn every_layer_windowed_matches_the_reference_and_releases_blocks() {
    let cfg = windowed_config(vec![true, true]);
    let trace = Trace::seeded_greedy(5, 6, cfg.vocab_size, 40..160, 8..24, 6);
    let mut engine = engine(&cfg, 256, 512, CompressionConfig::default()).unwrap();
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_matches_reference(&cfg, &trace, &outcome);
    let held_cap_blocks = (WINDOW_TOKENS + BLOCK_TOKENS + CHUNK_TOKENS).div_ceil(BLOCK_TOKENS) + 1;
    let held_cap_tokens = held_cap_blocks * BLOCK_TOKENS;
    for (i, r) in outcome.requests.iter().enumerate() {
        assert!(
            r.token_ids.len() >= 8,
            "request {i} generated {:?}",
            r.token_ids
        );
        // The physical length counts released slots; the blocks in use are what is held.
        assert!(r.max_physical_tokens >= 40, "request {i}");
    }
    assert!(
        outcome.max_blocks_in_use <= trace.requests.len() * held_cap_blocks,
        "{} blocks in use for {} requests (at most {held_cap_tokens} tokens each)",
        outcome.max_blocks_in_use,
        trace.requests.len()
    );
}

/// A budget of 20 blocks (80 slots) cannot hold a 512-token sequence with full attention, so the
/// full-attention preflight refuses it; with every layer windowed it boots, and a 400-token
/// prompt with 40 generated tokens is served within it, as the reference decodes it.
#[test]
fn a_context_the_full_preflight_refuses_boots_and_serves_under_a_window() {
    let full = ModelConfig {
        max_position_embeddings: 4096,
        ..ModelConfig::tiny_llama_for_tests()
    };
    let err = engine(&full, 20, 512, CompressionConfig::default())
        .err()
        .expect("full attention does not fit");
    assert!(err.to_string().contains("512"), "{err}");
    let cfg = windowed_config(vec![true, true]);
    let mut engine = engine(&cfg, 20, 512, CompressionConfig::default()).unwrap();
    let trace = Trace::seeded_greedy(9, 1, cfg.vocab_size, 400..401, 40..41, 1);
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_eq!(outcome.preemptions, 0);
    assert!(outcome.max_blocks_in_use <= 20);
    assert_matches_reference(&cfg, &trace, &outcome);
}

/// One windowed layer and one full one (Gemma-3's mix): the full layer reads every slot, so no
/// block is released, and the tokens still equal the reference's.
#[test]
fn mixed_layers_keep_every_block_and_match_the_reference() {
    let cfg = windowed_config(vec![true, false]);
    let trace = Trace::seeded_greedy(3, 3, cfg.vocab_size, 60..120, 6..12, 3);
    let mut engine = engine(&cfg, 256, 512, CompressionConfig::default()).unwrap();
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_matches_reference(&cfg, &trace, &outcome);
    let longest = trace
        .requests
        .iter()
        .zip(&outcome.requests)
        .map(|(t, r)| t.prompt_ids.len() + r.token_ids.len() - 1)
        .max()
        .unwrap();
    assert!(outcome.max_blocks_in_use >= longest.div_ceil(BLOCK_TOKENS));
}

/// Eviction on a windowed model is refused, engine-wide at start and per request.
#[test]
fn eviction_on_a_windowed_model_is_refused() {
    let cfg = windowed_config(vec![true, false]);
    let keydiff = CompressionConfig {
        method: CompressionMethod::KeyDiff,
        ratio: 0.5,
        ..Default::default()
    };
    let err = engine(&cfg, 256, 512, keydiff.clone())
        .err()
        .expect("eviction refused");
    assert!(err.to_string().contains("sliding-window"), "{err}");
    let mut engine = engine(&cfg, 256, 512, CompressionConfig::default()).unwrap();
    let err = engine
        .add_request_with(
            vec![5; 30],
            common::greedy(4),
            starling_engine::RequestOptions {
                compression: Some(keydiff),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("sliding-window"), "{err}");
}
