//! Scheduler tests against a simulated engine: a fake "model" whose next
//! token is a hash of all previous tokens, reading its context back from a
//! fake KV cache through the slot mapping. So a plan that computes the wrong
//! range, a slot given to two sequences, or a bad recompute after preemption
//! shows up as a wrong output token.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use starling_kv::{KvCacheManager, SeqId};

use super::*;

mod admission;

/// Next token of the fake model: FNV-1a over the whole context.
fn next_token(context: &[u32]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in context {
        h ^= u64::from(*t);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % 1000) as u32
}

/// What the request would produce running alone.
fn expected_output(prompt: &[u32], max_new_tokens: usize, limit_tokens: usize) -> Vec<u32> {
    let mut context = prompt.to_vec();
    let mut out = Vec::new();
    loop {
        let t = next_token(&context);
        out.push(t);
        if out.len() == max_new_tokens || context.len() >= limit_tokens {
            return out;
        }
        context.push(t);
    }
}

fn prompt_of(seq: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((seq * 31 + i * 7) % 1000) as u32)
        .collect()
}

struct Request {
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    max_new_tokens: usize,
}

/// A fake engine driving the scheduler step by step.
struct Sim {
    sched: Scheduler,
    /// Per flat slot: (token id, logical position) last written there.
    cache: Vec<Option<(u32, usize)>>,
    requests: HashMap<SeqId, Request>,
    outputs: HashMap<SeqId, Vec<u32>>,
    /// Steps at which each sequence was first scheduled.
    first_scheduled_step: HashMap<SeqId, usize>,
    steps: usize,
    plans: Vec<StepPlan>,
}

impl Sim {
    fn new(config: SchedulerConfig, num_blocks: usize) -> Self {
        let kv = KvCacheManager::new(num_blocks, config.block_size_tokens).unwrap();
        Self {
            sched: Scheduler::new(config, kv).unwrap(),
            cache: vec![None; num_blocks * config.block_size_tokens],
            requests: HashMap::new(),
            outputs: HashMap::new(),
            first_scheduled_step: HashMap::new(),
            steps: 0,
            plans: Vec::new(),
        }
    }

    fn add(&mut self, seq: u64, num_prompt_tokens: usize, max_new_tokens: usize) {
        // The footprint the engine would project: prompt plus every output token.
        let footprint = Footprint::uncompressed(num_prompt_tokens + max_new_tokens);
        self.add_with_footprint(seq, num_prompt_tokens, max_new_tokens, footprint);
    }

    fn add_with_footprint(
        &mut self,
        seq: u64,
        num_prompt_tokens: usize,
        max_new_tokens: usize,
        footprint: Footprint,
    ) {
        let id = SeqId(seq);
        self.sched
            .add_request_with_footprint(id, num_prompt_tokens, footprint)
            .unwrap();
        self.requests.insert(
            id,
            Request {
                tokens: prompt_of(seq, num_prompt_tokens),
                num_prompt_tokens,
                max_new_tokens,
            },
        );
    }

    /// One engine step with every check on the plan.
    fn step(&mut self) -> StepPlan {
        let config = *self.sched.config();
        let before: HashMap<SeqId, SeqProgress> = self
            .requests
            .keys()
            .filter_map(|id| self.sched.sequence(*id).map(|p| (*id, p)))
            .collect();
        let plan = self.sched.schedule();
        self.sched.check_invariants().unwrap();

        let total: usize = plan.scheduled.iter().map(|s| s.num_tokens).sum();
        assert_eq!(total, plan.num_scheduled_tokens);
        assert!(
            total <= config.max_num_batched_tokens,
            "token budget exceeded"
        );
        assert!(plan.scheduled.len() <= config.max_num_seqs);
        assert!(self.sched.num_running() <= config.max_num_seqs);
        let ids: HashSet<SeqId> = plan.scheduled.iter().map(|s| s.seq_id).collect();
        assert_eq!(
            ids.len(),
            plan.scheduled.len(),
            "a sequence scheduled twice"
        );
        for p in &plan.preempted {
            assert!(!ids.contains(p), "{p} both preempted and scheduled");
            let now = self.sched.sequence(*p).unwrap();
            assert_eq!(
                (now.status, now.num_computed_tokens),
                (SeqStatus::Waiting, 0)
            );
        }
        assert_eq!(plan.stats.batch_size, plan.scheduled.len());
        assert_eq!(plan.stats.num_scheduled_tokens, total);
        assert_eq!(
            plan.stats.num_prefill_tokens + plan.stats.num_decode_tokens,
            total
        );
        assert_eq!(
            plan.stats.num_free_blocks + plan.stats.num_blocks_in_use,
            self.sched.kv().num_total_blocks()
        );

        // Run the fake model: write the scheduled tokens' KV, then sample.
        for s in &plan.scheduled {
            let req = &self.requests[&s.seq_id];
            assert!(s.num_tokens >= 1);
            assert_eq!(s.start_position, before[&s.seq_id].num_computed_tokens);
            assert_eq!(s.physical_start_index, s.start_position, "no eviction here");
            let end = s.start_position + s.num_tokens;
            assert!(end <= req.tokens.len());
            assert_eq!(s.samples_next_token, end == req.tokens.len());
            let slots = self
                .sched
                .kv()
                .slot_mapping(
                    s.seq_id,
                    s.physical_start_index..s.physical_start_index + s.num_tokens,
                )
                .unwrap();
            for (i, slot) in slots.iter().enumerate() {
                let pos = s.start_position + i;
                self.cache[*slot as usize] = Some((req.tokens[pos], pos));
            }
            self.first_scheduled_step
                .entry(s.seq_id)
                .or_insert(self.steps);
        }
        for s in plan.scheduled.iter().filter(|s| s.samples_next_token) {
            let table = self.sched.kv().table(s.seq_id).unwrap();
            let slots = table.slot_mapping(0..table.physical_len_tokens()).unwrap();
            let context: Vec<u32> = slots
                .iter()
                .enumerate()
                .map(|(pos, slot)| {
                    let (token, written_pos) = self.cache[*slot as usize].unwrap();
                    assert_eq!(written_pos, pos, "{}: slot holds a foreign token", s.seq_id);
                    token
                })
                .collect();
            let req = self.requests.get_mut(&s.seq_id).unwrap();
            assert_eq!(
                context, req.tokens,
                "KV context differs from the known tokens"
            );
            let token = next_token(&context);
            let generated = req.tokens.len() - req.num_prompt_tokens + 1;
            if generated == req.max_new_tokens {
                self.finish(s.seq_id, token);
                continue;
            }
            match self.sched.append_token(s.seq_id) {
                Ok(()) => req.tokens.push(token),
                Err(SchedulerError::LengthLimit { .. }) => self.finish(s.seq_id, token),
                Err(e) => panic!("{e}"),
            }
        }
        self.sched.check_invariants().unwrap();
        self.steps += 1;
        self.plans.push(plan.clone());
        plan
    }

    fn finish(&mut self, seq_id: SeqId, last_token: u32) {
        let p = self.sched.sequence(seq_id).unwrap();
        let req = &self.requests[&seq_id];
        // All known tokens computed when the request ends.
        assert_eq!(p.num_computed_tokens, req.tokens.len());
        let mut out = req.tokens[req.num_prompt_tokens..].to_vec();
        out.push(last_token);
        self.outputs.insert(seq_id, out);
        self.sched.finish(seq_id).unwrap();
    }

    fn run_to_completion(&mut self, max_steps: usize) {
        while self.sched.has_unfinished() {
            assert!(
                self.steps < max_steps,
                "no progress after {max_steps} steps"
            );
            self.step();
        }
    }

    /// Every request produced what it would produce alone; cache empty.
    fn assert_all_correct(&self) {
        let limit = self.sched.max_seq_len_tokens();
        for (id, req) in &self.requests {
            let prompt = prompt_of(id.0, req.num_prompt_tokens);
            assert_eq!(
                self.outputs.get(id),
                Some(&expected_output(&prompt, req.max_new_tokens, limit)),
                "{id}"
            );
        }
        let kv = self.sched.kv();
        assert_eq!(kv.num_free_blocks(), kv.num_total_blocks());
        assert_eq!((self.sched.num_running(), self.sched.num_waiting()), (0, 0));
    }
}

fn config(
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    block_size_tokens: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len_tokens: 256,
        block_size_tokens,
        admission: AdmissionPolicy::Optimistic,
    }
}

#[test]
fn config_validation_refuses_zero_and_inconsistent_values() {
    let kv = || KvCacheManager::new(8, 4).unwrap();
    for bad in [
        config(0, 8, 4),
        config(2, 0, 4),
        SchedulerConfig {
            max_model_len_tokens: 0,
            ..config(2, 8, 4)
        },
        config(4, 3, 4),
    ] {
        assert!(
            matches!(
                Scheduler::new(bad, kv()),
                Err(SchedulerError::InvalidConfig(_))
            ),
            "{bad:?}"
        );
    }
    // Block size must match the cache's.
    assert!(matches!(
        Scheduler::new(config(2, 8, 8), kv()),
        Err(SchedulerError::InvalidConfig(_))
    ));
    let mut used = kv();
    used.allocate_slots(SeqId(9), 1).unwrap();
    assert!(Scheduler::new(config(2, 8, 4), used).is_err());
    assert!(Scheduler::new(config(2, 8, 4), kv()).is_ok());
}

#[test]
fn add_request_refuses_what_can_never_run() {
    let cfg = SchedulerConfig {
        max_model_len_tokens: 40,
        ..config(2, 8, 4)
    };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(8, 4).unwrap()).unwrap();
    assert_eq!(
        s.add_request(SeqId(1), 0),
        Err(SchedulerError::EmptyPrompt(SeqId(1)))
    );
    assert!(matches!(
        s.add_request(SeqId(1), 41),
        Err(SchedulerError::PromptTooLong {
            num_prompt_tokens: 41,
            max_model_len_tokens: 40,
            ..
        })
    ));
    // 8 blocks * 4 = 32 slots < 33 tokens, though within max_model_len.
    assert!(matches!(
        s.add_request(SeqId(1), 33),
        Err(SchedulerError::PromptExceedsCache {
            capacity_tokens: 32,
            ..
        })
    ));
    assert_eq!(s.max_seq_len_tokens(), 32);
    s.add_request(SeqId(1), 32).unwrap();
    assert_eq!(
        s.add_request(SeqId(1), 3),
        Err(SchedulerError::DuplicateSequence(SeqId(1)))
    );
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn long_prompt_is_prefilled_in_chunks_then_decoded() {
    let mut sim = Sim::new(config(4, 8, 4), 16);
    sim.add(1, 20, 3);
    let chunks: Vec<(usize, usize, bool)> = (0..3)
        .map(|_| {
            let s = sim.step().scheduled[0];
            (s.start_position, s.num_tokens, s.samples_next_token)
        })
        .collect();
    assert_eq!(chunks, vec![(0, 8, false), (8, 8, false), (16, 4, true)]);
    let decode = sim.step();
    assert_eq!(decode.scheduled[0].start_position, 20);
    assert_eq!(decode.stats.num_decode_tokens, 1);
    sim.run_to_completion(10);
    sim.assert_all_correct();
}

#[test]
fn decodes_go_first_and_prefill_takes_the_rest_of_the_budget() {
    let mut sim = Sim::new(config(4, 10, 4), 64);
    sim.add(1, 3, 10);
    sim.add(2, 4, 10);
    sim.step(); // both prompts in one step: 7 tokens
    sim.add(3, 30, 2);
    let plan = sim.step();
    let got: Vec<(u64, usize)> = plan
        .scheduled
        .iter()
        .map(|s| (s.seq_id.0, s.num_tokens))
        .collect();
    assert_eq!(got, vec![(1, 1), (2, 1), (3, 8)]);
    assert_eq!(
        (plan.stats.num_decode_tokens, plan.stats.num_prefill_tokens),
        (2, 8)
    );
    sim.run_to_completion(100);
    sim.assert_all_correct();
}

#[test]
fn max_num_seqs_caps_the_running_set() {
    let mut sim = Sim::new(config(3, 64, 4), 64);
    for i in 0..8 {
        sim.add(i, 5, 4);
    }
    let plan = sim.step();
    assert_eq!(plan.scheduled.len(), 3);
    assert_eq!((plan.stats.num_running, plan.stats.num_waiting), (3, 5));
    sim.run_to_completion(100);
    assert!(sim.plans.iter().all(|p| p.stats.num_running <= 3));
    sim.assert_all_correct();
}

#[test]
fn big_early_request_is_not_starved_by_a_stream_of_small_ones() {
    // 12 blocks of 4 = 48 slots. Small requests keep the cache busy; the big
    // one's 36-token prompt fits one 64-token step but needs 9 blocks at
    // once, which only a drained cache has. A scheduler that let later small
    // requests past a head that does not fit would starve it.
    let mut sim = Sim::new(config(4, 64, 4), 12);
    let mut next_id = 100;
    for _ in 0..3 {
        sim.add(next_id, 8, 6);
        next_id += 1;
    }
    sim.step();
    sim.add(1, 36, 4);
    let big = SeqId(1);
    while !sim.outputs.contains_key(&big) {
        assert!(sim.steps < 300, "big request starved");
        // Two new small requests every step: more than the cache serves.
        for _ in 0..2 {
            sim.add(next_id, 6, 4);
            next_id += 1;
        }
        sim.step();
    }
    // FCFS: nothing that arrived after the big request started before it.
    let big_start = sim.first_scheduled_step[&big];
    for id in 103..next_id {
        if let Some(step) = sim.first_scheduled_step.get(&SeqId(id)) {
            assert!(
                *step >= big_start,
                "seq{id} jumped ahead of the big request"
            );
        }
    }
    sim.run_to_completion(sim.steps + 2000);
    sim.assert_all_correct();
}

#[test]
fn preempted_request_is_recomputed_and_completes_with_the_same_tokens() {
    // 6 blocks of 2 = 12 slots; two requests that grow to 10 tokens each,
    // and a third that waits for a seat (max_num_seqs = 2).
    let cfg = SchedulerConfig {
        max_model_len_tokens: 12,
        ..config(2, 8, 2)
    };
    let mut sim = Sim::new(cfg, 6);
    sim.add(1, 4, 6);
    sim.add(2, 4, 6);
    sim.add(3, 2, 2);
    let victim_step = loop {
        assert!(sim.steps < 50, "no preemption");
        let plan = sim.step();
        if !plan.preempted.is_empty() {
            // The most recently admitted one is the victim; the older one goes on.
            assert_eq!(plan.preempted, vec![SeqId(2)]);
            assert_eq!(plan.stats.num_preempted, 1);
            assert_eq!(plan.scheduled[0].seq_id, SeqId(1));
            break sim.steps - 1;
        }
    };
    // Back at the front of the queue, ahead of the request that never ran.
    assert_eq!(
        sim.sched.waiting_ids().collect::<Vec<_>>(),
        vec![SeqId(2), SeqId(3)]
    );
    sim.run_to_completion(200);
    // When readmitted, it starts again from position 0.
    let restart = sim.plans[victim_step + 1..]
        .iter()
        .flat_map(|p| p.scheduled.iter())
        .find(|s| s.seq_id == SeqId(2))
        .unwrap();
    assert_eq!(restart.start_position, 0);
    sim.assert_all_correct();
}

#[test]
fn abort_frees_blocks_of_running_and_waiting_sequences() {
    let mut sim = Sim::new(config(1, 16, 4), 8);
    sim.add(1, 10, 5);
    sim.add(2, 6, 5);
    sim.step();
    assert_eq!(sim.sched.kv().num_free_blocks(), 5);
    sim.sched.abort(SeqId(2)).unwrap(); // waiting
    sim.sched.abort(SeqId(1)).unwrap(); // running
    sim.sched.check_invariants().unwrap();
    assert_eq!(sim.sched.kv().num_free_blocks(), 8);
    assert!(!sim.sched.has_unfinished());
    assert_eq!(
        sim.sched.abort(SeqId(1)),
        Err(SchedulerError::UnknownSequence(SeqId(1)))
    );
    assert!(sim.sched.schedule().is_empty());
}

#[test]
fn append_and_finish_refuse_out_of_protocol_calls() {
    let cfg = SchedulerConfig {
        max_model_len_tokens: 6,
        ..config(2, 8, 2)
    };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(8, 2).unwrap()).unwrap();
    s.add_request(SeqId(1), 5).unwrap();
    assert_eq!(
        s.finish(SeqId(1)),
        Err(SchedulerError::NotRunning(SeqId(1)))
    );
    assert!(matches!(
        s.append_token(SeqId(1)),
        Err(SchedulerError::NotAwaitingToken {
            num_tokens: 5,
            num_computed_tokens: 0,
            ..
        })
    ));
    assert!(s.schedule().scheduled[0].samples_next_token);
    s.append_token(SeqId(1)).unwrap();
    // Token 6 is known but not computed yet.
    assert!(s.append_token(SeqId(1)).is_err());
    let plan = s.schedule();
    assert_eq!(
        (
            plan.scheduled[0].start_position,
            plan.scheduled[0].num_tokens
        ),
        (5, 1)
    );
    assert_eq!(
        s.append_token(SeqId(1)),
        Err(SchedulerError::LengthLimit {
            seq_id: SeqId(1),
            limit_tokens: 6
        })
    );
    s.finish(SeqId(1)).unwrap();
    assert_eq!(
        s.append_token(SeqId(1)),
        Err(SchedulerError::UnknownSequence(SeqId(1)))
    );
    assert_eq!(s.kv().num_free_blocks(), 8);
}

#[test]
fn eviction_shrinks_physical_slots_but_positions_keep_counting() {
    let mut s = Scheduler::new(config(2, 16, 4), KvCacheManager::new(8, 4).unwrap()).unwrap();
    s.add_request(SeqId(1), 14).unwrap();
    s.schedule();
    assert_eq!(s.shrink_physical(SeqId(1), 5), Ok(2));
    s.append_token(SeqId(1)).unwrap();
    let plan = s.schedule();
    let d = plan.scheduled[0];
    assert_eq!((d.start_position, d.physical_start_index), (14, 5));
    assert_eq!(s.kv().slot_mapping(SeqId(1), 5..6).unwrap().len(), 1);
    s.check_invariants().unwrap();
    s.add_request(SeqId(2), 3).unwrap();
    assert_eq!(
        s.shrink_physical(SeqId(2), 0),
        Err(SchedulerError::NotRunning(SeqId(2)))
    );
}

#[test]
fn a_held_sequence_is_skipped_until_released_and_preemption_releases_it() {
    let mut s = Scheduler::new(config(4, 16, 4), KvCacheManager::new(6, 4).unwrap()).unwrap();
    s.add_request(SeqId(1), 4).unwrap();
    s.add_request(SeqId(2), 4).unwrap();
    s.schedule();
    s.append_token(SeqId(1)).unwrap();
    s.append_token(SeqId(2)).unwrap();
    assert_eq!(
        s.hold(SeqId(3)),
        Err(SchedulerError::UnknownSequence(SeqId(3)))
    );
    s.hold(SeqId(1)).unwrap();
    let ids = |plan: &StepPlan| plan.scheduled.iter().map(|d| d.seq_id).collect::<Vec<_>>();
    let plan = s.schedule();
    assert_eq!(ids(&plan), vec![SeqId(2)]);
    assert!(s.is_held(SeqId(1)) && s.num_held() == 1);
    s.check_invariants().unwrap();
    s.release(SeqId(1));
    s.append_token(SeqId(2)).unwrap();
    assert_eq!(ids(&s.schedule()), vec![SeqId(1), SeqId(2)]);
    s.abort(SeqId(1)).unwrap();
    assert!(!s.is_held(SeqId(1)));
    s.check_invariants().unwrap();
}

#[test]
fn preempting_a_held_sequence_releases_it() {
    // Three blocks of 4: two 4-token prompts take one each; the unheld one then grows into the
    // third and, at its ninth token, preempts the newest running sequence, the held one.
    let mut s = Scheduler::new(config(4, 16, 4), KvCacheManager::new(3, 4).unwrap()).unwrap();
    s.add_request(SeqId(1), 4).unwrap();
    s.add_request(SeqId(2), 4).unwrap();
    s.schedule();
    s.append_token(SeqId(2)).unwrap();
    s.hold(SeqId(2)).unwrap();
    let mut preempted = Vec::new();
    for _ in 0..8 {
        s.append_token(SeqId(1)).unwrap();
        let plan = s.schedule();
        s.check_invariants().unwrap();
        if !plan.preempted.is_empty() {
            preempted = plan.preempted;
            break;
        }
    }
    assert_eq!(preempted, vec![SeqId(2)]);
    assert!(!s.is_held(SeqId(2)));
    assert_eq!(s.sequence(SeqId(2)).unwrap().status, SeqStatus::Waiting);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random configs and arrivals: budget and seat limits hold every step,
    /// every request finishes with the tokens it would produce alone, and
    /// the cache is empty at the end.
    #[test]
    fn random_workloads_respect_limits_and_complete(
        max_num_seqs in 1usize..6,
        extra_budget in 0usize..24,
        block_size in 1usize..6,
        num_blocks in 2usize..20,
        max_model_len in 4usize..48,
        arrivals in prop::collection::vec((0usize..12, 1usize..=100, 1usize..10), 1..12),
        reserve_peak in any::<bool>(),
    ) {
        let cfg = SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: max_num_seqs + extra_budget,
            max_model_len_tokens: max_model_len,
            block_size_tokens: block_size,
            admission: if reserve_peak {
                AdmissionPolicy::ReservePeak
            } else {
                AdmissionPolicy::Optimistic
            },
        };
        let mut sim = Sim::new(cfg, num_blocks);
        let limit = sim.sched.max_seq_len_tokens();
        let mut pending: Vec<(usize, u64, usize, usize)> = arrivals
            .iter()
            .enumerate()
            .map(|(i, (at, pct, max_new))| (*at, i as u64, (limit * pct).div_ceil(100), *max_new))
            .collect();
        pending.sort();
        let mut pending = pending.into_iter().peekable();
        while pending.peek().is_some() || sim.sched.has_unfinished() {
            prop_assert!(sim.steps < 5000, "no progress");
            while let Some((_, id, prompt, max_new)) =
                pending.next_if(|(at, ..)| *at <= sim.steps)
            {
                sim.add(id, prompt, max_new);
            }
            sim.step();
        }
        sim.assert_all_correct();
    }
}

#[test]
fn aligned_chunks_never_cross_a_multiple_of_the_stride() {
    // Three sequences share a 24-token step budget; sequence 1's chunks are aligned to 16, so
    // whatever budget the others leave it, each of its chunks ends at or before the next
    // multiple of 16, and every multiple of 16 inside its prompt is some chunk's end.
    let mut sim = Sim::new(config(4, 24, 4), 200);
    sim.add(0, 37, 3);
    sim.add(1, 70, 3);
    sim.add(2, 29, 3);
    sim.sched.align_chunks(SeqId(1), 16).unwrap();
    assert!(matches!(
        sim.sched.align_chunks(SeqId(1), 0),
        Err(SchedulerError::InvalidConfig(_))
    ));
    assert_eq!(
        sim.sched.align_chunks(SeqId(9), 16),
        Err(SchedulerError::UnknownSequence(SeqId(9)))
    );
    sim.run_to_completion(200);
    let mut ends = Vec::new();
    for plan in &sim.plans {
        for s in plan.scheduled.iter().filter(|s| s.seq_id == SeqId(1)) {
            let end = s.start_position + s.num_tokens;
            assert!(
                s.start_position / 16 == (end - 1) / 16,
                "chunk {}..{end} crosses a multiple of 16",
                s.start_position
            );
            ends.push(end);
        }
    }
    for multiple in [16, 32, 48, 64] {
        assert!(
            ends.contains(&multiple),
            "no chunk ends at {multiple}: {ends:?}"
        );
    }
    // Cut chunks still complete the request with the tokens it generates alone.
    assert_eq!(sim.outputs[&SeqId(1)].len(), 3);
}
