//! Compression-aware preflight and admission (issue 17): with token eviction the boot check and
//! admission count what a sequence really holds at its peak — its kept tokens plus one chunk in
//! flight — so a context that fits only compressed boots and serves, the peak each policy
//! declares is exactly where the boot check draws its line, and a request whose own policy would
//! not fit is refused instead of queued forever.

mod common;

use common::{greedy, prompt, tiny_model, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_engine::engine::eviction_peak_tokens;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::testing::{EngineTester, Trace, TraceRequest};
use starling_engine::{Engine, EngineConfig, EngineError, RequestOptions};
use starling_evict::{CompressionConfig, CompressionMethod, KvCompression};

const MAX_LEN_TOKENS: usize = 256;
const CHUNK_TOKENS: usize = 16;

fn policy(method: CompressionMethod, ratio: f64) -> CompressionConfig {
    CompressionConfig {
        method,
        ratio,
        ..CompressionConfig::default()
    }
}

fn boot(blocks: usize, compression: CompressionConfig) -> Result<Engine<CpuBackend>, EngineError> {
    let model = tiny_model();
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: CHUNK_TOKENS,
            max_model_len_tokens: MAX_LEN_TOKENS,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::ReservePeak,
        },
        kv_cache_memory_bytes: bytes_per_block * blocks as u64,
        kv_compression: KvCompression {
            eviction: compression,
            ..Default::default()
        },
        enable_prefix_caching: false,
        model_identity: None,
    };
    Engine::new(CpuBackend::new(), model, None, config)
}

/// Every evicting policy declares a peak below the full length, smaller for higher ratios, and
/// the boot check draws its line exactly there: the blocks of the peak boot a `max_model_len`
/// context, one block fewer refuses it.
#[test]
fn preflight_boots_exactly_at_each_policys_peak() {
    let dense_blocks = MAX_LEN_TOKENS.div_ceil(BLOCK_TOKENS);
    assert!(boot(dense_blocks, CompressionConfig::default()).is_ok());
    assert!(boot(dense_blocks - 1, CompressionConfig::default()).is_err());
    for method in [
        CompressionMethod::KeyDiff,
        CompressionMethod::KNorm,
        CompressionMethod::SnapKv,
        CompressionMethod::StreamingLlm,
    ] {
        let mut previous = MAX_LEN_TOKENS;
        for ratio in [0.5, 0.75, 0.9] {
            let p = policy(method, ratio);
            let peak = eviction_peak_tokens(&p, MAX_LEN_TOKENS, CHUNK_TOKENS);
            let kept = (MAX_LEN_TOKENS as f64 * (1.0 - ratio)).floor() as usize;
            println!("{method:?}@{ratio}: peak {peak} tokens (kept {kept})");
            assert!(peak < previous, "{method:?}@{ratio}: {peak} >= {previous}");
            assert!(
                peak > kept,
                "{method:?}@{ratio}: a peak of {peak} holds less than the kept {kept} + 1"
            );
            previous = peak;
            let blocks = peak.div_ceil(BLOCK_TOKENS);
            assert!(
                boot(blocks, p.clone()).is_ok(),
                "{method:?}@{ratio}: {blocks} blocks"
            );
            let refused = boot(blocks - 1, p.clone()).err().map(|e| e.to_string());
            assert!(
                refused.as_deref().is_some_and(|e| e.contains("available")),
                "{method:?}@{ratio}: {} blocks: {refused:?}",
                blocks - 1
            );
        }
    }
}

/// At a budget the dense preflight refuses, KeyDiff at 0.75 boots and serves requests of the
/// full length to completion, each holding no more than its declared peak; a request that asks
/// for no eviction (its own policy) in that engine is refused with a clear error.
#[test]
fn eviction_serves_a_context_the_dense_cache_cannot_boot() {
    let p = policy(CompressionMethod::KeyDiff, 0.75);
    let peak = eviction_peak_tokens(&p, MAX_LEN_TOKENS, CHUNK_TOKENS);
    // Room for one peak (171 tokens: 64 kept, what grows between compactions and a chunk),
    // two thirds of one dense sequence: the requests take turns.
    let blocks = peak.div_ceil(BLOCK_TOKENS);
    assert!(blocks * BLOCK_TOKENS < MAX_LEN_TOKENS);
    let dense = boot(blocks, CompressionConfig::default())
        .err()
        .expect("the dense cache must refuse");
    assert!(dense.to_string().contains("available"), "{dense}");
    let mut engine = boot(blocks, p).expect("eviction at 0.75 boots");

    let output_tokens = 24;
    let trace = Trace {
        requests: (0..3)
            .map(|i| TraceRequest {
                arrival_step: i,
                prompt_ids: prompt(i as u32, MAX_LEN_TOKENS - output_tokens),
                params: greedy(output_tokens),
                options: RequestOptions::default(),
            })
            .collect(),
    };
    let outcome = EngineTester::default()
        .run(&mut engine, &trace)
        .expect("the trace runs");
    for (i, r) in outcome.requests.iter().enumerate() {
        assert_eq!(r.finish_reason, "length", "request {i}");
        assert_eq!(r.token_ids.len(), output_tokens, "request {i}");
        assert!(
            r.max_physical_tokens <= peak,
            "request {i} held {} slots, its declared peak is {peak}",
            r.max_physical_tokens
        );
    }
    assert!(outcome.evicted_blocks > 0);

    let uncompressed = RequestOptions {
        compression: Some(CompressionConfig::default()),
        ..RequestOptions::default()
    };
    let refused = engine
        .add_request_with(
            prompt(9, MAX_LEN_TOKENS - output_tokens),
            greedy(output_tokens),
            uncompressed,
        )
        .expect_err("a request that cannot fit uncompressed is refused");
    assert!(matches!(refused, EngineError::Scheduler(_)), "{refused:?}");
    println!("refused: {refused}");
    assert!(!engine.has_unfinished());
}
