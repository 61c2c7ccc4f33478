//! Admission tests: vLLM's optimistic rule, the readmission of preempted requests and
//! reserve-peak admission, on the simulated engine of the parent module.

use std::collections::HashMap;

use starling_kv::{KvCacheManager, SeqId};

use super::*;

/// Four requests that each grow from 8 to 20 tokens in a 40-slot cache: optimistic admission
/// starts all four (their prompts fit) and must preempt as they grow; reserve-peak starts two
/// (2 × 20 = 40), then the others as those finish, and never preempts. Both complete correctly.
#[test]
fn reserve_peak_admission_avoids_growth_preemptions() {
    let run = |admission| {
        let cfg = SchedulerConfig {
            admission,
            ..config(4, 64, 4)
        };
        let mut sim = Sim::new(cfg, 10);
        for seq in 1..=4 {
            sim.add(seq, 8, 12);
        }
        sim.run_to_completion(400);
        sim.assert_all_correct();
        let peak_running = sim.plans.iter().map(|p| p.stats.num_running).max();
        (sim.sched.num_preemptions(), peak_running.unwrap_or(0))
    };
    let (optimistic_preemptions, optimistic_peak) = run(AdmissionPolicy::Optimistic);
    assert!(optimistic_preemptions > 0, "the workload must collide");
    assert_eq!(optimistic_peak, 4);
    assert_eq!(run(AdmissionPolicy::ReservePeak), (0, 2));
}

/// Optimistic admission keeps vLLM's rule for uncompressed requests: two 20-token prompts that
/// each grow to 40 in a 48-slot cache collide again and again (the newest is preempted, readmitted
/// as soon as its first chunk fits, and preempted at the same point: 7 times here). A compressing
/// request that was preempted is readmitted only when the free blocks cover its own peak: once. (The fake
/// engine does not compact, so both runs hold the same tokens; only admission differs.)
#[test]
fn a_preempted_compressing_request_is_readmitted_by_its_peak() {
    let run = |compresses: bool, admission: AdmissionPolicy| {
        let cfg = SchedulerConfig {
            admission,
            ..config(4, 8, 4)
        };
        let mut sim = Sim::new(cfg, 12);
        for seq in 1..=2 {
            let footprint = if compresses {
                Footprint::compressed(40, 40, 4)
            } else {
                Footprint::uncompressed(40)
            };
            sim.add_with_footprint(seq, 20, 20, footprint);
        }
        sim.run_to_completion(2000);
        sim.assert_all_correct();
        let mut per_seq: HashMap<SeqId, usize> = HashMap::new();
        for id in sim.plans.iter().flat_map(|p| &p.preempted) {
            *per_seq.entry(*id).or_default() += 1;
        }
        per_seq.values().copied().max().unwrap_or(0)
    };
    assert!(
        run(false, AdmissionPolicy::Optimistic) > 2,
        "vLLM's rule must thrash on this workload"
    );
    assert_eq!(
        run(true, AdmissionPolicy::Optimistic),
        1,
        "preempted once, then readmitted when its peak fits"
    );
    // `OptimisticReadmit` does the same for uncompressed requests.
    assert_eq!(run(false, AdmissionPolicy::OptimisticReadmit), 1);
}

/// A request whose projected peak exceeds the whole cache still runs when it is alone (it ends
/// at the length limit), and the compression transient is reserved once a compressing request runs.
#[test]
fn reserve_peak_admits_a_lone_request_and_reserves_the_compression_transient() {
    let cfg = SchedulerConfig {
        admission: AdmissionPolicy::ReservePeak,
        ..config(4, 8, 4)
    };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(10, 4).unwrap()).unwrap();
    let huge = Footprint::uncompressed(1000);
    s.add_request_with_footprint(SeqId(1), 4, huge).unwrap();
    assert_eq!(s.schedule().scheduled.len(), 1, "alone, it runs");
    let small = Footprint {
        peak_tokens: 4,
        compresses: true,
        max_held_tokens: 12,
    };
    s.add_request_with_footprint(SeqId(2), 4, small).unwrap();
    assert!(
        s.schedule().scheduled.is_empty(),
        "seq 1's growth is reserved"
    );
    s.abort(SeqId(1)).unwrap();
    // Alone again: admitted. A third compressing request needs its 1-block peak plus the
    // 2-block transient (8 batched tokens) on top of seq 2's: 9 free blocks are enough.
    assert_eq!(s.schedule().scheduled.len(), 1);
    s.add_request_with_footprint(SeqId(3), 4, small).unwrap();
    assert_eq!(s.kv().num_free_blocks(), 9);
    assert_eq!(s.schedule().scheduled.len(), 1);
    assert_eq!(s.num_running(), 2);
}

#[test]
fn a_compressing_request_is_refused_only_when_its_own_peak_exceeds_the_cache() {
    // 10 blocks of 4 = 40 slots. A 60-token prompt fits when it compresses to a peak of 36
    // (its chunk included), and is refused when its peak is 44 — or when it does not compress.
    let mut s = Scheduler::new(config(4, 8, 4), KvCacheManager::new(10, 4).unwrap()).unwrap();
    let fits = Footprint::compressed(28, 80, 8);
    assert_eq!(fits.max_held_tokens, 36);
    s.add_request_with_footprint(SeqId(1), 60, fits).unwrap();
    let too_big = Footprint::compressed(36, 80, 8);
    assert!(matches!(
        s.add_request_with_footprint(SeqId(2), 60, too_big),
        Err(SchedulerError::PeakExceedsCache {
            max_held_tokens: 44,
            capacity_tokens: 40,
            ..
        })
    ));
    assert!(matches!(
        s.add_request_with_footprint(SeqId(3), 60, Footprint::uncompressed(80)),
        Err(SchedulerError::PromptExceedsCache { .. })
    ));
    // A short request's peak is its length.
    assert_eq!(Footprint::compressed(28, 10, 8).max_held_tokens, 10);
}
