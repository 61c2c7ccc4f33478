//! `Scheduler::schedule`: building one step's plan.
//!
//! Order of service, under a budget of `max_num_batched_tokens` (held sequences
//! are skipped):
//! 1. running sequences with one token left (decodes), one token each;
//! 2. running sequences still prefilling, a chunk of `min(remaining, budget)`;
//! 3. waiting sequences in FCFS order, same chunking, while fewer than
//!    `max_num_seqs` run. Skipped in a step that had to preempt, since the
//!    cache is evidently full.
//!
//! Slots are allocated before a sequence is scheduled. A running sequence
//! that cannot get blocks preempts the most recently admitted running
//! sequence (possibly itself) and retries. Should the victim already be in
//! this step's plan, it is taken out and its tokens go back to the budget
//! (defensive: with this service order the newest running sequence is
//! normally reached last). A
//! waiting sequence that cannot get blocks stops admission altogether, so no
//! later request jumps ahead of it (no starvation of large requests). Under
//! [`super::AdmissionPolicy::ReservePeak`] the head also waits until the
//! projected peaks of the running sequences and its own fit (see `admission`).
//!
//! A waiting sequence starts at its prefix-cache hit: the cached leading blocks
//! go into its table as they are, `num_computed_tokens` starts after them, and
//! only the uncached rest counts against the budget. The hit never covers the
//! last known token (its logits must be computed), so at least one token runs. A
//! compressing sequence may instead start from a cached *compacted* state of its prefill, when
//! that stands for more tokens (see `compacted_prefix`).

use starling_kv::{KvError, PrefixQuery, SeqId};

use super::plan::{ScheduledSeq, StepPlan, StepStats};
use super::sequence::SeqStatus;
use super::Scheduler;

/// A plan under construction.
struct Draft {
    scheduled: Vec<ScheduledSeq>,
    preempted: Vec<SeqId>,
    budget_tokens: usize,
}

impl Scheduler {
    /// Plans the next step (see the module doc for the order). Allocates KV
    /// slots for, and advances `num_computed_tokens` of, every scheduled
    /// sequence; the engine must run the plan it gets.
    pub fn schedule(&mut self) -> StepPlan {
        let mut draft = Draft {
            scheduled: Vec::new(),
            preempted: Vec::new(),
            budget_tokens: self.config.max_num_batched_tokens,
        };
        self.schedule_running(&mut draft);
        if draft.preempted.is_empty() {
            self.schedule_waiting(&mut draft);
        }
        self.commit(draft)
    }

    fn schedule_running(&mut self, draft: &mut Draft) {
        let (decoding, prefilling): (Vec<SeqId>, Vec<SeqId>) = self
            .running
            .iter()
            .filter(|id| !self.held.contains(id))
            .partition(|id| {
                self.seqs
                    .get(id)
                    .is_some_and(|seq| seq.has_one_token_left())
            });
        for seq_id in decoding.into_iter().chain(prefilling) {
            // Preempted earlier in this step.
            if !self.running.contains(&seq_id) {
                continue;
            }
            let Some(seq) = self.seqs.get(&seq_id) else {
                continue;
            };
            let num_tokens = seq
                .num_remaining_tokens()
                .min(draft.budget_tokens)
                .min(self.chunk_room_tokens(seq_id, seq.num_computed_tokens));
            // Zero: waiting for the engine's sampled token, or no budget left.
            if num_tokens == 0 {
                continue;
            }
            loop {
                if self.try_allocate(seq_id, num_tokens) {
                    self.push_scheduled(draft, seq_id, num_tokens);
                    break;
                }
                let Some(&victim) = self.running.last() else {
                    break;
                };
                self.preempt(draft, victim);
                if victim == seq_id {
                    break;
                }
            }
        }
    }

    fn schedule_waiting(&mut self, draft: &mut Draft) {
        while let Some(&seq_id) = self.waiting.front() {
            if self.running.len() >= self.config.max_num_seqs || draft.budget_tokens == 0 {
                break;
            }
            let Some(seq) = self.seqs.get(&seq_id) else {
                // Not reachable: queues and map are kept in step.
                self.waiting.pop_front();
                continue;
            };
            let num_known = seq.num_tokens;
            if !self.admits(seq_id) {
                // FCFS: the head waits, and so does everyone behind it.
                break;
            }
            let Some(num_tokens) = self.try_allocate_new(seq_id, num_known, draft.budget_tokens)
            else {
                break;
            };
            self.waiting.pop_front();
            self.running.push(seq_id);
            if let Some(seq) = self.seqs.get_mut(&seq_id) {
                seq.status = SeqStatus::Running;
            }
            self.push_scheduled(draft, seq_id, num_tokens);
        }
    }

    /// Allocates slots for `num_tokens` more tokens; false when out of blocks.
    fn try_allocate(&mut self, seq_id: SeqId, num_tokens: usize) -> bool {
        match self.kv.allocate_slots(seq_id, num_tokens) {
            Ok(()) => true,
            Err(e) => {
                debug_assert!(matches!(e, KvError::OutOfBlocks { .. }), "{e}");
                false
            }
        }
    }

    /// Makes the table of a sequence starting from nothing computed: its cached leading blocks
    /// (never the one holding its last known token, nor any of its uncached tail) plus fresh slots for a chunk of the rest
    /// within `budget_tokens`. Sets `num_computed_tokens` to the hit and returns the chunk's
    /// length; `None` (nothing changed) when out of blocks or budget.
    fn try_allocate_new(
        &mut self,
        seq_id: SeqId,
        num_known_tokens: usize,
        budget_tokens: usize,
    ) -> Option<usize> {
        let bs = self.kv.block_size_tokens();
        let hashes = self
            .block_hashes
            .get(&seq_id)
            .map_or(&[][..], Vec::as_slice);
        let tail = self.uncached_tail_tokens.get(&seq_id).copied().unwrap_or(1);
        let reusable_tokens = num_known_tokens.saturating_sub(tail.max(1));
        let mut reusable = reusable_tokens / bs;
        // Dense cached tokens only before the first point where the prompt compacts: the chunk
        // ending there must run, for the compaction it makes due. The engine names the points
        // of the policies it can cache compacted state for (`compacted_prefix`); for the others
        // every aligned point may be one (see `align_chunks`).
        match self.compacted_prefixes.get(&seq_id) {
            Some(prefixes) => {
                if let Some(point) = prefixes.first_point_tokens() {
                    reusable = reusable.min((point - 1) / bs);
                }
            }
            None => {
                if let Some(&stride) = self.chunk_stride_tokens.get(&seq_id) {
                    reusable = reusable.min((stride - 1) / bs);
                }
            }
        }
        let hashes = &hashes[..hashes.len().min(reusable)];
        let cached_tokens = self.kv.find_cached_prefix(hashes).num_tokens;
        if let Some(hit) = self
            .best_compacted_hit(seq_id, reusable_tokens)
            .filter(|h| h.logical_tokens > cached_tokens)
        {
            let num_tokens = (num_known_tokens - hit.logical_tokens)
                .min(budget_tokens)
                .min(self.chunk_room_tokens(seq_id, hit.logical_tokens));
            if num_tokens == 0
                || !self.allocate_from_compacted(seq_id, &hit, num_known_tokens, num_tokens)
            {
                return None;
            }
            if let Some(seq) = self.seqs.get_mut(&seq_id) {
                seq.num_computed_tokens = hit.logical_tokens;
            }
            return Some(num_tokens);
        }
        let num_tokens = (num_known_tokens - cached_tokens)
            .min(budget_tokens)
            .min(self.chunk_room_tokens(seq_id, cached_tokens));
        if num_tokens == 0 {
            return None;
        }
        let query = PrefixQuery {
            block_hashes: hashes,
            query_len_tokens: num_known_tokens,
        };
        match self
            .kv
            .allocate_with_prefix(seq_id, query, cached_tokens + num_tokens)
        {
            Ok(hit) => {
                debug_assert_eq!(hit.num_tokens, cached_tokens);
                if let Some(seq) = self.seqs.get_mut(&seq_id) {
                    seq.num_computed_tokens = hit.num_tokens;
                }
                Some(cached_tokens + num_tokens - hit.num_tokens)
            }
            Err(e) => {
                debug_assert!(matches!(e, KvError::OutOfBlocks { .. }), "{e}");
                None
            }
        }
    }

    /// Records a scheduled chunk whose slots were just allocated.
    fn push_scheduled(&mut self, draft: &mut Draft, seq_id: SeqId, num_tokens: usize) {
        let Some(seq) = self.seqs.get(&seq_id) else {
            return;
        };
        let physical_len = self
            .kv
            .table(seq_id)
            .map_or(num_tokens, |t| t.physical_len_tokens());
        draft.scheduled.push(ScheduledSeq {
            seq_id,
            start_position: seq.num_computed_tokens,
            num_tokens,
            physical_start_index: physical_len - num_tokens,
            samples_next_token: seq.num_computed_tokens + num_tokens == seq.num_tokens,
        });
        draft.budget_tokens -= num_tokens;
    }

    /// Preemption by recompute: free the victim's blocks, forget its
    /// progress, and put it at the front of the waiting queue.
    fn preempt(&mut self, draft: &mut Draft, victim: SeqId) {
        // A running sequence always holds a table, so this cannot fail.
        let freed = self.kv.free(victim);
        debug_assert!(freed.is_ok(), "preempting {victim}: {freed:?}");
        // Recomputed from scratch: its slots are its dense tokens again.
        self.slot_chains.remove(&victim);
        self.running.retain(|id| *id != victim);
        self.held.remove(&victim);
        self.waiting.push_front(victim);
        if let Some(seq) = self.seqs.get_mut(&victim) {
            seq.status = SeqStatus::Waiting;
            seq.num_computed_tokens = 0;
            seq.times_preempted = seq.times_preempted.saturating_add(1);
        }
        if let Some(pos) = draft.scheduled.iter().position(|s| s.seq_id == victim) {
            let undone = draft.scheduled.remove(pos);
            draft.budget_tokens += undone.num_tokens;
        }
        draft.preempted.push(victim);
        self.num_preemptions += 1;
    }

    /// Advances computed counts and gathers the step's counters.
    fn commit(&mut self, draft: Draft) -> StepPlan {
        let mut stats = StepStats::default();
        for s in &draft.scheduled {
            let Some(seq) = self.seqs.get_mut(&s.seq_id) else {
                continue;
            };
            // A decode is the single newest token after the prompt; chunks,
            // including recomputation after preemption, count as prefill.
            let is_decode = s.num_tokens == 1 && s.start_position >= seq.num_prompt_tokens;
            if is_decode {
                stats.num_decode_tokens += 1;
            } else {
                stats.num_prefill_tokens += s.num_tokens;
            }
            seq.num_computed_tokens += s.num_tokens;
        }
        let num_scheduled_tokens = draft.scheduled.iter().map(|s| s.num_tokens).sum();
        stats.batch_size = draft.scheduled.len();
        stats.num_scheduled_tokens = num_scheduled_tokens;
        stats.num_preempted = draft.preempted.len();
        stats.num_free_blocks = self.kv.num_free_blocks();
        stats.num_blocks_in_use = self.kv.num_total_blocks() - stats.num_free_blocks;
        stats.num_waiting = self.waiting.len();
        stats.num_running = self.running.len();
        StepPlan {
            scheduled: draft.scheduled,
            preempted: draft.preempted,
            num_scheduled_tokens,
            stats,
        }
    }
}
