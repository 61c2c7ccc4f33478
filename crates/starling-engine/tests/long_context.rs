//! A long prompt (8.2k tokens: four 2048-token chunks, the later ones alone in their step, so
//! they sample nothing and the model skips its head) through the
//! engine, chunked and batched with short requests, gives the same first-token distribution as
//! one direct forward pass of the whole prompt.

mod common;

use common::{greedy, prompt, tiny_model, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_backend::{BackendCore, BatchMeta};
use starling_engine::RequestOptions;
use starling_kv::{KvCacheManager, SeqId};
use starling_models::llama::ForwardOptions;

#[test]
fn long_prompt_through_the_engine_equals_one_direct_forward() {
    let len = 8_200;
    let ids = prompt(4, len);
    let model = tiny_model();
    let backend = CpuBackend::new();
    let blocks = len.div_ceil(BLOCK_TOKENS);
    let mut kv = KvCacheManager::new(blocks, BLOCK_TOKENS).unwrap();
    kv.allocate_slots(SeqId(0), len).unwrap();
    let mut caches = model
        .alloc_kv_caches(&backend, blocks, BLOCK_TOKENS)
        .unwrap();
    let meta = BatchMeta::single_sequence(
        0,
        len,
        kv.slot_mapping(SeqId(0), 0..len).unwrap(),
        kv.table(SeqId(0))
            .unwrap()
            .block_ids()
            .iter()
            .map(|b| b.0)
            .collect(),
        BLOCK_TOKENS,
        vec![(len - 1) as u32],
    );
    let batch = backend.prepare_batch(&meta, blocks).unwrap();
    let direct = model
        .forward(
            &backend,
            &ids,
            &meta,
            &batch,
            &mut caches,
            ForwardOptions::default(),
        )
        .and_then(|logits| logits.to_host(&backend))
        .unwrap()
        .into_data();

    let mut engine = common::engine(8192 + 200, 2048, 32_768, Default::default());
    let long = engine
        .add_request_with(
            ids,
            greedy(1),
            RequestOptions {
                return_full_logprobs: true,
                ..RequestOptions::default()
            },
        )
        .unwrap();
    for i in 0..3 {
        engine.add_request(prompt(i, 50), greedy(8)).unwrap();
    }
    let mut row = None;
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            if o.seq_id == long {
                row = o.full_logprobs;
            }
        }
    }
    let row = row.expect("the long request produced a token");
    let max = direct.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_norm = max + direct.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    let worst = row
        .iter()
        .zip(&direct)
        .map(|(a, l)| (a - (l - log_norm)).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-3,
        "engine vs direct log-probabilities differ by {worst}"
    );
}
