//! Per-request failures inside a step (issue 23): a request whose logits are NaN ends with an
//! error output and frees its blocks in that same step, and the requests batched with it carry on
//! exactly as if it had never been there.

use std::collections::HashMap;

mod common;

use common::{greedy, prompt, tiny_weights, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_engine::sampling::FinishReason;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig, FailureKind, RequestOutput};
use starling_kv::SeqId;
use starling_models::llama::LlamaModel;
use starling_models::ModelConfig;

/// The token whose embedding row is NaN in the poisoned model.
const POISON_TOKEN: u32 = 7;

/// The tiny model, with the embedding row of [`POISON_TOKEN`] set to NaN when `poisoned`: every
/// logit of a sequence that has seen that token is NaN, other sequences are untouched (the LM
/// head is not tied to the embedding).
fn engine(poisoned: bool) -> Engine<CpuBackend> {
    engine_with(poisoned, 16, 200, 96)
}

/// [`engine`] running at most `max_num_seqs` requests at once in `kv_blocks` blocks.
fn engine_with(
    poisoned: bool,
    max_num_seqs: usize,
    kv_blocks: u64,
    max_model_len_tokens: usize,
) -> Engine<CpuBackend> {
    let cfg = ModelConfig::tiny_llama_for_tests();
    let mut weights = tiny_weights(&cfg, 11).into_inner();
    if poisoned {
        let embedding = weights
            .get_mut("model.embed_tokens.weight")
            .expect("embedding");
        let d = cfg.hidden_size;
        let row = POISON_TOKEN as usize * d;
        embedding.data_mut()[row..row + d].fill(f32::NAN);
    }
    let model = LlamaModel::load(&CpuBackend::new(), &cfg, weights.into_iter().collect()).unwrap();
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 64,
            max_model_len_tokens,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes_per_block * kv_blocks,
        kv_compression: Default::default(),
        enable_prefix_caching: false,
        model_identity: None,
    };
    Engine::new(CpuBackend::new(), model, None, config).unwrap()
}

/// A prompt of the usual test ids that never contains [`POISON_TOKEN`].
fn clean_prompt(seed: u32, len: usize) -> Vec<u32> {
    prompt(seed, len)
        .into_iter()
        .map(|t| if t == POISON_TOKEN { t + 1 } else { t })
        .collect()
}

/// Steps until nothing is left; every step must succeed. Returns each request's outputs.
fn run(engine: &mut Engine<CpuBackend>) -> HashMap<SeqId, Vec<RequestOutput>> {
    let mut outputs: HashMap<SeqId, Vec<RequestOutput>> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        let step = engine
            .step()
            .expect("a per-request failure must not fail the step");
        for output in step {
            outputs.entry(output.seq_id).or_default().push(output);
        }
        steps += 1;
        assert!(steps < 1_000, "the engine did not finish");
    }
    let stats = engine.stats();
    assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total, "blocks leaked");
    outputs
}

fn tokens(outputs: &[RequestOutput]) -> Vec<u32> {
    outputs.iter().filter_map(|o| o.token_id).collect()
}

#[test]
fn a_nan_request_fails_alone_and_the_batch_carries_on() {
    let clean: Vec<Vec<u32>> = (0..3)
        .map(|i| clean_prompt(i, 9 + 5 * i as usize))
        .collect();
    let mut alone = Vec::new();
    for p in &clean {
        let mut e = engine(true);
        let id = e.add_request(p.clone(), greedy(10)).unwrap();
        alone.push(tokens(&run(&mut e)[&id]));
    }
    assert!(alone.iter().all(|t| t.len() == 10));

    let mut e = engine(true);
    let mut poisoned_prompt = clean_prompt(9, 12);
    poisoned_prompt[5] = POISON_TOKEN;
    let first = e.add_request(clean[0].clone(), greedy(10)).unwrap();
    let bad = e.add_request(poisoned_prompt, greedy(10)).unwrap();
    let rest: Vec<SeqId> = clean[1..]
        .iter()
        .map(|p| e.add_request(p.clone(), greedy(10)).unwrap())
        .collect();
    let outputs = run(&mut e);

    let bad_outputs = &outputs[&bad];
    assert_eq!(
        bad_outputs.len(),
        1,
        "one output, the failure: {bad_outputs:?}"
    );
    let failure = &bad_outputs[0];
    assert_eq!(failure.token_id, None);
    assert_eq!(
        failure.finished.as_ref().map(|f| f.reason),
        Some(FinishReason::Error)
    );
    let error = failure.error.as_ref().expect("the failure says why");
    assert_eq!(error.kind, FailureKind::NonFiniteLogits);
    assert!(error.message.contains("NaN"), "{}", error.message);
    for (id, want) in std::iter::once(first).chain(rest).zip(&alone) {
        assert_eq!(
            &tokens(&outputs[&id]),
            want,
            "{id:?} changed by the failure"
        );
        assert!(outputs[&id].iter().all(|o| o.error.is_none()));
    }
}

#[test]
fn a_failed_request_frees_its_blocks_in_the_step_that_failed() {
    let mut e = engine(true);
    let mut p = clean_prompt(3, 20);
    p[0] = POISON_TOKEN;
    let id = e.add_request(p, greedy(4)).unwrap();
    let outputs = e.step().expect("the step itself succeeds");
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].seq_id, id);
    assert!(outputs[0].error.is_some());
    assert!(!e.has_unfinished());
    let stats = e.stats();
    assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total);
    assert_eq!(stats.counters.failed_requests, 1);
}

#[test]
fn a_model_that_is_nan_everywhere_fails_every_request_without_hanging() {
    let cfg = ModelConfig::tiny_llama_for_tests();
    let mut weights = tiny_weights(&cfg, 11).into_inner();
    weights
        .get_mut("model.norm.weight")
        .expect("final norm")
        .data_mut()
        .fill(f32::NAN);
    let model = LlamaModel::load(&CpuBackend::new(), &cfg, weights.into_iter().collect()).unwrap();
    let bytes_per_block =
        Engine::cache_layout_of(&CpuBackend::new(), &model).bytes_per_block(BLOCK_TOKENS);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 64,
            max_model_len_tokens: 96,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes_per_block * 64,
        kv_compression: Default::default(),
        enable_prefix_caching: false,
        model_identity: None,
    };
    let mut e = Engine::new(CpuBackend::new(), model, None, config).unwrap();
    let ids: Vec<SeqId> = (0..5)
        .map(|i| e.add_request(clean_prompt(i, 6), greedy(3)).unwrap())
        .collect();
    let outputs = run(&mut e);
    for id in ids {
        let error = outputs[&id][0].error.as_ref().expect("failed");
        assert_eq!(
            error.kind,
            FailureKind::NonFiniteLogits,
            "{}",
            error.message
        );
    }
    assert_eq!(e.stats().counters.failed_requests, 5);
}

/// The NaN K/V a failed request leaves in its freed blocks never reach the request that gets
/// them next: the same schedule with a request that simply finishes in place of the failing one
/// gives bit-identical tokens to everyone else, including a request admitted into its blocks.
#[test]
fn a_failed_requests_blocks_carry_nothing_to_their_next_owner() {
    let schedule = |poisoned: bool| {
        // Three clean requests and the one that fails (or, unpoisoned, ends after one token)
        // fill the 4 slots and all 13 blocks (2 + 3 + 4 + 4); the fifth waits for the freed
        // slot and gets 3 of the 4 freed blocks, the only free ones.
        let mut e = engine_with(poisoned, 4, 13, 48);
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                e.add_request(clean_prompt(i, 7 + 3 * i as usize), greedy(8))
                    .unwrap(),
            );
        }
        let mut doomed = clean_prompt(7, 13);
        doomed[2] = POISON_TOKEN;
        let doomed_id = e.add_request(doomed, greedy(1)).unwrap();
        ids.push(e.add_request(clean_prompt(8, 10), greedy(8)).unwrap());
        let outputs = run(&mut e);
        let doomed_failed = outputs[&doomed_id].iter().any(|o| o.error.is_some());
        assert_eq!(doomed_failed, poisoned);
        ids.iter()
            .map(|id| tokens(&outputs[id]))
            .collect::<Vec<_>>()
    };
    let with_failure = schedule(true);
    assert!(
        with_failure.iter().all(|t| t.len() == 8),
        "{with_failure:?}"
    );
    assert_eq!(with_failure, schedule(false));
}
