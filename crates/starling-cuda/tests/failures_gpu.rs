//! Per-request failures on the GPU (issue 23): NaN logits detected by the device sampling kernel
//! (and by the host sampler for rows it samples) end only their request; its freed blocks, full
//! of NaN K/V, carry nothing to the request admitted into them, whether its decode steps run
//! eagerly or are replayed from CUDA graphs. `#[ignore]`d in CPU CI; run through
//! scripts/device/gpu_tests.sh.
//!
//! Each case runs one schedule twice: once with a request whose prompt holds a token with a NaN
//! embedding row (it fails in its first sampling step), once on the clean model with that request
//! ending after one token instead. Both runs have the same batch shapes at every step, so every
//! other request's greedy tokens must be bit-identical between them.

use std::collections::HashMap;

use starling_cuda::CudaBackend;
use starling_engine::sampling::SamplingParams;
use starling_engine::scheduler::{AdmissionPolicy, SchedulerConfig};
use starling_engine::{Engine, EngineConfig, FailureKind, RequestOutput};
use starling_kv::SeqId;
use starling_models::llama::LlamaModel;
use starling_models::{synthetic_weights, ModelConfig, WeightMap};

const BLOCK_TOKENS: usize = 16;
/// Its embedding row is NaN in the poisoned model.
const POISON_TOKEN: u32 = 7;

/// The tiny test model with GPU-sized heads, weights scaled up so logits are well separated.
fn weights(cfg: &ModelConfig, poisoned: bool) -> WeightMap {
    let mut tensors = synthetic_weights(cfg, 11).into_inner();
    for (name, t) in tensors.iter_mut() {
        if !name.ends_with("norm.weight") {
            t.data_mut().iter_mut().for_each(|v| *v *= 15.0);
        }
    }
    if poisoned {
        let d = cfg.hidden_size;
        let row = POISON_TOKEN as usize * d;
        tensors
            .get_mut("model.embed_tokens.weight")
            .expect("embedding")
            .data_mut()[row..row + d]
            .fill(f32::NAN);
    }
    tensors.into_iter().collect()
}

/// Prompt ids in the tiny vocabulary, never [`POISON_TOKEN`].
fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 11 + 5) % 120 + 8)
        .collect()
}

/// How the schedule's requests are sampled and stepped.
#[derive(Clone, Copy, Debug)]
struct Case {
    /// A repetition penalty sends every row to the host sampler.
    host_sampling: bool,
    /// Replay decode-only steps from CUDA graphs.
    graphs: bool,
}

/// Three clean requests and the doomed one fill 4 slots and all the blocks they need; a fifth
/// waits for the doomed one's slot and gets its freed blocks. Returns the other requests'
/// tokens, and whether the doomed request failed on non-finite logits.
fn schedule(case: Case, poisoned: bool) -> (Vec<Vec<u32>>, bool) {
    let cfg = ModelConfig {
        sliding_window: None,
        attention_scale: None,
        head_dim: 64,
        ..ModelConfig::tiny_llama_for_tests()
    };
    let gpu = CudaBackend::new(0).expect("these tests need a CUDA GPU");
    let model = LlamaModel::load(&gpu, &cfg, weights(&cfg, poisoned)).expect("model");
    let bytes_per_block = Engine::cache_layout_of(&gpu, &model).bytes_per_block(BLOCK_TOKENS);
    // Prompts of 20, 30, 40 and 40 tokens take 2 + 2 + 3 + 3 blocks.
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 256,
            max_model_len_tokens: 160,
            block_size_tokens: BLOCK_TOKENS,
            admission: AdmissionPolicy::Optimistic,
        },
        kv_cache_memory_bytes: bytes_per_block * 10,
        kv_compression: Default::default(),
        enable_prefix_caching: false,
        model_identity: None,
    };
    let mut engine = Engine::new(gpu, model, None, config).expect("engine");
    if case.graphs {
        assert!(engine.enable_decode_graphs().expect("graphs"));
    }
    let params = |max_tokens| SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        repetition_penalty: if case.host_sampling { 1.1 } else { 1.0 },
        ..SamplingParams::default()
    };
    let mut ids: Vec<SeqId> = (0..3)
        .map(|i| {
            engine
                .add_request(prompt(i, 20 + 10 * i as usize), params(24))
                .expect("add")
        })
        .collect();
    let mut doomed = prompt(7, 40);
    doomed[3] = POISON_TOKEN;
    let doomed_id = engine.add_request(doomed, params(1)).expect("add");
    ids.push(engine.add_request(prompt(8, 30), params(24)).expect("add"));
    let mut outputs: HashMap<SeqId, Vec<RequestOutput>> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        for output in engine.step().expect("no step fails as a whole") {
            outputs.entry(output.seq_id).or_default().push(output);
        }
        steps += 1;
        assert!(steps < 1_000, "the engine did not finish");
    }
    let stats = engine.stats();
    assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total, "blocks leaked");
    let failed_on_nan = outputs[&doomed_id]
        .iter()
        .filter_map(|o| o.error.as_ref())
        .any(|e| e.kind == FailureKind::NonFiniteLogits);
    let tokens = ids
        .iter()
        .map(|id| outputs[id].iter().filter_map(|o| o.token_id).collect())
        .collect();
    (tokens, failed_on_nan)
}

fn check(case: Case) {
    let (with_failure, failed) = schedule(case, true);
    assert!(
        failed,
        "{case:?}: the poisoned request must fail on NaN logits"
    );
    assert!(
        with_failure.iter().all(|t| t.len() == 24),
        "{case:?}: {with_failure:?}"
    );
    let (clean, clean_failed) = schedule(case, false);
    assert!(!clean_failed);
    assert_eq!(
        with_failure, clean,
        "{case:?}: a failed request changed its neighbours"
    );
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn nan_logits_found_by_the_device_sampler_fail_one_request() {
    check(Case {
        host_sampling: false,
        graphs: false,
    });
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn nan_logits_found_by_the_host_sampler_fail_one_request() {
    check(Case {
        host_sampling: true,
        graphs: false,
    });
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn nan_blocks_reused_under_graph_replay_carry_nothing() {
    check(Case {
        host_sampling: false,
        graphs: true,
    });
}
