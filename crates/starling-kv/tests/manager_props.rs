//! Property tests: random interleavings of allocate / append / shrink /
//! free / preempt / abort never leak, never double-free, never give one
//! block to two live sequences, and keep lengths consistent.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use starling_kv::{BlockId, KvCacheManager, KvError, SeqId};

#[derive(Debug, Clone)]
enum Op {
    /// Start a sequence (or resume a preempted one) with a prompt.
    Allocate { seq: u64, num_tokens: usize },
    /// Grow a live sequence (decode step or prefill chunk).
    Append { seq: u64, num_tokens: usize },
    /// Token eviction: keep `keep_permille`/1000 of the physical slots.
    Shrink { seq: u64, keep_permille: usize },
    /// Request finished.
    Free { seq: u64 },
    /// Preempted by recompute: blocks freed, the sequence may come back.
    Preempt { seq: u64 },
    /// Aborted by the client (may name an unknown sequence).
    Abort { seq: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0u64..6;
    prop_oneof![
        (seq.clone(), 1usize..40).prop_map(|(seq, num_tokens)| Op::Allocate { seq, num_tokens }),
        (seq.clone(), 1usize..12).prop_map(|(seq, num_tokens)| Op::Append { seq, num_tokens }),
        (seq.clone(), 0usize..=1000)
            .prop_map(|(seq, keep_permille)| Op::Shrink { seq, keep_permille }),
        seq.clone().prop_map(|seq| Op::Free { seq }),
        seq.clone().prop_map(|seq| Op::Preempt { seq }),
        seq.prop_map(|seq| Op::Abort { seq }),
    ]
}

/// Expected (logical, physical) lengths per live sequence.
type Model = HashMap<SeqId, (usize, usize)>;

fn check(kv: &KvCacheManager, model: &Model) {
    kv.check_invariants().unwrap();
    let mut seen: HashSet<BlockId> = HashSet::new();
    let mut held = 0usize;
    for (seq, (logical, physical)) in model {
        let t = kv.table(*seq).expect("live sequence has a table");
        assert_eq!(t.logical_len_tokens(), *logical, "{seq} logical");
        assert_eq!(t.physical_len_tokens(), *physical, "{seq} physical");
        assert_eq!(
            t.block_ids().len(),
            physical.div_ceil(kv.block_size_tokens())
        );
        for b in t.block_ids() {
            assert!(seen.insert(*b), "block {b} held by two sequences");
        }
        held += t.block_ids().len();
        // Every held slot maps into the pool and slots are distinct.
        let slots = kv.slot_mapping(*seq, 0..*physical).unwrap();
        let max_slot = (kv.num_total_blocks() * kv.block_size_tokens()) as u32;
        assert!(slots.iter().all(|s| *s < max_slot));
    }
    assert_eq!(kv.seq_ids().count(), model.len());
    assert_eq!(kv.num_free_blocks() + held, kv.num_total_blocks(), "leak");
}

fn grow(kv: &mut KvCacheManager, model: &mut Model, seq: SeqId, n: usize) {
    let before_free = kv.num_free_blocks();
    let needed = kv.blocks_needed(seq, n);
    match kv.allocate_slots(seq, n) {
        Ok(()) => {
            let e = model.entry(seq).or_insert((0, 0));
            e.0 += n;
            e.1 += n;
            assert_eq!(kv.num_free_blocks(), before_free - needed);
        }
        Err(KvError::OutOfBlocks {
            needed: got_needed,
            free,
        }) => {
            assert_eq!((got_needed, free), (needed, before_free));
            assert!(needed > before_free);
            assert_eq!(
                kv.num_free_blocks(),
                before_free,
                "failed allocation took blocks"
            );
            assert_eq!(kv.contains(seq), model.contains_key(&seq));
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn release(kv: &mut KvCacheManager, model: &mut Model, seq: SeqId) {
    let result = kv.free(seq);
    match model.remove(&seq) {
        Some(_) => assert!(result.is_ok()),
        None => assert_eq!(result, Err(KvError::UnknownSequence(seq))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_keep_the_books(
        num_blocks in 0usize..24,
        block_size in 1usize..9,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut kv = KvCacheManager::new(num_blocks, block_size).unwrap();
        let mut model = Model::new();
        for op in ops {
            match op {
                Op::Allocate { seq, num_tokens } => {
                    // A fresh or returning (preempted, freed) id starts a new
                    // table; a live id continues its table.
                    grow(&mut kv, &mut model, SeqId(seq), num_tokens);
                }
                Op::Append { seq, num_tokens } => {
                    let seq = SeqId(seq);
                    if model.contains_key(&seq) {
                        grow(&mut kv, &mut model, seq, num_tokens);
                    }
                }
                Op::Shrink { seq, keep_permille } => {
                    let seq = SeqId(seq);
                    match model.get_mut(&seq) {
                        Some((_, physical)) => {
                            let new_len = *physical * keep_permille / 1000;
                            let before = kv.num_free_blocks();
                            let freed = kv.shrink_physical(seq, new_len).unwrap();
                            let expect = physical.div_ceil(block_size) - new_len.div_ceil(block_size);
                            prop_assert_eq!(freed, expect);
                            prop_assert_eq!(kv.num_free_blocks(), before + freed);
                            *physical = new_len;
                        }
                        None => prop_assert_eq!(
                            kv.shrink_physical(seq, 0),
                            Err(KvError::UnknownSequence(seq))
                        ),
                    }
                }
                Op::Free { seq } | Op::Preempt { seq } | Op::Abort { seq } => {
                    release(&mut kv, &mut model, SeqId(seq));
                }
            }
            check(&kv, &model);
        }
        // Drain: everything comes back.
        let live: Vec<SeqId> = model.keys().copied().collect();
        for seq in live {
            release(&mut kv, &mut model, seq);
        }
        check(&kv, &model);
        prop_assert_eq!(kv.num_free_blocks(), kv.num_total_blocks());
    }
}
