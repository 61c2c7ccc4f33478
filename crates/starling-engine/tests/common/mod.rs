//! A tiny random-weight model and engine for the integration tests.
#![allow(dead_code)] // Each test binary uses a different subset.

use starling_backend::cpu::CpuBackend;
use starling_engine::sampling::SamplingParams;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig};
use starling_evict::{CompressionConfig, KvCacheDtype, KvCompression};
use starling_models::llama::LlamaModel;
use starling_models::{synthetic_weights, ModelConfig, WeightMap};

/// Random weights scaled up from the N(0, 0.02) init so logits are well separated (no near-ties
/// that summation order could flip).
pub fn tiny_weights(cfg: &ModelConfig, seed: u64) -> WeightMap {
    synthetic_weights(cfg, seed)
        .into_inner()
        .into_iter()
        .map(|(name, mut t)| {
            if !name.ends_with("norm.weight") {
                t.data_mut().iter_mut().for_each(|v| *v *= 15.0);
            }
            (name, t)
        })
        .collect()
}

/// The 2-layer test model (4 query / 2 KV heads × 16) with fixed weights.
pub fn tiny_model() -> LlamaModel<CpuBackend> {
    let cfg = ModelConfig::tiny_llama_for_tests();
    LlamaModel::load(&CpuBackend::new(), &cfg, tiny_weights(&cfg, 11)).unwrap()
}

/// A deterministic prompt of `len` ids inside the tiny vocabulary.
pub fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 11 + 5) % 120 + 3)
        .collect()
}

/// Greedy decoding of exactly `max_tokens` tokens.
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Block size of the test engines, tokens.
pub const BLOCK_TOKENS: usize = 4;

/// An engine on the tiny model with `kv_blocks` blocks of 4 tokens.
pub fn engine(
    kv_blocks: usize,
    max_num_batched_tokens: usize,
    max_model_len_tokens: usize,
    compression: CompressionConfig,
) -> Engine<CpuBackend> {
    engine_with_admission(
        kv_blocks,
        max_num_batched_tokens,
        max_model_len_tokens,
        compression,
        AdmissionPolicy::Optimistic,
    )
}

/// An engine on `model` storing `kv_dtype`, whose budget holds `f32_blocks` blocks of the
/// model's f32 cache (so a one-byte dtype holds about four times as many): 8 sequences, 64
/// tokens a step, 256-token contexts, no prefix caching.
pub fn engine_in_dtype(
    model: LlamaModel<CpuBackend>,
    kv_dtype: KvCacheDtype,
    eviction: CompressionConfig,
    f32_blocks: usize,
) -> Engine<CpuBackend> {
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            max_model_len_tokens: 256,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes_per_block * f32_blocks as u64,
        kv_compression: KvCompression {
            eviction,
            kv_dtype,
            ..Default::default()
        },
        enable_prefix_caching: false,
        model_identity: None,
    };
    Engine::new(CpuBackend::new(), model, None, config).unwrap()
}

/// [`engine`] with the given admission policy.
pub fn engine_with_admission(
    kv_blocks: usize,
    max_num_batched_tokens: usize,
    max_model_len_tokens: usize,
    compression: CompressionConfig,
    admission: AdmissionPolicy,
) -> Engine<CpuBackend> {
    engine_with_prefix_caching(
        kv_blocks,
        max_num_batched_tokens,
        max_model_len_tokens,
        compression,
        admission,
        false,
    )
}

/// [`engine_with_admission`] with automatic prefix caching on or off.
pub fn engine_with_prefix_caching(
    kv_blocks: usize,
    max_num_batched_tokens: usize,
    max_model_len_tokens: usize,
    compression: CompressionConfig,
    admission: AdmissionPolicy,
    enable_prefix_caching: bool,
) -> Engine<CpuBackend> {
    let model = tiny_model();
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens,
            max_model_len_tokens,
            block_size_tokens: BLOCK_TOKENS,
            admission,
        },
        kv_cache_memory_bytes: bytes_per_block * kv_blocks as u64,
        kv_compression: KvCompression {
            eviction: compression,
            ..Default::default()
        },
        enable_prefix_caching,
        model_identity: None,
    };
    Engine::new(CpuBackend::new(), model, None, config).unwrap()
}

/// Total variation between two runs' next-token distributions, position by position (both
/// teacher-forced to the same tokens): `(mean, max, positions)`.
pub fn total_variation(
    a: &starling_engine::testing::TraceOutcome,
    b: &starling_engine::testing::TraceOutcome,
) -> (f64, f32, usize) {
    let (mut total, mut worst, mut rows) = (0.0f64, 0.0f32, 0usize);
    for (x, y) in a.requests.iter().zip(&b.requests) {
        assert_eq!(x.logprob_rows.len(), y.logprob_rows.len());
        for (u, v) in x.logprob_rows.iter().zip(&y.logprob_rows) {
            let tv = u
                .iter()
                .zip(v)
                .map(|(s, t)| (s.exp() - t.exp()).abs())
                .sum::<f32>()
                / 2.0;
            total += f64::from(tv);
            worst = worst.max(tv);
            rows += 1;
        }
    }
    (total / rows.max(1) as f64, worst, rows)
}

/// The seeded greedy trace the cache-dtype tests share: 6 requests of 20–120 prompt tokens and
/// 8–24 output tokens over a 128-token vocabulary.
pub fn dtype_trace() -> starling_engine::testing::Trace {
    starling_engine::testing::Trace::seeded_greedy(7, 6, 128, 20..120, 8..24, 3)
}

/// How far each of `dtypes` moves the tiny model's next-token distributions from the f32
/// cache's: every run teacher-forced to the f32 cache's greedy tokens on [`dtype_trace`], an
/// engine per run whose budget holds `f32_blocks` f32 blocks; `(mean, max, positions)` total
/// variation per dtype, in order.
pub fn total_variation_per_dtype(
    dtypes: &[KvCacheDtype],
    f32_blocks: usize,
) -> Vec<(f64, f32, usize)> {
    let tester = starling_engine::testing::EngineTester::default();
    let engine = |dtype| {
        engine_in_dtype(
            tiny_model(),
            dtype,
            CompressionConfig::default(),
            f32_blocks,
        )
    };
    let trace = dtype_trace();
    let reference = tester.run(&mut engine(KvCacheDtype::Auto), &trace).unwrap();
    let forced = trace.forced_to(&reference);
    let full = tester
        .run(&mut engine(KvCacheDtype::Auto), &forced)
        .unwrap();
    dtypes
        .iter()
        .map(|&dtype| total_variation(&full, &tester.run(&mut engine(dtype), &forced).unwrap()))
        .collect()
}

/// Runs [`dtype_trace`] under KeyDiff@0.5 on a cache of `dtype` (budget: `f32_blocks` f32
/// blocks) and checks that eviction composes with it: compactions ran on the stored keys and
/// gave blocks back, and the engine had `blocks_total` blocks.
pub fn assert_keydiff_composes(dtype: KvCacheDtype, f32_blocks: usize, blocks_total: usize) {
    let keydiff = CompressionConfig {
        method: starling_evict::CompressionMethod::KeyDiff,
        ratio: 0.5,
        ..Default::default()
    };
    let evicted = starling_engine::testing::EngineTester::default()
        .run(
            &mut engine_in_dtype(tiny_model(), dtype, keydiff, f32_blocks),
            &dtype_trace(),
        )
        .unwrap();
    assert!(
        evicted.compressions > 0 && evicted.evicted_blocks > 0,
        "{dtype:?}: {evicted:?}"
    );
    assert_eq!(evicted.blocks_total, blocks_total, "{dtype:?}");
}
