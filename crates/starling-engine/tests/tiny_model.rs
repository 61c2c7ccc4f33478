//! Engine behaviour on a tiny random-weight model: chunked prefill, batching and preemption must
//! not change what the model computes.

use std::collections::HashMap;

mod common;

use common::{greedy, prompt, tiny_model};
use starling_backend::cpu::CpuBackend;
use starling_backend::{BackendCore, BatchMeta};
use starling_engine::sampling::SamplingParams;
use starling_engine::Engine;
use starling_kv::{KvCacheManager, SeqId};
use starling_models::llama::{ForwardOptions, LlamaModel};

/// Runs `ids` through the model in chunks of the given sizes; returns the last chunk's logits
/// for its final token.
fn prefill_in_chunks(model: &LlamaModel<CpuBackend>, ids: &[u32], chunks: &[usize]) -> Vec<f32> {
    let backend = CpuBackend::new();
    let block_size = 4;
    let mut kv = KvCacheManager::new(64, block_size).unwrap();
    let mut caches = model.alloc_kv_caches(&backend, 64, block_size).unwrap();
    let seq = SeqId(0);
    let mut done = 0;
    let mut last = Vec::new();
    for &n in chunks {
        kv.allocate_slots(seq, n).unwrap();
        let meta = BatchMeta::single_sequence(
            done,
            n,
            kv.slot_mapping(seq, done..done + n).unwrap(),
            kv.table(seq)
                .unwrap()
                .block_ids()
                .iter()
                .map(|b| b.0)
                .collect(),
            block_size,
            vec![(n - 1) as u32],
        );
        let batch = backend.prepare_batch(&meta, 64).unwrap();
        last = model
            .forward(
                &backend,
                &ids[done..done + n],
                &meta,
                &batch,
                &mut caches,
                ForwardOptions::default(),
            )
            .and_then(|logits| logits.to_host(&backend))
            .unwrap()
            .into_data();
        done += n;
    }
    assert_eq!(done, ids.len());
    last
}

#[test]
fn chunked_prefill_equals_one_shot_prefill() {
    let model = tiny_model();
    let ids = prompt(1, 37);
    let one_shot = prefill_in_chunks(&model, &ids, &[37]);
    for chunks in [
        &[5usize, 16, 16][..],
        &[1; 37][..],
        &[36, 1][..],
        &[4, 4, 29][..],
    ] {
        let chunked = prefill_in_chunks(&model, &ids, chunks);
        // Relative to the logit scale: these test weights are scaled up to separate logits, so
        // values reach ~10 and 1e-5 absolute would ask for better than f32's 1.2e-7 · 2^4.
        let scale = one_shot.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let max_diff = one_shot
            .iter()
            .zip(&chunked)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_diff < 1e-5 * scale,
            "chunks {chunks:?}: max |Δlogit| = {max_diff}, logit scale {scale}"
        );
    }
}

fn engine(kv_blocks: usize, max_num_batched_tokens: usize) -> Engine<CpuBackend> {
    common::engine(kv_blocks, max_num_batched_tokens, 96, Default::default())
}

/// Runs every request to completion; returns each one's generated tokens and the engine.
fn run_all(
    engine: &mut Engine<CpuBackend>,
    requests: &[(Vec<u32>, SamplingParams)],
) -> Vec<Vec<u32>> {
    let ids: Vec<SeqId> = requests
        .iter()
        .map(|(p, s)| engine.add_request(p.clone(), s.clone()).unwrap())
        .collect();
    let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            out.entry(o.seq_id).or_default().extend(o.token_id);
        }
        steps += 1;
        assert!(steps < 10_000, "engine did not finish");
    }
    let stats = engine.stats();
    assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total, "blocks leaked");
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

#[test]
fn batched_requests_generate_what_they_generate_alone() {
    let requests: Vec<_> = (0..6)
        .map(|i| (prompt(i, 5 + 7 * i as usize), greedy(12)))
        .collect();
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| run_all(&mut engine(200, 64), std::slice::from_ref(r)).remove(0))
        .collect();
    let batched = run_all(&mut engine(200, 24), &requests);
    assert_eq!(alone, batched);
    assert!(alone.iter().all(|t| t.len() == 12));
}

#[test]
fn preempted_requests_finish_with_their_solo_greedy_output() {
    // 24 blocks of 4 tokens = 96 slots for 4 requests that need up to ~48 tokens each: the
    // scheduler must preempt (recompute) to make progress.
    let requests: Vec<_> = (0..4)
        .map(|i| (prompt(i + 10, 20 + 3 * i as usize), greedy(24)))
        .collect();
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| run_all(&mut engine(200, 64), std::slice::from_ref(r)).remove(0))
        .collect();
    let mut tight = engine(24, 64);
    let crowded = run_all(&mut tight, &requests);
    assert!(
        tight.stats().num_preemptions > 0,
        "the test must actually preempt"
    );
    assert_eq!(alone, crowded);
}

#[test]
fn seeded_sampling_is_reproducible_across_batches() {
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(1234),
        max_tokens: Some(10),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let req = (prompt(3, 9), params);
    let alone = run_all(&mut engine(200, 64), std::slice::from_ref(&req)).remove(0);
    let mut crowd: Vec<_> = (0..3).map(|i| (prompt(i + 20, 11), greedy(7))).collect();
    crowd.insert(1, req);
    let batched = run_all(&mut engine(200, 16), &crowd);
    assert_eq!(alone, batched[1]);
}

/// Enough sampling rows in one step that the engine splits them over its sampler pool (two
/// workers or more): every request still produces exactly its solo output, whatever its
/// sampling parameters, because rows keep their own RNGs and come back in row order.
#[test]
fn parallel_row_sampling_matches_solo_runs() {
    let requests: Vec<_> = (0..24u32)
        .map(|i| {
            let params = SamplingParams {
                temperature: 0.7 + 0.05 * (i % 5) as f32,
                top_p: if i % 3 == 0 { 0.9 } else { 1.0 },
                top_k: (i % 4 == 1).then_some(20),
                repetition_penalty: if i % 6 == 2 { 1.3 } else { 1.0 },
                logprobs: (i % 5 == 4).then_some(3),
                seed: Some(1000 + u64::from(i)),
                max_tokens: Some(6),
                ignore_eos: true,
                ..SamplingParams::default()
            };
            (prompt(i + 40, 5 + (i as usize % 7)), params)
        })
        .collect();
    let together = run_all(&mut engine(400, 256), &requests);
    for (i, req) in requests.iter().enumerate() {
        let alone = run_all(&mut engine(400, 256), std::slice::from_ref(req)).remove(0);
        assert_eq!(alone, together[i], "request {i}");
    }
}

#[test]
fn abort_frees_blocks_immediately() {
    let mut e = engine(64, 32);
    let a = e.add_request(prompt(1, 30), greedy(40)).unwrap();
    let _b = e.add_request(prompt(2, 10), greedy(3)).unwrap();
    e.step().unwrap();
    e.step().unwrap();
    let used = e.stats().kv_blocks_total - e.stats().kv_blocks_free;
    assert!(used > 0);
    e.abort(a).unwrap();
    assert!(e.stats().kv_blocks_total - e.stats().kv_blocks_free < used);
    while e.has_unfinished() {
        e.step().unwrap();
    }
    assert_eq!(e.stats().kv_blocks_free, e.stats().kv_blocks_total);
}

#[test]
fn over_long_prompt_and_bad_ids_are_refused_and_engine_keeps_serving() {
    let mut e = engine(64, 32);
    assert!(e.add_request(prompt(1, 96), greedy(4)).is_err());
    assert!(e.add_request(vec![5, 999], greedy(4)).is_err());
    assert!(e.add_request(vec![], greedy(4)).is_err());
    let bad = SamplingParams {
        temperature: -1.0,
        ..greedy(4)
    };
    assert!(e.add_request(prompt(1, 4), bad).is_err());
    let out = run_all(&mut e, &[(prompt(1, 4), greedy(4))]);
    assert_eq!(out[0].len(), 4);
}
