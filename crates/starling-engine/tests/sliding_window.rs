//! Sliding-window models through the engine: the same greedy tokens as the reference path
//! (one private cache per step, every slot kept), blocks released behind the window when every
//! layer is windowed (so a context the full-attention preflight refuses boots and serves), and
//! in the windowed layers' own block tables when some layers attend over everything (hybrid
//! cache groups); eviction keeps every window exact.

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

/// An engine over `kv_blocks` of the model's blocks (a hybrid model's block holds one group's
/// layers).
fn engine(
    cfg: &ModelConfig,
    kv_blocks: usize,
    max_model_len_tokens: usize,
    eviction: CompressionConfig,
) -> Result<Engine<CpuBackend>, starling_engine::EngineError> {
    let bytes = block_bytes(cfg) * kv_blocks as u64;
    engine_of_bytes(cfg, bytes, max_model_len_tokens, eviction)
}

/// Bytes of one of `cfg`'s cache blocks.
fn block_bytes(cfg: &ModelConfig) -> u64 {
    Engine::cache_layout_of(&CpuBackend::new(), &model(cfg)).bytes_per_block(BLOCK_TOKENS)
}

fn engine_of_bytes(
    cfg: &ModelConfig,
    kv_cache_memory_bytes: u64,
    max_model_len_tokens: usize,
    eviction: CompressionConfig,
) -> Result<Engine<CpuBackend>, starling_engine::EngineError> {
    let model = model(cfg);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: CHUNK_TOKENS,
            max_model_len_tokens,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes,
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

/// Gemma-3's mix (three windowed layers, one full; Gemma-3-270M has five and one): the
/// windowed layers keep their blocks in tables of their own, which give blocks back behind the
/// window, so a request holds its whole length in the full layer and about one window in the
/// others, and the tokens still equal the reference's.
#[test]
fn mixed_layers_release_the_windowed_layers_blocks_and_match_the_reference() {
    let cfg = hybrid_config();
    let trace = Trace::seeded_greedy(3, 3, cfg.vocab_size, 150..300, 6..12, 3);
    let mut engine = engine(&cfg, 512, 512, CompressionConfig::default()).unwrap();
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_matches_reference(&cfg, &trace, &outcome);
    let window_blocks = (WINDOW_TOKENS + BLOCK_TOKENS + CHUNK_TOKENS).div_ceil(BLOCK_TOKENS) + 1;
    let lengths: Vec<usize> = trace
        .requests
        .iter()
        .zip(&outcome.requests)
        .map(|(t, r)| t.prompt_ids.len() + r.token_ids.len())
        .collect();
    // Each request: its length in the full layer's group, a window in each windowed group.
    let bound: usize = lengths
        .iter()
        .map(|len| len.div_ceil(BLOCK_TOKENS) + 3 * window_blocks)
        .sum();
    let every_slot: usize = lengths
        .iter()
        .map(|len| 4 * len.div_ceil(BLOCK_TOKENS))
        .sum();
    assert!(
        outcome.max_blocks_in_use <= bound && bound < every_slot,
        "{} blocks in use; at most {bound} when windowed layers release, {every_slot} when not",
        outcome.max_blocks_in_use
    );
    let longest = lengths.iter().max().copied().unwrap_or(0);
    assert!(outcome.max_blocks_in_use >= (longest - 1).div_ceil(BLOCK_TOKENS));
}

/// The same mix at a budget full attention refuses: a 512-token sequence needs 4 x 128 layer
/// blocks (of 4 tokens) with every slot kept, but 128 + 3 x 15 with the windowed layers'
/// blocks released, so 200 layer blocks boot the hybrid model, serve a 440-token request as the
/// reference decodes it, and refuse the all-full one.
#[test]
fn a_hybrid_model_boots_where_keeping_every_slot_is_refused() {
    let cfg = hybrid_config();
    let layer_block_bytes = block_bytes(&cfg);
    let mut full = cfg.clone();
    full.sliding_window = None;
    assert_eq!(block_bytes(&full), 4 * layer_block_bytes);
    let window_blocks = (WINDOW_TOKENS + BLOCK_TOKENS + CHUNK_TOKENS).div_ceil(BLOCK_TOKENS);
    assert_eq!((512 / BLOCK_TOKENS, window_blocks), (128, 15));
    let budget = 200 * layer_block_bytes;
    let err = engine_of_bytes(&full, budget, 512, CompressionConfig::default())
        .err()
        .expect("full attention does not fit");
    assert!(err.to_string().contains("512"), "{err}");
    let mut engine = engine_of_bytes(&cfg, budget, 512, CompressionConfig::default()).unwrap();
    assert_eq!(engine.preflight().sizing.num_blocks, 200);
    let trace = Trace::seeded_greedy(4, 1, cfg.vocab_size, 400..401, 40..41, 1);
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_eq!(outcome.preemptions, 0);
    let held = 440usize.div_ceil(BLOCK_TOKENS) + 3 * window_blocks;
    assert!(
        outcome.max_blocks_in_use <= held,
        "{}",
        outcome.max_blocks_in_use
    );
    assert_matches_reference(&cfg, &trace, &outcome);
}

/// The mix under memory pressure: six requests in a cache that holds about two of them are
/// preempted and recomputed (every group's blocks freed and taken again) and still give the
/// reference's tokens, with the pool's accounting checked after every step.
#[test]
fn a_hybrid_cache_under_pressure_preempts_and_still_matches_the_reference() {
    let cfg = hybrid_config();
    let trace = Trace::seeded_greedy(8, 6, cfg.vocab_size, 100..180, 10..20, 6);
    let mut engine = engine(&cfg, 150, 256, CompressionConfig::default()).unwrap();
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert!(outcome.preemptions > 0, "the cache was not under pressure");
    assert!(outcome.max_blocks_in_use <= 150);
    assert_matches_reference(&cfg, &trace, &outcome);
}

/// Four layers, the last attending over everything, the others over [`WINDOW_TOKENS`].
fn hybrid_config() -> ModelConfig {
    let mut cfg = windowed_config(vec![true, true, true, false]);
    cfg.num_layers = 4;
    cfg
}

/// KeyDiff at 0.5 engine-wide, asking for only 4 protected recent tokens.
fn keydiff() -> CompressionConfig {
    CompressionConfig {
        method: CompressionMethod::KeyDiff,
        ratio: 0.5,
        window_tokens: 4,
        every_n_tokens: 8,
        ..Default::default()
    }
}

/// Eviction on a model whose every layer is windowed: the engine protects at least the window's
/// recent tokens, so each query's window of slots holds exactly its last 24 positions and
/// nothing the model reads changes — the greedy tokens equal the uncompressed reference's —
/// while compaction drops half of the older tokens from the cache.
#[test]
fn eviction_on_an_all_windowed_model_keeps_every_window_exact() {
    let cfg = windowed_config(vec![true, true]);
    let trace = Trace::seeded_greedy(12, 4, cfg.vocab_size, 120..200, 10..20, 4);
    let mut engine = engine(&cfg, 512, 512, keydiff()).unwrap();
    let outcome = EngineTester::default().run(&mut engine, &trace).unwrap();
    assert_matches_reference(&cfg, &trace, &outcome);
    for (i, (t, r)) in trace.requests.iter().zip(&outcome.requests).enumerate() {
        let len = t.prompt_ids.len() + r.token_ids.len();
        assert!(
            r.max_physical_tokens < len,
            "request {i} kept all {len} tokens"
        );
    }
    assert!(engine.stats().counters.compressions > 0);
}

/// Eviction on Gemma's mix: every layer keeps its slots in one table (the compaction keeps old
/// tokens a windowed group would have given back), the windowed layers still see exact windows
/// and the full layer the kept tokens; requests hold fewer slots than tokens. An engine that
/// releases behind the window (started without eviction) refuses a request's own eviction.
#[test]
fn eviction_on_a_hybrid_model_compacts_one_table_and_requests_cannot_bring_their_own() {
    let cfg = hybrid_config();
    let trace = Trace::seeded_greedy(13, 3, cfg.vocab_size, 120..200, 10..20, 3);
    let mut evicting = engine(&cfg, 512, 512, keydiff()).unwrap();
    let outcome = EngineTester::default().run(&mut evicting, &trace).unwrap();
    for (i, (t, r)) in trace.requests.iter().zip(&outcome.requests).enumerate() {
        let len = t.prompt_ids.len() + r.token_ids.len();
        assert!(r.token_ids.len() >= 10, "request {i}");
        assert!(
            r.max_physical_tokens < len,
            "request {i} kept all {len} tokens"
        );
    }
    let mut releasing = engine(&cfg, 512, 512, CompressionConfig::default()).unwrap();
    let err = releasing
        .add_request_with(
            vec![5; 30],
            common::greedy(4),
            starling_engine::RequestOptions {
                compression: Some(keydiff()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("sliding window"), "{err}");
}
