//! Prefix caching of compacted state: the [`KvCacheManager`] operations that let a sequence
//! start from another's cached *compacted* blocks, and let a compacted sequence register its
//! blocks again.
//!
//! A compaction that is a pure function of the tokens before it (a deterministic eviction
//! policy at a fixed point, over the whole context: see `block_hash` for how such a state is
//! named) leaves blocks that are as shareable as dense ones: a later sequence with the same
//! tokens up to that point and the same policy would compute and keep exactly the same slots.
//! The engine decides when that holds; here the tables follow:
//! - [`KvCacheManager::resume_registration`]: after such a compaction the table registers
//!   again, under the chain of its slots as they are now;
//! - [`KvCacheManager::allocate_with_compacted_prefix`]: a new table starts from the cached
//!   blocks of such a chain, its logical length (the tokens they stand for) ahead of its
//!   physical one (the slots they hold).
//!
//! The invariant of `prefix` holds unchanged: registered blocks are final and never written in
//! place (a later compaction forks or unregisters them first), and a table registers only
//! blocks it wrote alone.

use crate::block_hash::BlockHash;
use crate::block_table::BlockTable;
use crate::error::KvError;
use crate::ids::SeqId;

use super::{KvCacheManager, PrefixHit};

/// What a new sequence starting from a cached compacted state asks of the cache.
#[derive(Debug, Clone, Copy)]
pub struct CompactedPrefixQuery<'a> {
    /// Hashes of the leading blocks to reuse, every one of them cached (a compacted state is
    /// reused whole or not at all: the caller sizes the run with
    /// [`KvCacheManager::find_cached_prefix`]).
    pub block_hashes: &'a [BlockHash],
    /// Tokens those blocks stand for: the sequence's computed tokens once they are in (at
    /// least the slots they hold).
    pub logical_hit_tokens: usize,
    /// Tokens of the sequence so far (the query size of the hit-rate metric).
    pub query_len_tokens: usize,
}

impl KvCacheManager {
    /// Free blocks [`Self::allocate_with_compacted_prefix`] would consume: fresh blocks for
    /// `num_new_tokens`, plus reused blocks now on the cached list.
    pub fn blocks_needed_with_compacted_prefix(
        &self,
        block_hashes: &[BlockHash],
        num_new_tokens: usize,
    ) -> usize {
        let idle_hits = self
            .cached_run(block_hashes)
            .iter()
            .filter(|b| self.pool.ref_count(**b) == Some(0))
            .count();
        num_new_tokens.div_ceil(self.block_size_tokens) + idle_hits
    }

    /// Makes the block table of the new sequence `seq` from the cached blocks of
    /// `query.block_hashes` plus fresh slots for `num_new_tokens` more tokens: physical length
    /// `blocks × block_size + num_new_tokens`, logical length `query.logical_hit_tokens +
    /// num_new_tokens`. The reused blocks count as processed by the cache; the table
    /// registers the blocks it fills after them. Counts one query, hitting
    /// `logical_hit_tokens` tokens.
    ///
    /// All or nothing: fails, changing nothing, with [`KvError::OutOfBlocks`], with
    /// [`KvError::PrefixNotCached`] when a hash is not cached (or caching is off), with
    /// [`KvError::SequenceExists`], and with [`KvError::InvalidRange`] when the blocks hold
    /// more slots than the tokens they stand for.
    pub fn allocate_with_compacted_prefix(
        &mut self,
        seq: SeqId,
        query: CompactedPrefixQuery<'_>,
        num_new_tokens: usize,
    ) -> Result<PrefixHit, KvError> {
        if self.tables.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let bs = self.block_size_tokens;
        let hits = self.cached_run(query.block_hashes);
        if !self.prefix_caching || hits.len() < query.block_hashes.len() {
            return Err(KvError::PrefixNotCached {
                seq,
                wanted_blocks: query.block_hashes.len(),
                cached_blocks: hits.len(),
            });
        }
        let physical_hit = hits.len() * bs;
        if query.logical_hit_tokens < physical_hit {
            return Err(KvError::InvalidRange {
                seq,
                start: 0,
                end: physical_hit,
                physical_len_tokens: query.logical_hit_tokens,
            });
        }
        let needed = self.blocks_needed_with_compacted_prefix(query.block_hashes, num_new_tokens);
        let free = self.pool.num_free_blocks();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        // Hits first: once held they are off the cached list, so the fresh allocation below
        // cannot evict them.
        for block in &hits {
            self.pool.acquire_cached(*block)?;
        }
        let fresh = self.pool.allocate_n(num_new_tokens.div_ceil(bs))?;
        let num_hit = hits.len();
        let mut blocks = hits;
        blocks.extend(fresh);
        let mut table = BlockTable::new(seq, bs);
        table.grow(blocks, physical_hit + num_new_tokens);
        table.skip_logical(query.logical_hit_tokens - physical_hit);
        table.set_num_hashed_blocks(num_hit);
        self.tables.insert(seq, table);
        self.stats.requests += 1;
        self.stats.query_tokens += query.query_len_tokens as u64;
        self.stats.hit_blocks += num_hit as u64;
        self.stats.hit_tokens += query.logical_hit_tokens as u64;
        Ok(PrefixHit {
            num_blocks: num_hit,
            num_tokens: query.logical_hit_tokens,
        })
    }

    /// After a finished compaction of `seq` that is a pure function of the tokens before it:
    /// the table registers again (as [`Self::register_full_blocks`] is handed the chain of its
    /// slots as they are now), its first `blocks_in_place` blocks — those the compaction left
    /// where they were — counting as processed (fewer if fewer were). Fails with
    /// [`KvError::UnknownSequence`], and with [`KvError::InvalidRange`] while a compaction is
    /// announced but not finished.
    pub fn resume_registration(
        &mut self,
        seq: SeqId,
        blocks_in_place: usize,
    ) -> Result<(), KvError> {
        let table = self
            .tables
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if let Some(from) = table.pending_rewrite_from_tokens() {
            return Err(KvError::InvalidRange {
                seq,
                start: from,
                end: table.physical_len_tokens(),
                physical_len_tokens: table.physical_len_tokens(),
            });
        }
        let full_blocks = table.physical_len_tokens() / self.block_size_tokens;
        table.resume_registration(blocks_in_place.min(full_blocks));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::prefix::tests::{cached, hasher};

    /// A's 12 dense tokens compacted to 5 slots, then 4 more tokens: the chain of its slots.
    fn compacted_chain(tokens: &[u32], after: &[u32]) -> Vec<BlockHash> {
        let h = hasher();
        let dense = h.full_block_hashes(tokens);
        let state = BlockHash::of_compacted_state(h.identity(), dense[2], "keep-5");
        let mut chain = Vec::new();
        h.extend_compacted_hashes(state, 5, after, &mut chain);
        chain
    }

    #[test]
    fn a_compacted_state_registers_again_and_a_later_table_starts_from_it() {
        let tokens: Vec<u32> = (10..22).collect();
        let after = [1, 2, 3, 4];
        let chain = compacted_chain(&tokens, &after);
        // Slots: 5 kept + 4 after = 9: two full blocks (the second mixes kept slot 4 and 3
        // tokens after).
        assert_eq!(chain.len(), 2);
        let mut kv = cached(16);
        let a = SeqId(1);
        kv.allocate_slots(a, 12).unwrap();
        let dense = hasher().full_block_hashes(&tokens);
        assert_eq!(kv.register_full_blocks(a, &dense).unwrap(), 3);
        // The compaction: its blocks forked (the dense originals stay cached), 5 slots kept.
        let pairs = kv.fork_for_rewrite(a, 0).unwrap();
        assert_eq!(pairs.len(), 3);
        kv.shrink_physical(a, 5).unwrap();
        assert_eq!(
            kv.register_full_blocks(a, &chain[..1]).unwrap(),
            0,
            "compacted"
        );
        kv.resume_registration(a, 0).unwrap();
        kv.allocate_slots(a, 4).unwrap();
        let t = kv.table(a).unwrap();
        assert_eq!((t.logical_len_tokens(), t.physical_len_tokens()), (16, 9));
        assert_eq!(kv.register_full_blocks(a, &chain).unwrap(), 2);
        kv.check_invariants().unwrap();
        // B, while A still runs: shares A's two compacted blocks, standing for 15 tokens
        // (12 compacted + 3 after), and computes from there.
        let b = SeqId(2);
        let query = CompactedPrefixQuery {
            block_hashes: &chain,
            logical_hit_tokens: 15,
            query_len_tokens: 20,
        };
        assert_eq!(kv.blocks_needed_with_compacted_prefix(&chain, 5), 2);
        let hit = kv.allocate_with_compacted_prefix(b, query, 5).unwrap();
        assert_eq!(
            hit,
            PrefixHit {
                num_blocks: 2,
                num_tokens: 15
            }
        );
        let t = kv.table(b).unwrap();
        assert_eq!((t.logical_len_tokens(), t.physical_len_tokens()), (20, 13));
        assert_eq!(t.num_hashed_blocks(), 2);
        assert_eq!(&t.block_ids()[..2], &kv.table(a).unwrap().block_ids()[..2]);
        assert!(kv.is_shared(t.block_ids()[0]));
        let stats = kv.prefix_cache_stats();
        assert_eq!((stats.hit_tokens, stats.query_tokens), (15, 20));
        kv.check_invariants().unwrap();
        kv.free(a).unwrap();
        kv.free(b).unwrap();
        kv.check_invariants().unwrap();
    }

    #[test]
    fn a_state_not_wholly_cached_is_refused_and_changes_nothing() {
        let tokens: Vec<u32> = (10..22).collect();
        let chain = compacted_chain(&tokens, &[1, 2, 3, 4]);
        let mut kv = cached(8);
        let query = CompactedPrefixQuery {
            block_hashes: &chain,
            logical_hit_tokens: 15,
            query_len_tokens: 20,
        };
        assert_eq!(
            kv.allocate_with_compacted_prefix(SeqId(1), query, 5),
            Err(KvError::PrefixNotCached {
                seq: SeqId(1),
                wanted_blocks: 2,
                cached_blocks: 0
            })
        );
        assert!(!kv.contains(SeqId(1)));
        assert_eq!(kv.prefix_cache_stats().requests, 0);
        kv.check_invariants().unwrap();
        // Resuming needs a finished compaction.
        kv.allocate_slots(SeqId(2), 8).unwrap();
        kv.prepare_rewrite(SeqId(2), 0).unwrap();
        assert!(kv.resume_registration(SeqId(2), 0).is_err());
        kv.shrink_physical(SeqId(2), 4).unwrap();
        kv.resume_registration(SeqId(2), 0).unwrap();
        assert!(!kv.table(SeqId(2)).unwrap().is_compacted());
    }
}
