//! Token eviction inside the engine, on the tiny CPU model: ratio 0 changes nothing, compression
//! frees blocks during chunked prefill and decoding, holds the ratio, survives preemption, lets
//! more long requests run at once, and per-request policies override the engine's.

mod common;

use std::collections::HashMap;

use common::{engine, engine_with_admission, greedy, prompt, BLOCK_TOKENS};
use starling_backend::cpu::CpuBackend;
use starling_engine::scheduler::AdmissionPolicy;
use starling_engine::{Engine, RequestOptions, RequestOutput};
use starling_evict::{CompressionConfig, CompressionMethod};
use starling_kv::SeqId;

fn config(method: CompressionMethod, ratio: f64, every_n_tokens: usize) -> CompressionConfig {
    CompressionConfig {
        method,
        ratio,
        sink_tokens: 2,
        window_tokens: 4,
        every_n_tokens,
        seed: 7,
        head_wise: true,
    }
}

fn with_compression(c: CompressionConfig) -> RequestOptions {
    RequestOptions {
        compression: Some(c),
        ..RequestOptions::default()
    }
}

/// Runs the requests to completion, checking after every step that each request's physical
/// length stays within `target + slack` (when given); returns per-request outputs.
fn run(
    engine: &mut Engine<CpuBackend>,
    requests: Vec<(Vec<u32>, RequestOptions)>,
    max_tokens: usize,
) -> Vec<Vec<RequestOutput>> {
    let ids: Vec<SeqId> = requests
        .into_iter()
        .map(|(p, o)| engine.add_request_with(p, greedy(max_tokens), o).unwrap())
        .collect();
    let mut out: HashMap<SeqId, Vec<RequestOutput>> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            assert!(
                o.finished.as_ref().map(|f| f.reason.as_str()) != Some("abort"),
                "request aborted: {o:?}"
            );
            out.entry(o.seq_id).or_default().push(o);
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

fn tokens(outputs: &[RequestOutput]) -> Vec<u32> {
    outputs.iter().filter_map(|o| o.token_id).collect()
}

#[test]
fn ratio_zero_is_bit_identical_to_no_compression() {
    let requests = |options: RequestOptions| {
        (0..3)
            .map(|i| {
                (
                    prompt(i, 40 + 9 * i as usize),
                    RequestOptions {
                        return_full_logprobs: true,
                        ..options.clone()
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    let plain = run(
        &mut engine(400, 16, 256, Default::default()),
        requests(RequestOptions::default()),
        20,
    );
    let zero = run(
        &mut engine(400, 16, 256, Default::default()),
        requests(with_compression(config(CompressionMethod::KeyDiff, 0.0, 1))),
        20,
    );
    assert_eq!(
        plain, zero,
        "outputs, logprobs and KV lengths must match exactly"
    );
}

#[test]
fn chunked_prefill_compresses_as_blocks_fill_and_decoding_holds_the_ratio() {
    let c = config(CompressionMethod::KeyDiff, 0.5, 8);
    let mut e = engine(400, 16, 256, Default::default());
    let seq = e
        .add_request_with(prompt(3, 150), greedy(60), with_compression(c.clone()))
        .unwrap();
    let mut prefill_peak_blocks = 0;
    let mut outputs = Vec::new();
    let mut logical = 0;
    while e.has_unfinished() {
        let out = e.step().unwrap();
        let stats = e.stats();
        let used_blocks = stats.kv_blocks_total - stats.kv_blocks_free;
        let step = stats.last_step.unwrap();
        logical += step.num_prefill_tokens + step.num_decode_tokens;
        // Held blocks stay within the target plus the compression slack, at every step.
        let bound_tokens = c.keep_tokens(logical) + c.every_n_tokens - 1;
        assert!(
            used_blocks <= bound_tokens.div_ceil(BLOCK_TOKENS),
            "after {logical} tokens: {used_blocks} blocks"
        );
        if outputs.is_empty() {
            prefill_peak_blocks = prefill_peak_blocks.max(used_blocks);
        }
        for o in out {
            assert_eq!(o.seq_id, seq);
            if o.finished.is_none() {
                // Physical length never exceeds the target by every_n_tokens or more.
                let target = c.keep_tokens(logical);
                assert!(
                    o.kv_physical_tokens < target + c.every_n_tokens,
                    "after {logical} tokens: {} physical, target {target}",
                    o.kv_physical_tokens
                );
                assert!(o.kv_physical_tokens >= target);
            }
            outputs.push(o);
        }
    }
    // The first output comes right after the prompt's last chunk: exactly at the target.
    assert_eq!(outputs[0].kv_physical_tokens, c.keep_tokens(150));
    // During prefill (16-token chunks) the cache never held the whole 150-token prompt.
    assert!(
        prefill_peak_blocks <= (c.keep_tokens(150) + c.every_n_tokens).div_ceil(BLOCK_TOKENS),
        "prefill peak {prefill_peak_blocks} blocks"
    );
    assert_eq!(tokens(&outputs).len(), 60);
    let counters = e.stats().counters;
    assert!(counters.compressions >= 10, "{counters:?}");
    assert!(counters.evicted_blocks > 0 && counters.evicted_tokens > 0);
}

#[test]
fn every_method_runs_through_the_engine_and_frees_blocks() {
    for method in [
        CompressionMethod::KeyDiff,
        CompressionMethod::KNorm,
        CompressionMethod::StreamingLlm,
        CompressionMethod::Random,
        CompressionMethod::SnapKv,
        CompressionMethod::Tova,
    ] {
        let c = config(method, 0.75, 8);
        let mut e = engine(400, 32, 256, Default::default());
        let outs = run(
            &mut e,
            vec![
                (prompt(5, 120), with_compression(c.clone())),
                (prompt(6, 90), with_compression(c.clone())),
            ],
            10,
        );
        for (o, n) in outs.iter().zip([120, 90]) {
            assert_eq!(o[0].kv_physical_tokens, c.keep_tokens(n), "{method}");
            assert_eq!(tokens(o).len(), 10, "{method}");
        }
        assert!(e.stats().counters.evicted_blocks > 0, "{method}");
    }
}

#[test]
fn streaming_llm_at_full_ratio_keeps_only_sinks_and_window() {
    // Ratio 0.999 of 100 unprotected tokens evicts floor(99.9) = 99 of them.
    let c = config(CompressionMethod::StreamingLlm, 0.999, 1);
    let mut e = engine(400, 128, 256, Default::default());
    let outs = run(&mut e, vec![(prompt(2, 106), with_compression(c))], 3);
    assert_eq!(outs[0][0].kv_physical_tokens, 2 + 4 + 1);
}

#[test]
fn the_engine_policy_applies_unless_a_request_overrides_it() {
    let server_wide = config(CompressionMethod::KeyDiff, 0.5, 8);
    let mut e = engine(400, 32, 256, server_wide.clone());
    let outs = run(
        &mut e,
        vec![
            (prompt(1, 100), RequestOptions::default()),
            (
                prompt(1, 100),
                with_compression(CompressionConfig::default()),
            ),
            (
                prompt(1, 100),
                with_compression(config(CompressionMethod::KNorm, 0.25, 8)),
            ),
        ],
        4,
    );
    assert_eq!(outs[0][0].kv_physical_tokens, server_wide.keep_tokens(100));
    assert_eq!(outs[1][0].kv_physical_tokens, 100);
    assert_eq!(
        outs[2][0].kv_physical_tokens,
        config(CompressionMethod::KNorm, 0.25, 8).keep_tokens(100)
    );
}

#[test]
fn invalid_compression_is_refused_at_admission() {
    let mut e = engine(100, 32, 256, Default::default());
    let bad = CompressionConfig {
        method: CompressionMethod::KeyDiff,
        ratio: 1.5,
        ..CompressionConfig::default()
    };
    assert!(e
        .add_request_with(prompt(1, 10), greedy(2), with_compression(bad))
        .is_err());
    assert!(!e.has_unfinished());
}

#[test]
fn eviction_under_preemption_finishes_everything_and_admits_more() {
    // 60 blocks = 240 slots; six 100-token prompts generating 40 tokens each need 840 slots
    // uncompressed, about 500 at ratio 0.5.
    let requests = |options: RequestOptions| {
        (0..6)
            .map(|i| (prompt(20 + i, 100), options.clone()))
            .collect::<Vec<_>>()
    };
    let max_running = |compression: Option<CompressionConfig>| {
        let mut e = engine(60, 64, 160, Default::default());
        let ids: Vec<SeqId> = requests(RequestOptions {
            compression,
            ..RequestOptions::default()
        })
        .into_iter()
        .map(|(p, o)| e.add_request_with(p, greedy(40), o).unwrap())
        .collect();
        let mut most = 0;
        let mut produced: HashMap<SeqId, usize> = HashMap::new();
        while e.has_unfinished() {
            for o in e.step().unwrap() {
                assert_ne!(o.finished.map(|f| f.reason.as_str()), Some("abort"));
                *produced.entry(o.seq_id).or_default() += usize::from(o.token_id.is_some());
            }
            most = most.max(e.stats().num_running);
        }
        let stats = e.stats();
        assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total);
        assert!(ids.iter().all(|id| produced.get(id) == Some(&40)));
        (most, stats.num_preemptions)
    };
    let (plain_running, plain_preemptions) = max_running(None);
    let (evict_running, _) = max_running(Some(config(CompressionMethod::KeyDiff, 0.5, 8)));
    assert!(plain_preemptions > 0, "the uncompressed run must preempt");
    assert!(
        evict_running > plain_running,
        "eviction should let more requests run at once: {evict_running} vs {plain_running}"
    );
    // And compressed requests themselves survive preemption (recompute, then compress again).
    let mut tight = engine(40, 64, 160, Default::default());
    let outs = run(
        &mut tight,
        requests(with_compression(config(CompressionMethod::KeyDiff, 0.5, 8))),
        40,
    );
    assert!(tight.stats().num_preemptions > 0, "must preempt");
    assert!(outs.iter().all(|o| tokens(o).len() == 40));
}

#[test]
fn reserve_peak_admission_stops_compressed_requests_preempting_each_other() {
    // The tight cache above: six compressed requests preempt each other under optimistic
    // admission. Reserving each one's projected peak (keep(140) + 8 slack ≈ 80 slots of the
    // 160) runs them two at a time without a single preemption, and all finish.
    let compressed = || with_compression(config(CompressionMethod::KeyDiff, 0.5, 8));
    let requests = || {
        (0..6)
            .map(|i| (prompt(20 + i, 100), compressed()))
            .collect::<Vec<_>>()
    };
    let mut optimistic = engine(40, 64, 160, Default::default());
    run(&mut optimistic, requests(), 40);
    assert!(
        optimistic.stats().num_preemptions > 0,
        "the workload must collide"
    );
    let mut reserving = engine_with_admission(
        40,
        64,
        160,
        Default::default(),
        AdmissionPolicy::ReservePeak,
    );
    let outs = run(&mut reserving, requests(), 40);
    assert_eq!(reserving.stats().num_preemptions, 0);
    assert!(outs.iter().all(|o| tokens(o).len() == 40));
}

#[test]
fn a_preempted_compressed_request_waits_for_room_instead_of_thrashing() {
    // Two compressed prompts that do not fit together at their peak (session 30's H100 campaign
    // scaled down: 0.75 GiB of KV held 28k tokens, two 24k KeyDiff@0.5 prompts, 8k-token
    // chunks). Under vLLM's optimistic rule the second is admitted while the first decodes,
    // grows into it at its last chunk and is preempted; readmitted as soon as its first chunk
    // fitted, it collided at the same point again and again (7 preemptions here, 10 on the
    // GPU). Readmitted only when the free blocks cover its own peak, it is preempted once.
    let compressed = || with_compression(config(CompressionMethod::KeyDiff, 0.5, 8));
    let requests = (0..2)
        .map(|i| (prompt(20 + i, 220), compressed()))
        .collect::<Vec<_>>();
    let mut e = engine(64, 80, 252, Default::default());
    let outs = run(&mut e, requests, 32);
    let preemptions = e.stats().num_preemptions;
    assert!(preemptions > 0, "the workload must collide");
    assert!(
        preemptions <= 1,
        "{preemptions} preemptions: the newest request was preempted again after readmission"
    );
    assert!(outs.iter().all(|o| tokens(o).len() == 32));
}

#[test]
fn teacher_forcing_emits_the_forced_tokens_with_their_distributions() {
    let mut e = engine(200, 32, 256, Default::default());
    let free_run = run(
        &mut e,
        vec![(
            prompt(9, 30),
            RequestOptions {
                return_full_logprobs: true,
                ..RequestOptions::default()
            },
        )],
        6,
    );
    let greedy_ids = tokens(&free_run[0]);
    // Forcing the greedy tokens reproduces the same distributions exactly.
    let forced = run(
        &mut e,
        vec![(
            prompt(9, 30),
            RequestOptions {
                forced_output_ids: Some(greedy_ids.clone()),
                return_full_logprobs: true,
                ..RequestOptions::default()
            },
        )],
        1, // max_tokens is ignored: a forced request emits all its tokens.
    );
    assert_eq!(tokens(&forced[0]), greedy_ids);
    for (a, b) in free_run[0].iter().zip(&forced[0]) {
        assert_eq!(a.full_logprobs, b.full_logprobs);
    }
    // Other tokens: the reported logprob is the distribution's entry for the forced token.
    let other: Vec<u32> = greedy_ids.iter().map(|t| (t + 1) % 128).collect();
    let forced = run(
        &mut e,
        vec![(
            prompt(9, 30),
            RequestOptions {
                forced_output_ids: Some(other.clone()),
                return_full_logprobs: true,
                ..RequestOptions::default()
            },
        )],
        1,
    );
    assert_eq!(tokens(&forced[0]), other);
    for o in &forced[0] {
        let row = o.full_logprobs.as_ref().unwrap();
        let total: f64 = row.iter().map(|&l| (l as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-4);
        assert!(o.logprob.is_none(), "logprobs were not asked for");
    }
    // Forced tokens outside the vocabulary or past the context are refused.
    let bad = RequestOptions {
        forced_output_ids: Some(vec![500]),
        ..RequestOptions::default()
    };
    assert!(e.add_request_with(prompt(1, 5), greedy(1), bad).is_err());
    let too_long = RequestOptions {
        forced_output_ids: Some(vec![3; 300]),
        ..RequestOptions::default()
    };
    assert!(e
        .add_request_with(prompt(1, 5), greedy(1), too_long)
        .is_err());
}

/// One long request's compaction is spread over steps while another request decodes: with a
/// budget of one layer per step, no step compacts more than one layer while the short request
/// runs, the long request is held (not scheduled) between its layers, the short one gets a token
/// in those steps, and every output equals the run that compacts all layers at once — which, as
/// the engine did before issue 17, compacts both layers of a due request inside one step.
#[test]
fn a_long_compaction_interleaves_with_other_requests_decode_steps() {
    let c = config(CompressionMethod::KeyDiff, 0.5, 8);
    let run_with = |budget: Option<usize>| {
        let mut e = engine(400, 256, 256, Default::default());
        e.set_compaction_step_budget(budget);
        let short = e.add_request(prompt(1, 8), greedy(40)).unwrap();
        let long = e
            .add_request_with(prompt(2, 200), greedy(30), with_compression(c.clone()))
            .unwrap();
        let mut tokens: HashMap<SeqId, Vec<u32>> = HashMap::new();
        // Per step: layers compacted, whether the short request got a token, requests compacting.
        let mut steps: Vec<(u64, bool, usize)> = Vec::new();
        let mut layers_before = 0;
        while e.has_unfinished() {
            let out = e.step().unwrap();
            let stats = e.stats();
            let short_token = out
                .iter()
                .any(|o| o.seq_id == short && o.token_id.is_some());
            steps.push((
                stats.counters.compaction_layers - layers_before,
                short_token,
                e.num_compacting(),
            ));
            layers_before = stats.counters.compaction_layers;
            for o in out {
                assert_ne!(o.finished.map(|f| f.reason.as_str()), Some("abort"));
                tokens.entry(o.seq_id).or_default().extend(o.token_id);
            }
            assert!(steps.len() < 1000);
        }
        let stats = e.stats();
        assert_eq!(stats.kv_blocks_free, stats.kv_blocks_total, "blocks leaked");
        assert!(stats.counters.compressions > 0);
        (tokens[&short].clone(), tokens[&long].clone(), steps)
    };
    let (short_at_once, long_at_once, steps_at_once) = run_with(None);
    let (short_spread, long_spread, steps_spread) = run_with(Some(1));
    assert_eq!((short_at_once.len(), long_at_once.len()), (40, 30));
    assert_eq!(short_spread, short_at_once, "the decoding request's tokens");
    assert_eq!(long_spread, long_at_once, "the compacted request's tokens");
    // All at once: some step compacts both layers while the short request runs.
    assert!(
        steps_at_once
            .iter()
            .any(|&(layers, short, _)| layers == 2 && short),
        "{steps_at_once:?}"
    );
    // Spread: never more than one layer a step while the short request runs, and the short
    // request decodes in steps that end with the long request's compaction still in progress.
    for &(layers, short, _) in &steps_spread {
        assert!(!short || layers <= 1, "{steps_spread:?}");
    }
    assert!(
        steps_spread
            .iter()
            .any(|&(layers, short, compacting)| layers == 1 && short && compacting == 1),
        "{steps_spread:?}"
    );
}

/// The context/question split: the context is compressed once, when the prompt is in, the
/// question and every generated token are kept (no re-compression while decoding), and SnapKV's
/// observation window is the whole question even when the prefill splits it across chunks.
#[test]
fn the_question_split_compresses_only_the_context_whatever_the_chunking() {
    let question = 20;
    for method in [
        CompressionMethod::SnapKv,
        CompressionMethod::KeyDiff,
        CompressionMethod::Tova,
    ] {
        let c = config(method, 0.75, 8);
        let options = RequestOptions {
            compression: Some(c.clone()),
            question_tokens: Some(question),
            ..RequestOptions::default()
        };
        let mut answers = Vec::new();
        // 16-token chunks split the question (positions 100..120) at 112; 256 takes it whole.
        for chunk in [16, 256] {
            let mut e = engine(400, chunk, 256, Default::default());
            let outs = run(&mut e, vec![(prompt(4, 120), options.clone())], 12);
            let kept = c.keep_tokens(120 - question) + question;
            for (i, o) in outs[0].iter().enumerate() {
                assert_eq!(
                    o.kv_physical_tokens,
                    kept + i,
                    "{method} chunk {chunk} output {i}"
                );
            }
            assert_eq!(e.stats().counters.compressions, 1, "{method}");
            answers.push(tokens(&outs[0]));
        }
        assert_eq!(
            answers[0], answers[1],
            "{method}: chunking changed the answer"
        );
    }
    // The split must leave a context.
    let mut e = engine(100, 32, 256, Default::default());
    let bad = RequestOptions {
        question_tokens: Some(10),
        ..RequestOptions::default()
    };
    assert!(e.add_request_with(prompt(1, 10), greedy(2), bad).is_err());
}
