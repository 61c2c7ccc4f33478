//! The boot-time warm-up (`Engine::warm_up`) on the tiny CPU model: it runs a full step's
//! prompt and a decode step, then leaves nothing a user could see — counters zeroed, no block
//! held or cached — and the engine answers a trace exactly as a fresh one does.

mod common;

use common::{engine_with_prefix_caching, greedy, prompt};
use starling_backend::cpu::CpuBackend;
use starling_engine::scheduler::AdmissionPolicy;
use starling_engine::testing::{first_divergence, EngineTester, Trace, TraceRequest};
use starling_engine::{Engine, EngineCounters, RequestOptions};
use starling_evict::{CompressionConfig, CompressionMethod};

const KV_BLOCKS: usize = 64;
const BATCHED_TOKENS: usize = 48;

fn engine(compression: CompressionConfig) -> Engine<CpuBackend> {
    engine_with_prefix_caching(
        KV_BLOCKS,
        BATCHED_TOKENS,
        200,
        compression,
        AdmissionPolicy::Optimistic,
        true,
    )
}

/// Requests sharing a prefix (prefix-cache hits), some longer than one step (chunked).
fn trace() -> Trace {
    let shared = prompt(1, 40);
    let requests = (0..4u32)
        .map(|i| {
            let mut ids = shared.clone();
            ids.extend(prompt(10 + i, 20 + 15 * i as usize));
            TraceRequest {
                arrival_step: i as usize,
                prompt_ids: ids,
                params: greedy(6),
                options: RequestOptions::default(),
            }
        })
        .collect();
    Trace { requests }
}

fn assert_untouched(engine: &Engine<CpuBackend>) {
    let stats = engine.stats();
    assert_eq!(stats.counters, EngineCounters::default());
    assert_eq!(stats.num_preemptions, 0);
    assert_eq!((stats.num_running, stats.num_waiting), (0, 0));
    assert_eq!(
        stats.kv_blocks_free, stats.kv_blocks_total,
        "a block is still held"
    );
    assert_eq!(stats.prefix_cache.queries_tokens, 0);
    assert_eq!(stats.prefix_cache.hits_tokens, 0);
    assert_eq!(
        stats.prefix_cache.cached_blocks, 0,
        "the warm-up's blocks were cached"
    );
    assert!(stats.last_step.is_none());
}

fn warms_up_without_a_trace(compression: CompressionConfig) {
    let mut warmed = engine(compression.clone());
    let report = warmed.warm_up(10_000).unwrap();
    assert_eq!(
        report.prompt_tokens, BATCHED_TOKENS,
        "clamped to one step's budget"
    );
    assert!(
        report.steps >= 2,
        "a prefill step and a decode step: {report:?}"
    );
    assert_untouched(&warmed);
    warmed.check_invariants().unwrap();

    let fresh_run = EngineTester::default()
        .run(&mut engine(compression), &trace())
        .unwrap();
    let warmed_run = EngineTester::default().run(&mut warmed, &trace()).unwrap();
    assert_eq!(first_divergence(&warmed_run, &fresh_run), None);
    assert_eq!(warmed_run.steps, fresh_run.steps);
    assert_eq!(warmed_run.preemptions, fresh_run.preemptions);
}

#[test]
fn a_warmed_up_engine_answers_as_a_fresh_one_and_shows_no_trace() {
    warms_up_without_a_trace(CompressionConfig::default());
}

#[test]
fn the_warm_up_composes_with_engine_wide_eviction() {
    warms_up_without_a_trace(CompressionConfig {
        method: CompressionMethod::KeyDiff,
        ratio: 0.5,
        ..CompressionConfig::default()
    });
}

#[test]
fn a_host_backend_warms_up_nothing_by_default() {
    assert_eq!(
        engine(CompressionConfig::default()).default_warm_up_tokens(),
        0
    );
}

#[test]
fn the_warm_up_refuses_a_busy_engine_and_leaves_its_request_alone() {
    let mut engine = engine(CompressionConfig::default());
    let id = engine.add_request(prompt(3, 30), greedy(4)).unwrap();
    assert!(engine.warm_up(32).is_err());
    let mut tokens = 0;
    while engine.has_unfinished() {
        tokens += engine
            .step()
            .unwrap()
            .iter()
            .filter(|o| o.seq_id == id && o.token_id.is_some())
            .count();
    }
    assert_eq!(tokens, 4);
}
