//! Prefix caching of compacted prefill state: where a compressing sequence may start from the
//! cached blocks of another's compaction, and how its own compactions register again.
//!
//! A compressing request whose policy is a pure function of the keys (see
//! `engine/compacted_prefix.rs`) compacts its prompt at fixed points (multiples of the step
//! budget, [`Scheduler::align_chunks`]). What it keeps at a point is then a function of its
//! tokens up to the point, so the engine names each point's state and hashes the slots after
//! it ([`CompactedPrefix`]); the scheduler:
//! - at admission, starts the sequence from the longest of its dense cached prefix (only
//!   *before* the first point, whose chunk must run to compact) and every point's cached
//!   state (reused whole, then the cached blocks of tokens after it, stopping before the next
//!   point);
//! - after the sequence's own compaction at a point, registers its slots again under that
//!   point's chain ([`Scheduler::resume_after_compaction`]).
//!
//! Until a sequence starts from or reaches a state, it registers its dense chain as any other.

use starling_kv::{BlockHash, CompactedPrefixQuery, KvError, SeqId};

use super::{Scheduler, SchedulerError};

/// One point of a sequence's prefill where it compacts, as a fresh run does it, and the hashes
/// of its physical blocks right after (for reuse and registration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactedPrefix {
    /// Tokens before the point: what the state stands for.
    pub logical_start_tokens: usize,
    /// Slots the compaction keeps.
    pub kept_tokens: usize,
    /// First slot the compaction rewrites: the blocks before `first_rewritten_tokens /
    /// block_size` stay in place.
    pub first_rewritten_tokens: usize,
    /// Where the next point is, if any: a reuse of this state stops before it (the chunk that
    /// ends there must run, to compact).
    pub next_point_tokens: Option<usize>,
    /// Hashes of the sequence's full physical blocks after the compaction: those left in
    /// place, the state's, then the blocks of the tokens after the point (up to the next
    /// point, or the prompt's end).
    pub block_hashes: Vec<BlockHash>,
}

/// The compacted states a sequence's prefill passes through, in order of their points.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactedPrefixes {
    /// The points, earliest first.
    pub states: Vec<CompactedPrefix>,
}

impl CompactedPrefixes {
    /// The first point: dense cached blocks are reused only before it (`None`: no point, no
    /// limit).
    pub fn first_point_tokens(&self) -> Option<usize> {
        self.states.first().map(|s| s.logical_start_tokens)
    }
}

/// The best cached state for a new sequence: which state, how many of its blocks, and the
/// tokens they stand for.
pub(super) struct CompactedHit {
    state: usize,
    num_blocks: usize,
    pub(super) logical_tokens: usize,
}

impl Scheduler {
    /// Hands the scheduler the compacted states `seq_id`'s prefill passes through (see the
    /// module docs); replaces the chunk-stride limit on its dense cache hits by the first
    /// point.
    pub fn set_compacted_prefixes(
        &mut self,
        seq_id: SeqId,
        prefixes: CompactedPrefixes,
    ) -> Result<(), SchedulerError> {
        if !self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::UnknownSequence(seq_id));
        }
        self.compacted_prefixes.insert(seq_id, prefixes);
        Ok(())
    }

    /// After `seq_id`'s compaction at `point_tokens` kept `kept_tokens` slots, rewriting from
    /// `first_rewritten_tokens`: when that is the compaction a fresh run makes there (one of
    /// its [`CompactedPrefix`] states), its slots register again under that state's chain
    /// (the kept blocks at once). Returns whether they do.
    pub fn resume_after_compaction(
        &mut self,
        seq_id: SeqId,
        point_tokens: usize,
        kept_tokens: usize,
        first_rewritten_tokens: usize,
    ) -> Result<bool, SchedulerError> {
        if !self.kv.prefix_caching_enabled() {
            return Ok(false);
        }
        let Some(state) = self.compacted_prefixes.get(&seq_id).and_then(|p| {
            p.states.iter().find(|s| {
                s.logical_start_tokens == point_tokens
                    && s.kept_tokens == kept_tokens
                    && s.first_rewritten_tokens == first_rewritten_tokens
            })
        }) else {
            return Ok(false);
        };
        let chain = state.block_hashes.clone();
        let in_place = first_rewritten_tokens / self.kv.block_size_tokens();
        self.kv.resume_registration(seq_id, in_place)?;
        self.slot_chains.insert(seq_id, chain);
        self.register_computed_blocks(seq_id)?;
        Ok(true)
    }

    /// Of `seq_id`'s compacted states, the cached one that stands for the most tokens, at most
    /// `reusable_tokens` of its `num_known_tokens`; `None` when none is wholly cached.
    pub(super) fn best_compacted_hit(
        &self,
        seq_id: SeqId,
        reusable_tokens: usize,
    ) -> Option<CompactedHit> {
        let bs = self.kv.block_size_tokens();
        let prefixes = self.compacted_prefixes.get(&seq_id)?;
        let mut best: Option<CompactedHit> = None;
        for (i, s) in prefixes.states.iter().enumerate() {
            let limit = s
                .next_point_tokens
                .map_or(reusable_tokens, |next| reusable_tokens.min(next - 1));
            if limit < s.logical_start_tokens {
                continue;
            }
            // Block r ends at logical P + (r + 1)·bs − kept; the state itself must be whole.
            let max_blocks = (limit - s.logical_start_tokens + s.kept_tokens) / bs;
            let hashes = &s.block_hashes[..s.block_hashes.len().min(max_blocks)];
            let num_blocks = self.kv.find_cached_prefix(hashes).num_blocks;
            if num_blocks == 0 || num_blocks * bs < s.kept_tokens {
                continue;
            }
            let logical_tokens = s.logical_start_tokens + num_blocks * bs - s.kept_tokens;
            if best
                .as_ref()
                .is_none_or(|b| logical_tokens > b.logical_tokens)
            {
                best = Some(CompactedHit {
                    state: i,
                    num_blocks,
                    logical_tokens,
                });
            }
        }
        best
    }

    /// Makes `seq_id`'s table from `hit` plus fresh slots for `num_new_tokens`; it registers
    /// under the state's chain from now on. `false` (nothing changed) when out of blocks.
    pub(super) fn allocate_from_compacted(
        &mut self,
        seq_id: SeqId,
        hit: &CompactedHit,
        num_known_tokens: usize,
        num_new_tokens: usize,
    ) -> bool {
        let Some(state) = self
            .compacted_prefixes
            .get(&seq_id)
            .and_then(|p| p.states.get(hit.state))
        else {
            return false;
        };
        let chain = state.block_hashes.clone();
        let query = CompactedPrefixQuery {
            block_hashes: &chain[..hit.num_blocks],
            logical_hit_tokens: hit.logical_tokens,
            query_len_tokens: num_known_tokens,
        };
        match self
            .kv
            .allocate_with_compacted_prefix(seq_id, query, num_new_tokens)
        {
            Ok(_) => {
                self.slot_chains.insert(seq_id, chain);
                true
            }
            Err(e) => {
                debug_assert!(matches!(e, KvError::OutOfBlocks { .. }), "{e}");
                false
            }
        }
    }
}
