//! STAR-KV latents in the engine, on the tiny CPU model: the latent path (the cache stores
//! latents, attention reconstructs) generates exactly what the reference path (K/V weights
//! replaced by their reconstructions, full K/V cached) generates — through chunked prefill,
//! batching, preemption and token eviction — while the same bytes buy more blocks.

mod common;

use common::{tiny_weights, total_variation, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::testing::{first_divergence, EngineTester, Trace, TraceOutcome, TraceRequest};
use starling_engine::{Engine, EngineConfig};
use starling_evict::{CompressionConfig, CompressionMethod};
use starling_kv::CacheDtype;
use starling_models::llama::LlamaModel;
use starling_models::{ModelConfig, WeightMap};
use starling_starkv::{
    apply_projections, latent_layers, AppliedSides, KvShape, LayerRanks, ModelFactors,
    ModelProjections, RankAllocation, UncompressedLayers,
};

/// The tiny model (2 layers, 2 KV heads × 16) and projections compressing both layers to ranks
/// that are not multiples of the stored 8 (so padding is exercised).
fn fixture() -> (ModelConfig, WeightMap, ModelProjections) {
    let cfg = ModelConfig::tiny_llama_for_tests();
    let weights = tiny_weights(&cfg, 11);
    let factors = ModelFactors::compute(&cfg, &weights, &UncompressedLayers::none(), None).unwrap();
    let ranks = LayerRanks {
        key_ranks: vec![9, 13],
        value_rank: 21,
    };
    let allocation =
        RankAllocation::new(KvShape::of(&cfg), vec![Some(ranks.clone()), Some(ranks)]).unwrap();
    let projections = ModelProjections::from_factors(&factors, &allocation).unwrap();
    (cfg, weights, projections)
}

fn latent_model(
    cfg: &ModelConfig,
    weights: &WeightMap,
    p: &ModelProjections,
) -> LlamaModel<CpuBackend> {
    let latents = latent_layers(cfg, weights, p, AppliedSides::Both).unwrap();
    LlamaModel::load_latent(&CpuBackend::new(), cfg, weights.clone(), latents).unwrap()
}

fn reference_model(
    cfg: &ModelConfig,
    weights: &WeightMap,
    p: &ModelProjections,
) -> LlamaModel<CpuBackend> {
    let mut weights = weights.clone();
    apply_projections(cfg, &mut weights, p).unwrap();
    LlamaModel::load(&CpuBackend::new(), cfg, weights).unwrap()
}

/// An engine with exactly `blocks` blocks of the model's own layout.
fn engine(model: LlamaModel<CpuBackend>, blocks: usize, batched: usize) -> Engine<CpuBackend> {
    engine_with(model, blocks, batched, false)
}

/// [`engine`] with automatic prefix caching on or off.
fn engine_with(
    model: LlamaModel<CpuBackend>,
    blocks: usize,
    batched: usize,
    enable_prefix_caching: bool,
) -> Engine<CpuBackend> {
    let bytes = model
        .cache_layout(CacheDtype::F32)
        .bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: batched,
            // The longest context that fits the pool (the preflight's rule).
            max_model_len_tokens: (blocks * BLOCK_TOKENS).min(256),
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes * blocks as u64,
        kv_compression: Default::default(),
        enable_prefix_caching,
        model_identity: None,
    };
    let engine = Engine::new(CpuBackend::new(), model, None, config).unwrap();
    assert_eq!(engine.stats().kv_blocks_total, blocks);
    engine
}

fn trace() -> Trace {
    Trace::seeded_greedy(5, 7, 128, 6..70, 4..24, 6)
}

fn run(engine: &mut Engine<CpuBackend>, trace: &Trace) -> TraceOutcome {
    EngineTester::default().run(engine, trace).unwrap()
}

fn assert_same_tokens(latent: &TraceOutcome, reference: &TraceOutcome) {
    assert_eq!(
        first_divergence(latent, reference),
        None,
        "latent {:?}\nreference {:?}",
        latent.requests,
        reference.requests
    );
}

#[test]
fn latent_path_generates_what_the_reference_path_generates() {
    let (cfg, weights, p) = fixture();
    let trace = trace();
    // Chunks of 16 tokens: every prompt is prefilled in several steps beside decodes.
    let latent = run(
        &mut engine(latent_model(&cfg, &weights, &p), 400, 16),
        &trace,
    );
    let reference = run(
        &mut engine(reference_model(&cfg, &weights, &p), 400, 16),
        &trace,
    );
    assert_same_tokens(&latent, &reference);
    // Same blocks, same scheduling, same books.
    assert_eq!(latent.max_blocks_in_use, reference.max_blocks_in_use);
    assert_eq!(latent.steps, reference.steps);
    assert_eq!(latent.preemptions, 0);
}

#[test]
fn preemption_and_recompute_keep_the_latent_outputs() {
    let (cfg, weights, p) = fixture();
    let trace = trace();
    // 40 blocks of 4 tokens for requests of up to ~90 tokens each: preemption is forced.
    let latent = run(
        &mut engine(latent_model(&cfg, &weights, &p), 40, 32),
        &trace,
    );
    let reference = run(
        &mut engine(reference_model(&cfg, &weights, &p), 40, 32),
        &trace,
    );
    assert!(latent.preemptions > 0, "the trace must preempt");
    assert_eq!(latent.preemptions, reference.preemptions);
    assert_same_tokens(&latent, &reference);
    // Preempted requests still generate what they generate with room to spare.
    let roomy = run(
        &mut engine(latent_model(&cfg, &weights, &p), 400, 32),
        &trace,
    );
    assert_same_tokens(&latent, &roomy);
}

/// `method` at ratio 0.5 keeping the same tokens for every head (`head_wise: false`), as a
/// latent layer does.
fn layer_wide_policy(method: CompressionMethod) -> CompressionConfig {
    CompressionConfig {
        method,
        ratio: 0.5,
        sink_tokens: 2,
        window_tokens: 4,
        every_n_tokens: 8,
        seed: 3,
        head_wise: false,
    }
}

#[test]
fn eviction_composes_with_latents() {
    let (cfg, weights, p) = fixture();
    for method in [
        CompressionMethod::KeyDiff,
        CompressionMethod::KNorm,
        CompressionMethod::SnapKv,
        CompressionMethod::StreamingLlm,
    ] {
        // A latent layer keeps the same tokens for every head; the reference path is told to
        // do the same (`head_wise: false`), so both evict exactly the same tokens.
        let policy = layer_wide_policy(method);
        let trace = trace().with_options(|_, o| o.compression = Some(policy.clone()));
        let latent = run(
            &mut engine(latent_model(&cfg, &weights, &p), 400, 16),
            &trace,
        );
        let reference = run(
            &mut engine(reference_model(&cfg, &weights, &p), 400, 16),
            &trace,
        );
        assert!(
            latent.compressions > 0 && latent.evicted_blocks > 0,
            "{method}"
        );
        assert_eq!(latent.compressions, reference.compressions, "{method}");
        assert_same_tokens(&latent, &reference);
        for (l, r) in latent.requests.iter().zip(&reference.requests) {
            assert_eq!(l.max_physical_tokens, r.max_physical_tokens, "{method}");
        }
    }
}

#[test]
fn the_same_bytes_buy_blocks_in_the_byte_ratio_and_boot_a_longer_context() {
    let (cfg, weights, p) = fixture();
    let latent = latent_model(&cfg, &weights, &p);
    let reference = reference_model(&cfg, &weights, &p);
    let latent_bytes = latent.cache_layout(CacheDtype::F32).bytes_per_token();
    let full_bytes = reference.cache_layout(CacheDtype::F32).bytes_per_token();
    // 2 layers × 2 × 32 f32 = 512 B full; latent rows of 16 + 16 + 24 stored f32 + a position.
    assert_eq!(full_bytes, 512);
    assert_eq!(latent_bytes, 2 * ((16 + 16 + 24) * 4 + 4));
    let budget = 1 << 20;
    let config = |max_len: usize, bytes: u64| EngineConfig {
        kv_cache_memory_bytes: bytes,
        ..EngineConfig::with_defaults(max_len, budget)
    };
    let dense = Engine::new(CpuBackend::new(), reference, None, config(256, budget)).unwrap();
    let compressed = Engine::new(CpuBackend::new(), latent, None, config(256, budget)).unwrap();
    let per_block = |b: u64| budget / (b * 16);
    assert_eq!(dense.stats().kv_blocks_total as u64, per_block(full_bytes));
    assert_eq!(
        compressed.stats().kv_blocks_total as u64,
        per_block(latent_bytes)
    );
    // A budget of 232 full tokens refuses a 256-token context; its latents fit.
    let small = 232 * full_bytes;
    let (cfg2, weights2, p2) = fixture();
    assert!(Engine::new(
        CpuBackend::new(),
        reference_model(&cfg2, &weights2, &p2),
        None,
        config(256, small)
    )
    .is_err());
    let mut boots = Engine::new(
        CpuBackend::new(),
        latent_model(&cfg2, &weights2, &p2),
        None,
        config(256, small),
    )
    .unwrap();
    let long = Trace::seeded_greedy(9, 1, 128, 250..251, 5..6, 1);
    let outcome = run(&mut boots, &long);
    assert_eq!(outcome.requests[0].token_ids.len(), 5);
}

/// Requests sharing a 33-token prefix (8 full blocks), arriving after the first is computed,
/// with `options` for every request but the first.
fn shared_prefix_trace(options: starling_engine::RequestOptions) -> Trace {
    let base = Trace::seeded_greedy(17, 4, 128, 33..34, 6..14, 1);
    let prefix = base.requests[0].prompt_ids.clone();
    let requests = base
        .requests
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.prompt_ids = prefix.clone();
            r.prompt_ids
                .extend((0..5 + 3 * i as u32).map(|t| (t * 29 + 7 * i as u32) % 120 + 3));
            if i > 0 {
                r.options = options.clone();
            }
            TraceRequest {
                arrival_step: 2 * i,
                ..r
            }
        })
        .collect();
    Trace { requests }
}

#[test]
fn latent_blocks_are_shared_through_the_prefix_cache() {
    let (cfg, weights, p) = fixture();
    let trace = shared_prefix_trace(Default::default());
    let plain = run(
        &mut engine_with(latent_model(&cfg, &weights, &p), 400, 64, false),
        &trace,
    );
    let cached = run(
        &mut engine_with(latent_model(&cfg, &weights, &p), 400, 64, true),
        &trace,
    );
    assert_same_tokens(&cached, &plain);
    // Three later requests reuse the prefix's 8 latent blocks each.
    assert_eq!(cached.prefix_cache_hit_tokens, 3 * 8 * BLOCK_TOKENS as u64);
    assert_eq!(
        cached.prefill_tokens,
        plain.prefill_tokens - cached.prefix_cache_hit_tokens
    );
}

#[test]
fn latent_requests_sharing_with_compressed_ones_generate_what_they_do_alone() {
    // The first request (plain) computes the prefix and stays running; the later ones compress
    // (layer-wide, as latent layers must) and share its blocks: they never compact them, so
    // the first generates exactly what it does with caching off.
    let (cfg, weights, p) = fixture();
    let policy = layer_wide_policy(CompressionMethod::KeyDiff);
    let mut trace = shared_prefix_trace(starling_engine::RequestOptions {
        compression: Some(policy),
        ..Default::default()
    });
    trace.requests[0].params.max_tokens = Some(40);
    let plain = run(
        &mut engine_with(latent_model(&cfg, &weights, &p), 400, 64, false),
        &trace,
    );
    let cached = run(
        &mut engine_with(latent_model(&cfg, &weights, &p), 400, 64, true),
        &trace,
    );
    assert!(cached.compressions > 0 && cached.prefix_cache_hit_tokens > 0);
    assert_eq!(cached.requests[0].token_ids, plain.requests[0].token_ids);
    assert!(cached.requests.iter().all(|r| r.finish_reason == "length"));
}

/// A latent engine whose cache stores `kv_dtype` elements in the bytes of `f32_blocks` f32 blocks.
fn latent_engine_in(
    model: LlamaModel<CpuBackend>,
    f32_blocks: usize,
    kv_dtype: starling_evict::KvCacheDtype,
) -> Engine<CpuBackend> {
    let bytes = model
        .cache_layout(CacheDtype::F32)
        .bytes_per_block(BLOCK_TOKENS);
    let mut config = EngineConfig {
        kv_compression: starling_evict::KvCompression {
            kv_dtype,
            ..Default::default()
        },
        ..EngineConfig::with_defaults(256, bytes * f32_blocks as u64)
    };
    config.scheduler.block_size_tokens = BLOCK_TOKENS;
    config.scheduler.max_num_batched_tokens = 16;
    config.scheduler.max_num_seqs = 8;
    Engine::new(CpuBackend::new(), model, None, config).unwrap()
}

#[test]
fn quantised_latents_take_their_bytes_and_track_the_full_precision_latents() {
    use starling_evict::KvCacheDtype;
    let (cfg, weights, p) = fixture();
    let tester = EngineTester::default();
    let reference = tester
        .run(
            &mut latent_engine_in(latent_model(&cfg, &weights, &p), 64, KvCacheDtype::Auto),
            &trace(),
        )
        .unwrap();
    let forced = trace().forced_to(&reference);
    let mut f32 = latent_engine_in(latent_model(&cfg, &weights, &p), 64, KvCacheDtype::Auto);
    assert_eq!(f32.cache_layout().bytes_per_token(), 2 * (56 * 4 + 4));
    let full_precision = tester.run(&mut f32, &forced).unwrap();
    // Latent rows of 16 + 16 + 24 elements: 56 bytes in fp8 or int8 plus the exact 4-byte
    // position; int8 adds a 2-byte scale per latent (two key heads and the value: 6 bytes);
    // int4 holds two elements per byte and a scale per started group of 32 (one per latent).
    let mut moved = Vec::new();
    // The bound on the mean total variation: the sharp test model moves under 15 levels per
    // group far more than under one byte per element (int4: ~0.36 here).
    for (kv_dtype, dtype, name, row_bytes, bound) in [
        (KvCacheDtype::Fp8, CacheDtype::Fp8, "fp8", 56 + 4, 0.2),
        (
            KvCacheDtype::Int8,
            CacheDtype::Int8,
            "int8",
            56 + 6 + 4,
            0.2,
        ),
        (
            KvCacheDtype::Int4,
            CacheDtype::Int4,
            "int4",
            28 + 6 + 4,
            0.5,
        ),
    ] {
        let mut engine = latent_engine_in(latent_model(&cfg, &weights, &p), 64, kv_dtype);
        let layout = engine.cache_layout();
        assert!(layout
            .layers
            .iter()
            .all(|l| l.is_low_rank() && l.dtype() == dtype));
        assert_eq!(layout.bytes_per_token(), 2 * row_bytes);
        assert_eq!(
            engine.stats().kv_blocks_total,
            64 * (56 * 4 + 4) / row_bytes as usize
        );
        let report = engine.cache_report();
        assert!(report.dtype.contains(name), "{report}");
        // Teacher-forced to the same tokens, the next-token distributions move by what the
        // rounding of the latents moves them (not at all would mean nothing was rounded; most
        // of their mass would mean wrong bytes or positions).
        let quantised = tester.run(&mut engine, &forced).unwrap();
        let (mean, _, rows) = total_variation(&full_precision, &quantised);
        println!("{name} vs f32 latents over {rows} positions: total variation mean {mean:.4}");
        assert!(mean > 0.0 && mean < bound, "{name}: mean {mean:.4}");
        moved.push(mean);
    }
    // 127 steps of a per-latent scale resolve finer than e4m3's 3 mantissa bits.
    assert!(moved[1] < moved[0], "int8 {} vs fp8 {}", moved[1], moved[0]);
    // 15 levels per group move them more than 255 per latent.
    assert!(
        moved[2] > moved[1],
        "int4 {} vs int8 {}",
        moved[2],
        moved[1]
    );

    // Eviction compacts fp8 latent blocks and gives blocks back.
    let policy = layer_wide_policy(CompressionMethod::KeyDiff);
    let evicting = trace().with_options(|_, o| o.compression = Some(policy.clone()));
    let mut engine = latent_engine_in(latent_model(&cfg, &weights, &p), 64, KvCacheDtype::Fp8);
    let outcome = run(&mut engine, &evicting);
    assert!(
        outcome.compressions > 0 && outcome.evicted_blocks > 0,
        "{outcome:?}"
    );
}
