//! Automatic prefix caching: the [`KvCacheManager`] operations that reuse
//! registered full blocks across sequences.
//!
//! The life of a cached block:
//! 1. A sequence's K/V for a full block is written; the engine calls
//!    [`KvCacheManager::register_full_blocks`] with the block's
//!    [`BlockHash`] (from [`crate::BlockHasher`]): the pool maps the hash to
//!    the block.
//! 2. The sequence ends; [`KvCacheManager::free`] puts the block, still
//!    registered, on the pool's cached list (an LRU) instead of the free
//!    list.
//! 3. A later sequence whose prompt starts with the same tokens (under the
//!    same [`crate::CacheIdentity`]) finds it:
//!    [`KvCacheManager::allocate_with_prefix`] puts it in the new table
//!    (ref count + 1, off the LRU) and the engine computes only the rest.
//! 4. When the pool needs a block and no uncached free block is left, the
//!    least recently freed cached block is evicted: its hash is dropped and
//!    it is handed out fresh.
//!
//! **Invariant (no shared writes):** a block is written only by a sequence
//! that holds it alone and has not registered it. Registered blocks are
//! full and final; sharing happens only through registration; appends
//! write past a table's hashed prefix. A compaction either forks first
//! ([`KvCacheManager::fork_for_rewrite`]: every registered or shared block
//! it will rewrite is swapped for a private copy, the original staying
//! cached, so it may evict over the whole context exactly as without the
//! cache), or, when the pool has no blocks for the copies, drops the
//! registration of every block it will rewrite and is refused
//! ([`KvError::SharedBlockRewrite`]) if one of them is shared
//! ([`KvCacheManager::prepare_rewrite`]: eviction then confines itself to
//! the sequence's private tail). Appends never need a copy.
//!
//! With prefix caching off every operation here degrades to what the
//! manager did without a cache (`allocate_with_prefix` is `allocate_slots`
//! on a new table, nothing is registered or found), so behaviour is
//! exactly the uncached one.

use std::ops::Range;

use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::block_table::BlockTable;
use crate::error::KvError;
use crate::ids::{BlockId, SeqId};

use super::KvCacheManager;

/// What a new sequence asks of the prefix cache.
#[derive(Debug, Clone, Copy)]
pub struct PrefixQuery<'a> {
    /// Hashes of the sequence's leading full blocks that may be reused, in
    /// order. The engine leaves out the block holding the prompt's last
    /// token (hash at most `(prompt_len - 1) / block_size` blocks), so at
    /// least one token is computed and yields logits.
    pub block_hashes: &'a [BlockHash],
    /// Tokens of the sequence so far (its prompt, plus outputs when it
    /// resumes after preemption): the query size of the hit-rate metric,
    /// as vLLM counts `prefix_cache_queries`.
    pub query_len_tokens: usize,
}

/// A prefix-cache hit: the leading blocks (and their tokens) found cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixHit {
    /// Leading blocks reused.
    pub num_blocks: usize,
    /// Their tokens (`num_blocks * block_size`): K/V the engine need not
    /// compute.
    pub num_tokens: usize,
}

/// Cumulative prefix-cache counters since the manager was made, for
/// vLLM-style metrics (`prefix_cache_queries`, `prefix_cache_hits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCacheStats {
    /// Sequences allocated through the cache.
    pub requests: u64,
    /// Tokens those sequences asked about ([`PrefixQuery::query_len_tokens`]).
    pub query_tokens: u64,
    /// Tokens found cached.
    pub hit_tokens: u64,
    /// Blocks found cached.
    pub hit_blocks: u64,
    /// Cached blocks evicted (hash dropped) to serve an allocation.
    pub evicted_blocks: u64,
}

impl PrefixCacheStats {
    /// `hit_tokens / query_tokens`, 0 before any query.
    pub fn hit_rate(&self) -> f64 {
        if self.query_tokens == 0 {
            return 0.0;
        }
        self.hit_tokens as f64 / self.query_tokens as f64
    }
}

impl KvCacheManager {
    /// Whether prefix caching is on.
    pub fn prefix_caching_enabled(&self) -> bool {
        self.prefix_caching
    }

    /// Counters since construction.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            evicted_blocks: self.pool.num_evicted_blocks(),
            ..self.stats
        }
    }

    /// Zeroes the query and hit counters (an engine's boot-time warm-up is nobody's query).
    pub fn reset_prefix_cache_stats(&mut self) {
        self.stats = PrefixCacheStats::default();
    }

    /// Registered blocks, free or used.
    pub fn num_cached_blocks(&self) -> usize {
        self.pool.num_cached_blocks()
    }

    /// The longest run of leading `block_hashes` that is registered, without
    /// taking anything or counting a query (a scheduler can size a chunk by
    /// it, then call [`Self::allocate_with_prefix`]). None when caching is off.
    pub fn find_cached_prefix(&self, block_hashes: &[BlockHash]) -> PrefixHit {
        let num_blocks = self.cached_run(block_hashes).len();
        PrefixHit {
            num_blocks,
            num_tokens: num_blocks * self.block_size_tokens,
        }
    }

    /// Free blocks [`Self::allocate_with_prefix`] would consume for a new
    /// table of `num_tokens`: fresh blocks for the uncached rest, plus hit
    /// blocks now on the cached list (taking them back removes them from
    /// what can be allocated). Blocks other sequences hold cost nothing.
    pub fn blocks_needed_with_prefix(
        &self,
        block_hashes: &[BlockHash],
        num_tokens: usize,
    ) -> usize {
        let hits = self.usable_hits(block_hashes, num_tokens);
        let idle_hits = hits
            .iter()
            .filter(|b| self.pool.ref_count(**b) == Some(0))
            .count();
        num_tokens.div_ceil(self.block_size_tokens) - hits.len() + idle_hits
    }

    /// Makes the block table of the new sequence `seq` for its first
    /// `num_tokens` tokens (cached ones included): the longest cached run of
    /// `query.block_hashes` that fits in `num_tokens` is reused, fresh blocks
    /// cover the rest. Both lengths become `num_tokens`; the returned hit
    /// says how many leading tokens already have their K/V, so the engine
    /// computes only `hit.num_tokens..num_tokens`. Counts one query.
    ///
    /// All or nothing: on [`KvError::OutOfBlocks`] (needing
    /// [`Self::blocks_needed_with_prefix`] blocks) nothing changes, and
    /// counters are untouched. A sequence that already has a table is
    /// [`KvError::SequenceExists`]. With caching off this is
    /// [`Self::allocate_slots`] on a new table, returning no hit.
    pub fn allocate_with_prefix(
        &mut self,
        seq: SeqId,
        query: PrefixQuery<'_>,
        num_tokens: usize,
    ) -> Result<PrefixHit, KvError> {
        if self.tables.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        if !self.prefix_caching {
            self.allocate_slots(seq, num_tokens)?;
            return Ok(PrefixHit::default());
        }
        let bs = self.block_size_tokens;
        let hits = self.usable_hits(query.block_hashes, num_tokens);
        let needed = self.blocks_needed_with_prefix(query.block_hashes, num_tokens);
        let free = self.pool.num_free_blocks();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        // Hits first: once held they are off the cached list, so the fresh
        // allocation below cannot evict them.
        for block in &hits {
            self.pool.acquire_cached(*block)?;
        }
        let fresh = self.pool.allocate_n(num_tokens.div_ceil(bs) - hits.len())?;
        let num_hit = hits.len();
        let mut blocks = hits;
        blocks.extend(fresh);
        let mut table = BlockTable::new(seq, bs);
        table.grow(blocks, num_tokens);
        table.set_num_hashed_blocks(num_hit);
        self.tables.insert(seq, table);
        self.stats.requests += 1;
        self.stats.query_tokens += query.query_len_tokens as u64;
        self.stats.hit_blocks += num_hit as u64;
        self.stats.hit_tokens += (num_hit * bs) as u64;
        Ok(PrefixHit {
            num_blocks: num_hit,
            num_tokens: num_hit * bs,
        })
    }

    /// Registers `seq`'s full blocks whose K/V is now completely written:
    /// `written_block_hashes[i]` is block `i`'s hash, for every leading full
    /// block written so far (the engine keeps one growing chain per
    /// sequence and passes the part its forward passes have covered). Blocks
    /// already processed are skipped; a block whose hash another block holds
    /// already stays private. Returns how many blocks were newly registered.
    ///
    /// The caller's promise: each block's K/V is what a fresh, uncompressed
    /// prefill of those tokens under the hash's identity would write. So a
    /// compacted sequence ([`crate::BlockTable::is_compacted`]) registers
    /// nothing (returns 0): its slots no longer line up with its tokens and
    /// later tokens were computed over an evicted context.
    ///
    /// Fails with [`KvError::UnknownSequence`], or [`KvError::InvalidRange`]
    /// when the hashes cover more full blocks than the table holds. With
    /// caching off it only checks its arguments and returns 0.
    pub fn register_full_blocks(
        &mut self,
        seq: SeqId,
        written_block_hashes: &[BlockHash],
    ) -> Result<usize, KvError> {
        let bs = self.block_size_tokens;
        let table = self
            .tables
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if table.is_compacted() {
            return Ok(0);
        }
        let full_blocks = table.physical_len_tokens() / bs;
        if written_block_hashes.len() > full_blocks {
            return Err(KvError::InvalidRange {
                seq,
                start: 0,
                end: written_block_hashes.len() * bs,
                physical_len_tokens: table.physical_len_tokens(),
            });
        }
        if !self.prefix_caching {
            return Ok(0);
        }
        let done = table.num_hashed_blocks();
        debug_assert!(
            table.block_ids()[..done.min(written_block_hashes.len())]
                .iter()
                .zip(written_block_hashes)
                .all(|(b, h)| self.pool.block_hash(*b).is_none_or(|r| r == *h)),
            "{seq}: hashes disagree with the blocks registered before"
        );
        let mut registered = 0;
        // A block a sliding window released before its hash was known is not held: skip it.
        let fresh = written_block_hashes
            .iter()
            .zip(table.block_ids())
            .skip(done)
            .filter(|(_, block)| **block != BlockId::RELEASED);
        for (hash, block) in fresh {
            if self.pool.register(*block, *hash)? {
                registered += 1;
            }
        }
        if written_block_hashes.len() > done {
            table.set_num_hashed_blocks(written_block_hashes.len());
        }
        Ok(registered)
    }

    /// Physical tokens of `seq` up to the end of its last shared block: a
    /// compaction may rewrite only slots from here on (0 when no block is
    /// shared). Sharing can grow later only among registered blocks, which a
    /// compaction drops first through [`Self::prepare_rewrite`].
    pub fn shared_prefix_len_tokens(&self, seq: SeqId) -> Result<usize, KvError> {
        let table = self.tables.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let end_blocks = table
            .block_ids()
            .iter()
            .rposition(|b| self.pool.is_shared(*b))
            .map_or(0, |i| i + 1);
        Ok((end_blocks * self.block_size_tokens).min(table.physical_len_tokens()))
    }

    /// Announces that `seq`'s slots from `first_rewritten_token` on are about
    /// to be rewritten in place (a compaction moving survivors down), before
    /// any write: the blocks covering them lose their registration at once,
    /// so no sequence admitted meanwhile can reuse contents about to change,
    /// and the table counts as compacted (it registers nothing more). The
    /// following [`Self::shrink_physical`] ends the rewrite. Returns how
    /// many registrations were dropped.
    ///
    /// Fails, changing nothing, with [`KvError::SharedBlockRewrite`] if one
    /// of those blocks is shared (start at or after
    /// [`Self::shared_prefix_len_tokens`]), and with
    /// [`KvError::InvalidRange`] past the physical length.
    pub fn prepare_rewrite(
        &mut self,
        seq: SeqId,
        first_rewritten_token: usize,
    ) -> Result<usize, KvError> {
        let bs = self.block_size_tokens;
        let table = super::table_mut(&mut self.tables, seq)?;
        check_rewrite_start(table, first_rewritten_token)?;
        let dropped = if self.prefix_caching {
            let rewritten = first_rewritten_token / bs..table.block_ids().len();
            unregister_private(&mut self.pool, table, rewritten)?
        } else {
            0
        };
        table.begin_rewrite(first_rewritten_token);
        Ok(dropped)
    }

    /// Leading blocks registered under the leading `block_hashes`.
    pub(super) fn cached_run(&self, block_hashes: &[BlockHash]) -> Vec<BlockId> {
        if !self.prefix_caching {
            return Vec::new();
        }
        block_hashes
            .iter()
            .map_while(|h| self.pool.cached_block(*h))
            .collect()
    }

    /// The cached run a new table of `num_tokens` can use (whole blocks
    /// inside `num_tokens`).
    fn usable_hits(&self, block_hashes: &[BlockHash], num_tokens: usize) -> Vec<BlockId> {
        let max_blocks = (num_tokens / self.block_size_tokens).min(block_hashes.len());
        self.cached_run(&block_hashes[..max_blocks])
    }
}

/// A rewrite announced from `first_rewritten_token` must start within the physical length.
pub(super) fn check_rewrite_start(
    table: &BlockTable,
    first_rewritten_token: usize,
) -> Result<(), KvError> {
    if first_rewritten_token > table.physical_len_tokens() {
        return Err(KvError::InvalidRange {
            seq: table.seq(),
            start: first_rewritten_token,
            end: table.physical_len_tokens(),
            physical_len_tokens: table.physical_len_tokens(),
        });
    }
    Ok(())
}

/// Drops the registration of `table`'s blocks in `blocks` (indices), which
/// are about to be written, after checking none is shared; on
/// [`KvError::SharedBlockRewrite`] nothing changed. Shrinks the table's
/// hashed prefix to end before them. Returns registrations dropped.
pub(super) fn unregister_private(
    pool: &mut BlockPool,
    table: &mut BlockTable,
    blocks: Range<usize>,
) -> Result<usize, KvError> {
    let ids = &table.block_ids()[blocks.clone()];
    if let Some(shared) = ids.iter().find(|b| pool.is_shared(**b)) {
        return Err(KvError::SharedBlockRewrite {
            seq: table.seq(),
            block: *shared,
        });
    }
    let mut dropped = 0;
    for block in ids {
        if pool.unregister(*block)? {
            dropped += 1;
        }
    }
    if table.num_hashed_blocks() > blocks.start {
        table.set_num_hashed_blocks(blocks.start);
    }
    Ok(dropped)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::block_hash::{BlockHasher, CacheIdentity, CacheIdentityParts};
    use crate::layout::CacheLayout;
    use crate::manager::KvCacheConfig;

    const BS: usize = 4;

    pub(in crate::manager) fn hasher() -> BlockHasher {
        let layout = CacheLayout { layers: vec![] };
        let id = CacheIdentity::new(&CacheIdentityParts {
            model_identity: "prefix-test",
            layout: &layout,
            checkpoint_identity: None,
        });
        BlockHasher::new(id, BS).unwrap()
    }

    pub(in crate::manager) fn cached(num_blocks: usize) -> KvCacheManager {
        KvCacheManager::with_config(KvCacheConfig {
            num_blocks,
            block_size_tokens: BS,
            enable_prefix_caching: true,
        })
        .unwrap()
    }

    /// Hashes a prompt may reuse: every full block before its last token.
    fn reusable(tokens: &[u32]) -> Vec<BlockHash> {
        let mut h = hasher().full_block_hashes(&tokens[..tokens.len() - 1]);
        h.truncate((tokens.len() - 1) / BS);
        h
    }

    /// Allocates a whole prompt, "computes" it and registers its full blocks.
    fn run_prompt(kv: &mut KvCacheManager, seq: u64, tokens: &[u32]) -> PrefixHit {
        let hashes = reusable(tokens);
        let query = PrefixQuery {
            block_hashes: &hashes,
            query_len_tokens: tokens.len(),
        };
        let hit = kv
            .allocate_with_prefix(SeqId(seq), query, tokens.len())
            .unwrap();
        let written = hasher().full_block_hashes(tokens);
        kv.register_full_blocks(SeqId(seq), &written).unwrap();
        kv.check_invariants().unwrap();
        hit
    }

    fn blocks(kv: &KvCacheManager, seq: u64) -> Vec<BlockId> {
        kv.table(SeqId(seq)).unwrap().block_ids().to_vec()
    }

    #[test]
    fn a_second_request_shares_the_first_ones_full_blocks() {
        let mut kv = cached(10);
        let prompt: Vec<u32> = (100..110).collect();
        assert_eq!(run_prompt(&mut kv, 1, &prompt), PrefixHit::default());
        assert_eq!(kv.num_cached_blocks(), 2);
        let hit = run_prompt(&mut kv, 2, &prompt);
        assert_eq!(
            hit,
            PrefixHit {
                num_blocks: 2,
                num_tokens: 8
            }
        );
        let (a, b) = (blocks(&kv, 1), blocks(&kv, 2));
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2], "the partial last block is private");
        assert!(kv.is_shared(a[0]) && kv.is_shared(a[1]) && !kv.is_shared(b[2]));
        assert_eq!(kv.ref_count(a[0]), Some(2));
        assert_eq!(kv.shared_prefix_len_tokens(SeqId(2)), Ok(8));
        let stats = kv.prefix_cache_stats();
        assert_eq!(
            (
                stats.requests,
                stats.query_tokens,
                stats.hit_tokens,
                stats.hit_blocks
            ),
            (2, 20, 8, 2)
        );
        assert!((stats.hit_rate() - 0.4).abs() < 1e-12);
        // Freeing one holder leaves the other's blocks in place.
        kv.free(SeqId(1)).unwrap();
        assert_eq!(kv.ref_count(a[0]), Some(1));
        kv.check_invariants().unwrap();
    }

    #[test]
    fn a_diverging_prompt_reuses_only_the_common_blocks() {
        let mut kv = cached(10);
        let a: Vec<u32> = (0..13).collect();
        let mut b = a.clone();
        b[5] = 99; // inside block 1
        run_prompt(&mut kv, 1, &a);
        assert_eq!(run_prompt(&mut kv, 2, &b).num_blocks, 1);
        // Same tokens as block 2 of `a` at the same place, different parent:
        // the chain broke at block 1, so nothing after it matches either.
        assert_ne!(blocks(&kv, 1)[2], blocks(&kv, 2)[2]);
    }

    #[test]
    fn freed_blocks_stay_cached_until_the_pool_needs_them() {
        let mut kv = cached(4);
        let prompt: Vec<u32> = (0..9).collect(); // 2 full blocks + 1
        run_prompt(&mut kv, 1, &prompt);
        let held = blocks(&kv, 1);
        kv.free(SeqId(1)).unwrap();
        assert_eq!(kv.block_counts().free_cached, 2);
        assert_eq!(kv.num_free_blocks(), 4);
        // One fresh block comes from the uncached ones; the prefix survives.
        kv.allocate_slots(SeqId(2), 4).unwrap();
        assert_eq!(kv.num_cached_blocks(), 2);
        kv.allocate_slots(SeqId(2), 4).unwrap();
        assert_eq!(kv.prefix_cache_stats().evicted_blocks, 0);
        // The next block must evict: the chain's deeper block goes first
        // (freed first, since `free` releases the tail first).
        kv.allocate_slots(SeqId(2), 4).unwrap();
        assert_eq!(kv.prefix_cache_stats().evicted_blocks, 1);
        assert!(kv.block_hash(held[0]).is_some());
        assert_eq!(kv.block_hash(held[1]), None);
        assert_eq!(blocks(&kv, 2)[2], held[1]);
        // Block 0 is still a hit for the same prompt.
        kv.free(SeqId(2)).unwrap();
        assert_eq!(run_prompt(&mut kv, 3, &prompt).num_blocks, 1);
        assert_eq!(blocks(&kv, 3)[0], held[0]);
    }

    #[test]
    fn taking_back_a_cached_free_block_uses_free_capacity() {
        let mut kv = cached(3);
        let prompt: Vec<u32> = (0..9).collect();
        run_prompt(&mut kv, 1, &prompt);
        kv.free(SeqId(1)).unwrap();
        kv.allocate_slots(SeqId(9), 4).unwrap(); // 2 cached free blocks left
        let hashes = reusable(&prompt);
        assert_eq!(kv.find_cached_prefix(&hashes).num_tokens, 8);
        // 2 hits on the cached list + 1 fresh block: 3 of the 2 free.
        assert_eq!(kv.blocks_needed_with_prefix(&hashes, 9), 3);
        let before = kv.clone();
        let query = PrefixQuery {
            block_hashes: &hashes,
            query_len_tokens: 9,
        };
        assert_eq!(
            kv.allocate_with_prefix(SeqId(2), query, 9),
            Err(KvError::OutOfBlocks { needed: 3, free: 2 })
        );
        assert_eq!(kv.prefix_cache_stats(), before.prefix_cache_stats());
        assert!(!kv.contains(SeqId(2)));
        assert_eq!(kv.block_counts(), before.block_counts());
        // 8 tokens fit the two hit blocks exactly.
        assert_eq!(
            kv.allocate_with_prefix(SeqId(2), query, 8)
                .unwrap()
                .num_blocks,
            2
        );
        assert_eq!(kv.num_free_blocks(), 0);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn a_block_computed_twice_side_by_side_stays_private() {
        let mut kv = cached(6);
        let prompt: Vec<u32> = (0..5).collect();
        let hashes = reusable(&prompt);
        let query = PrefixQuery {
            block_hashes: &hashes,
            query_len_tokens: 5,
        };
        // Both miss (neither has registered yet), then both register.
        kv.allocate_with_prefix(SeqId(1), query, 5).unwrap();
        kv.allocate_with_prefix(SeqId(2), query, 5).unwrap();
        let written = hasher().full_block_hashes(&prompt);
        assert_eq!(kv.register_full_blocks(SeqId(1), &written), Ok(1));
        assert_eq!(kv.register_full_blocks(SeqId(2), &written), Ok(0));
        assert_eq!(kv.register_full_blocks(SeqId(1), &written), Ok(0));
        let dup = blocks(&kv, 2)[0];
        assert_eq!(kv.block_hash(dup), None);
        kv.free(SeqId(2)).unwrap();
        assert_eq!(kv.block_counts().free_cached, 0, "the copy is not cached");
        kv.check_invariants().unwrap();
    }

    #[test]
    fn registering_unheld_blocks_or_a_live_sequence_twice_is_refused() {
        let mut kv = cached(4);
        let prompt: Vec<u32> = (0..6).collect();
        let hashes = hasher().full_block_hashes(&(0..8).collect::<Vec<u32>>());
        let query = PrefixQuery {
            block_hashes: &[],
            query_len_tokens: 6,
        };
        kv.allocate_with_prefix(SeqId(1), query, prompt.len())
            .unwrap();
        assert!(matches!(
            kv.register_full_blocks(SeqId(1), &hashes),
            Err(KvError::InvalidRange {
                end: 8,
                physical_len_tokens: 6,
                ..
            })
        ));
        assert_eq!(
            kv.register_full_blocks(SeqId(5), &hashes[..1]),
            Err(KvError::UnknownSequence(SeqId(5)))
        );
        assert_eq!(
            kv.allocate_with_prefix(SeqId(1), query, 1),
            Err(KvError::SequenceExists(SeqId(1)))
        );
        kv.check_invariants().unwrap();
    }

    #[test]
    fn a_compaction_never_rewrites_a_shared_block() {
        let mut kv = cached(12);
        let prompt: Vec<u32> = (0..13).collect(); // 3 full blocks + 1
        run_prompt(&mut kv, 1, &prompt);
        run_prompt(&mut kv, 2, &prompt);
        kv.allocate_slots(SeqId(2), 8).unwrap(); // 21 tokens: blocks 0-2 shared
        let written = hasher().full_block_hashes(&(0..21).collect::<Vec<u32>>());
        kv.register_full_blocks(SeqId(2), &written[..5]).unwrap();
        assert_eq!(kv.shared_prefix_len_tokens(SeqId(2)), Ok(12));
        let b2 = blocks(&kv, 2);
        // Rewriting from inside the shared prefix is refused, changing nothing.
        let before = kv.clone();
        assert_eq!(
            kv.prepare_rewrite(SeqId(2), 11),
            Err(KvError::SharedBlockRewrite {
                seq: SeqId(2),
                block: b2[2]
            })
        );
        assert_eq!(kv.table(SeqId(2)), before.table(SeqId(2)));
        assert_eq!(kv.num_cached_blocks(), before.num_cached_blocks());
        // From the end of it: the private registered blocks 3, 4 lose their hash.
        assert_eq!(kv.prepare_rewrite(SeqId(2), 14), Ok(2));
        assert_eq!(kv.block_hash(b2[3]), None);
        assert_eq!(kv.table(SeqId(2)).unwrap().num_hashed_blocks(), 3);
        assert!(kv.table(SeqId(2)).unwrap().is_compacted());
        assert_eq!(kv.shrink_physical(SeqId(2), 17), Ok(1));
        kv.check_invariants().unwrap();
        // The shared blocks are intact and still registered.
        for b in &b2[..3] {
            assert!(kv.is_shared(*b) && kv.block_hash(*b).is_some());
        }
        // A compacted sequence registers nothing more.
        assert_eq!(kv.register_full_blocks(SeqId(2), &written), Ok(0));
    }

    #[test]
    fn an_unannounced_compaction_of_shared_blocks_is_refused() {
        let mut kv = cached(8);
        let prompt: Vec<u32> = (0..9).collect();
        run_prompt(&mut kv, 1, &prompt);
        run_prompt(&mut kv, 2, &prompt);
        let before = kv.clone();
        let shared = blocks(&kv, 2)[0];
        assert_eq!(
            kv.shrink_physical(SeqId(2), 6),
            Err(KvError::SharedBlockRewrite {
                seq: SeqId(2),
                block: shared
            })
        );
        assert_eq!(kv.table(SeqId(2)), before.table(SeqId(2)));
        // Sequence 1 alone holds its blocks after 2 leaves: shrinking it
        // unregisters the kept ones, the dropped one stays cached.
        kv.free(SeqId(2)).unwrap();
        let b1 = blocks(&kv, 1);
        assert_eq!(kv.shrink_physical(SeqId(1), 3), Ok(2));
        assert_eq!(kv.block_hash(b1[0]), None);
        assert!(kv.block_hash(b1[1]).is_some());
        assert_eq!(kv.block_counts().free_cached, 1);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn truncating_into_a_shared_block_is_refused() {
        // Cutting the physical length inside a shared block would let the
        // next append write into it.
        let mut kv = cached(8);
        let prompt: Vec<u32> = (0..9).collect();
        run_prompt(&mut kv, 1, &prompt);
        run_prompt(&mut kv, 2, &prompt);
        kv.prepare_rewrite(SeqId(2), 8).unwrap();
        let shared = blocks(&kv, 2)[1];
        assert_eq!(
            kv.shrink_physical(SeqId(2), 6),
            Err(KvError::SharedBlockRewrite {
                seq: SeqId(2),
                block: shared
            })
        );
        // At a block boundary it is fine: both shared blocks are kept whole.
        assert_eq!(kv.shrink_physical(SeqId(2), 8), Ok(1));
        kv.check_invariants().unwrap();
    }

    #[test]
    fn with_caching_off_the_manager_behaves_as_before() {
        // One script, run on a plain manager with the plain calls and on a
        // cache-off manager with the prefix calls: same blocks, same order.
        let mut plain = KvCacheManager::new(6, BS).unwrap();
        let mut off = KvCacheManager::with_config(KvCacheConfig {
            num_blocks: 6,
            block_size_tokens: BS,
            enable_prefix_caching: false,
        })
        .unwrap();
        assert!(!off.prefix_caching_enabled());
        let prompt: Vec<u32> = (0..10).collect();
        let hashes = hasher().full_block_hashes(&prompt);
        for seq in [1, 2] {
            plain.allocate_slots(SeqId(seq), 10).unwrap();
            let query = PrefixQuery {
                block_hashes: &hashes,
                query_len_tokens: 10,
            };
            assert_eq!(off.find_cached_prefix(&hashes), PrefixHit::default());
            assert_eq!(off.blocks_needed_with_prefix(&hashes, 10), 3);
            assert_eq!(
                off.allocate_with_prefix(SeqId(seq), query, 10),
                Ok(PrefixHit::default())
            );
            assert_eq!(off.register_full_blocks(SeqId(seq), &hashes[..2]), Ok(0));
        }
        plain.free(SeqId(1)).unwrap();
        off.free(SeqId(1)).unwrap();
        plain.allocate_slots(SeqId(3), 5).unwrap();
        let query = PrefixQuery {
            block_hashes: &hashes,
            query_len_tokens: 10,
        };
        assert_eq!(
            off.allocate_with_prefix(SeqId(3), query, 5),
            Ok(PrefixHit::default())
        );
        assert_eq!(plain.shrink_physical(SeqId(2), 3), Ok(2));
        assert_eq!(off.prepare_rewrite(SeqId(2), 0), Ok(0));
        assert_eq!(off.shrink_physical(SeqId(2), 3), Ok(2));
        for seq in [2, 3] {
            assert_eq!(plain.table(SeqId(seq)), off.table(SeqId(seq)));
        }
        assert_eq!(plain.block_counts(), off.block_counts());
        assert_eq!(off.num_cached_blocks(), 0);
        assert_eq!(off.prefix_cache_stats(), PrefixCacheStats::default());
        off.check_invariants().unwrap();
        // And the blocks come back in the same order.
        plain.allocate_slots(SeqId(4), 8).unwrap();
        off.allocate_slots(SeqId(4), 8).unwrap();
        assert_eq!(plain.table(SeqId(4)), off.table(SeqId(4)));
    }
}
