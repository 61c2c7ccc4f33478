//! `KvCacheManager`: the one owner of the block pool and of every sequence's
//! block table. All ref-count changes go through it, so tables and pool
//! cannot disagree. The prefix-cache operations are in [`prefix`].

use std::collections::HashMap;
use std::ops::Range;

use crate::block_hash::BlockHash;
use crate::block_pool::{BlockCounts, BlockPool};
use crate::block_table::BlockTable;
use crate::error::KvError;
use crate::ids::{BlockId, SeqId};

mod compacted;
mod fork;
mod groups;
mod prefix;

pub use compacted::CompactedPrefixQuery;
pub use prefix::{PrefixCacheStats, PrefixHit, PrefixQuery};

/// How a [`KvCacheManager`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// Automatic prefix caching: full blocks are registered by content hash
    /// and reused by later sequences with the same prefix. Off, the manager
    /// behaves exactly as one without a prefix cache: nothing is registered,
    /// nothing is found, freed blocks go straight back to the free list.
    pub enable_prefix_caching: bool,
}

/// Block pool plus the block tables of all live sequences.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pool: BlockPool,
    tables: HashMap<SeqId, BlockTable>,
    block_size_tokens: usize,
    prefix_caching: bool,
    stats: PrefixCacheStats,
    /// Block tables of cache groups beyond the first ([`crate::CacheGroups`]).
    groups: groups::GroupTables,
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks of `block_size_tokens` slots each,
    /// with prefix caching off (see [`Self::with_config`]).
    ///
    /// Fails with [`KvError::InvalidConfig`] for a zero block size, or when
    /// the flat slot index (`num_blocks * block_size_tokens`) would not fit
    /// in the `u32` slot mapping handed to kernels.
    pub fn new(num_blocks: usize, block_size_tokens: usize) -> Result<Self, KvError> {
        Self::with_config(KvCacheConfig {
            num_blocks,
            block_size_tokens,
            enable_prefix_caching: false,
        })
    }

    /// A manager set up by `config`; fails as [`Self::new`] does.
    pub fn with_config(config: KvCacheConfig) -> Result<Self, KvError> {
        let KvCacheConfig {
            num_blocks,
            block_size_tokens,
            enable_prefix_caching,
        } = config;
        if block_size_tokens == 0 {
            return Err(KvError::InvalidConfig(
                "block size must be > 0 tokens".into(),
            ));
        }
        let num_slots = num_blocks.checked_mul(block_size_tokens);
        // Block ids stay below `BlockId::RELEASED`.
        if num_blocks >= u32::MAX as usize || num_slots.is_none_or(|n| n > u32::MAX as usize + 1) {
            return Err(KvError::InvalidConfig(format!(
                "{num_blocks} blocks of {block_size_tokens} tokens exceed the u32 slot index range"
            )));
        }
        Ok(Self {
            pool: BlockPool::new(num_blocks)?,
            tables: HashMap::new(),
            block_size_tokens,
            prefix_caching: enable_prefix_caching,
            stats: PrefixCacheStats::default(),
            groups: groups::GroupTables::default(),
        })
    }

    /// Token slots per block.
    pub fn block_size_tokens(&self) -> usize {
        self.block_size_tokens
    }

    /// Blocks an allocation can take: free ones, including cached free
    /// blocks (evicted on demand).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// Free uncached, free cached and used blocks; they add up to the pool.
    pub fn block_counts(&self) -> BlockCounts {
        self.pool.counts()
    }

    /// Holders of `block` (0 when free), or `None` for an id outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.pool.ref_count(block)
    }

    /// Whether more than one sequence holds `block`.
    ///
    /// **Invariant:** a shared block is never written in place — not by
    /// compaction, not by appends — since its other holders read it; only
    /// full, registered blocks are ever shared, and a sequence writes only
    /// its private tail. Eviction must keep its rewrites past
    /// [`Self::shared_prefix_len_tokens`] and announce them with
    /// [`Self::prepare_rewrite`], which refuses shared blocks.
    pub fn is_shared(&self, block: BlockId) -> bool {
        self.pool.is_shared(block)
    }

    /// The hash `block` is registered under in the prefix cache, if any.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.pool.block_hash(block)
    }

    /// Every registered (hash, block) pair, free or used, in no order.
    pub fn cached_blocks(&self) -> impl Iterator<Item = (BlockHash, BlockId)> + '_ {
        self.pool.cached_blocks()
    }

    /// Blocks in the pool.
    pub fn num_total_blocks(&self) -> usize {
        self.pool.num_total_blocks()
    }

    /// Fraction of blocks in use, in `0.0..=1.0` (0 for an empty pool).
    pub fn usage(&self) -> f64 {
        let total = self.num_total_blocks();
        if total == 0 {
            return 0.0;
        }
        (total - self.num_free_blocks()) as f64 / total as f64
    }

    /// Whether `seq` holds a block table.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.tables.contains_key(&seq)
    }

    /// The block table of `seq`, if it has one.
    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq)
    }

    /// Sequences holding a table, in no particular order.
    pub fn seq_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.tables.keys().copied()
    }

    /// Blocks `seq` must still get so that `num_new_tokens` more tokens fit, over every cache
    /// group's table. An unknown sequence counts as empty (fresh) tables.
    pub fn blocks_needed(&self, seq: SeqId, num_new_tokens: usize) -> usize {
        let main = match self.tables.get(&seq) {
            Some(table) => table.blocks_needed(num_new_tokens),
            None => num_new_tokens.div_ceil(self.block_size_tokens),
        };
        main + self.extra_blocks_needed(seq, num_new_tokens)
    }

    /// Grows `seq`'s table (creating it if new) so that `num_new_tokens` more
    /// tokens fit, and advances both its logical and physical lengths.
    ///
    /// All or nothing: on [`KvError::OutOfBlocks`] no block is taken and no
    /// table is created or changed.
    pub fn allocate_slots(&mut self, seq: SeqId, num_new_tokens: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(seq, num_new_tokens);
        let mut new_blocks = self.pool.allocate_n(needed)?;
        let table = self
            .tables
            .entry(seq)
            .or_insert_with(|| BlockTable::new(seq, self.block_size_tokens));
        let extra = new_blocks.split_off(table.blocks_needed(num_new_tokens));
        table.grow(new_blocks, num_new_tokens);
        self.grow_extra(seq, num_new_tokens, extra);
        Ok(())
    }

    /// Flat slot indices (into the cache's token-slot axis) of `physical_range`
    /// of `seq`, e.g. the slots the runner writes the new tokens' K/V into.
    pub fn slot_mapping(
        &self,
        seq: SeqId,
        physical_range: Range<usize>,
    ) -> Result<Vec<u32>, KvError> {
        self.table_of(seq)?.slot_mapping(physical_range)
    }

    /// Like [`Self::slot_mapping`], appending to `out` to reuse a buffer.
    pub fn write_slot_mapping(
        &self,
        seq: SeqId,
        physical_range: Range<usize>,
        out: &mut Vec<u32>,
    ) -> Result<(), KvError> {
        self.table_of(seq)?.write_slot_mapping(physical_range, out)
    }

    /// Drops `seq`'s table and releases its blocks, last block first (so a
    /// prefix stays cached longest). Returns the blocks the table gave up; a
    /// shared block returns to the pool only when its last holder lets go,
    /// and a registered one then waits on the cached list.
    pub fn free(&mut self, seq: SeqId) -> Result<usize, KvError> {
        let table = self
            .tables
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let mut blocks = self.take_extra_blocks(seq);
        blocks.extend(table.into_blocks_reversed());
        self.release(blocks)
    }

    /// Sliding-window release: gives back `seq`'s leading blocks that hold
    /// only slots below `first_needed_token` (no layer of a model whose
    /// every layer is windowed reads them again); their table entries
    /// become [`BlockId::RELEASED`] and the lengths are unchanged. Returns
    /// how many blocks were given back (a registered block waits on the
    /// cached list, a shared one stays with its other holders).
    ///
    /// Refused for a compacted table ([`KvError::InvalidRange`]): its slot
    /// index is no longer a position, so a window over slots would be wrong.
    pub fn release_before(
        &mut self,
        seq: SeqId,
        first_needed_token: usize,
    ) -> Result<usize, KvError> {
        let bs = self.block_size_tokens;
        let table = table_mut(&mut self.tables, seq)?;
        if table.is_compacted() {
            return Err(table.range_error(first_needed_token));
        }
        let released = table.release_leading(first_needed_token / bs);
        self.release(released)
    }

    /// Token-eviction compaction: after the caller moved the survivors to the
    /// front, keeps only `new_physical_len_tokens` slots of `seq` and returns
    /// the tail blocks beyond `ceil(new / block_size)` to the pool. The
    /// logical length (RoPE position) is untouched. Returns the blocks the
    /// table gave up (as [`Self::free`] counts them).
    ///
    /// Growing is not allowed here: `new_physical_len_tokens` above the
    /// current physical length is [`KvError::InvalidRange`].
    ///
    /// With prefix caching on, the slots from the one announced by
    /// [`Self::prepare_rewrite`] (slot 0 when none was) up to the new length
    /// count as rewritten, and the kept partial block as about to be written
    /// by appends: their blocks lose their registration, and if one of them
    /// is shared this fails with [`KvError::SharedBlockRewrite`], changing
    /// nothing. Dropped blocks keep theirs (compaction writes only below the
    /// new length) and wait on the cached list.
    pub fn shrink_physical(
        &mut self,
        seq: SeqId,
        new_physical_len_tokens: usize,
    ) -> Result<usize, KvError> {
        let bs = self.block_size_tokens;
        if self.groups.num_extra() > 0 {
            return Err(KvError::InvalidConfig(
                "compaction is not built for a cache of several block-table groups (a hybrid \
                 sliding-window model)"
                    .into(),
            ));
        }
        let table = table_mut(&mut self.tables, seq)?;
        if new_physical_len_tokens > table.physical_len_tokens() {
            return Err(table.range_error(new_physical_len_tokens));
        }
        if self.prefix_caching {
            let from_tokens = table
                .pending_rewrite_from_tokens()
                .unwrap_or(0)
                .min(new_physical_len_tokens);
            let written = from_tokens / bs..new_physical_len_tokens.div_ceil(bs);
            prefix::unregister_private(&mut self.pool, table, written)?;
        }
        table.end_rewrite();
        let dropped = table.shrink_physical(new_physical_len_tokens);
        self.release(dropped)
    }

    /// Checks the pool, and that tables and pool agree: each held block's ref
    /// count equals the number of tables holding it, each table has exactly
    /// `ceil(physical / block_size)` blocks and `physical <= logical`, and
    /// free + distinct held blocks == total. For the prefix cache: only a
    /// table's hashed prefix carries hashes, a shared block is registered
    /// and sits at the same index in every table holding it, and with
    /// caching off nothing is registered at all.
    pub fn check_invariants(&self) -> Result<(), KvError> {
        self.pool.check_invariants()?;
        let fail = |msg: String| Err(KvError::InvariantViolated(msg));
        if !self.prefix_caching && self.pool.num_cached_blocks() != 0 {
            return fail("prefix caching is off but blocks are registered".into());
        }
        let mut holders: HashMap<BlockId, u32> = HashMap::new();
        let mut index_of: HashMap<BlockId, usize> = HashMap::new();
        for (seq, table) in &self.tables {
            if table.seq() != *seq {
                return fail(format!("table of {} is filed under {seq}", table.seq()));
            }
            if table.physical_len_tokens() > table.logical_len_tokens() {
                return fail(format!(
                    "{seq}: physical length {} > logical length {}",
                    table.physical_len_tokens(),
                    table.logical_len_tokens()
                ));
            }
            let want = table.physical_len_tokens().div_ceil(self.block_size_tokens);
            if table.block_ids().len() != want {
                return fail(format!(
                    "{seq}: holds {} blocks for {} tokens, want {want}",
                    table.block_ids().len(),
                    table.physical_len_tokens()
                ));
            }
            let hashed = table.num_hashed_blocks();
            if hashed > table.physical_len_tokens() / self.block_size_tokens {
                return fail(format!(
                    "{seq}: {hashed} hashed blocks but {} physical tokens",
                    table.physical_len_tokens()
                ));
            }
            let released = table.num_released_blocks();
            if table.block_ids()[..released]
                .iter()
                .any(|b| *b != BlockId::RELEASED)
                || table.held_block_ids().contains(&BlockId::RELEASED)
            {
                return fail(format!(
                    "{seq}: released entries are not exactly the first {released}"
                ));
            }
            for (i, block) in (released..).zip(table.held_block_ids()) {
                *holders.entry(*block).or_default() += 1;
                if i >= hashed && self.pool.block_hash(*block).is_some() {
                    return fail(format!(
                        "{seq}: block {block} at {i}, past its {hashed} hashed blocks, is registered"
                    ));
                }
                if *index_of.entry(*block).or_insert(i) != i {
                    return fail(format!("block {block} is held at two different indices"));
                }
            }
        }
        self.check_extra_groups(&mut holders)?;
        for (block, count) in &holders {
            let ref_cnt = self.pool.ref_count(*block);
            if ref_cnt != Some(*count) {
                return fail(format!(
                    "block {block}: held by {count} tables, ref count {ref_cnt:?}"
                ));
            }
            if *count > 1 && self.pool.block_hash(*block).is_none() {
                return fail(format!("block {block} is shared but not registered"));
            }
        }
        let total = self.num_total_blocks();
        if self.num_free_blocks() + holders.len() != total {
            return fail(format!(
                "{} free + {} held != {total} total (leak)",
                self.num_free_blocks(),
                holders.len()
            ));
        }
        Ok(())
    }

    fn table_of(&self, seq: SeqId) -> Result<&BlockTable, KvError> {
        self.tables.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    /// Frees `blocks` in the given order; returns how many.
    fn release(&mut self, blocks: Vec<BlockId>) -> Result<usize, KvError> {
        let n = blocks.len();
        for block in blocks {
            self.pool.free(block)?;
        }
        Ok(n)
    }
}

/// `seq`'s table in `tables`: a free function, so that the borrow is of the map alone and the
/// caller may touch the pool while it holds the table.
pub(super) fn table_mut(
    tables: &mut HashMap<SeqId, BlockTable>,
    seq: SeqId,
) -> Result<&mut BlockTable, KvError> {
    tables.get_mut(&seq).ok_or(KvError::UnknownSequence(seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_grows_both_lengths_and_maps_slots() {
        let mut kv = KvCacheManager::new(8, 4).unwrap();
        let s = SeqId(1);
        assert_eq!(kv.blocks_needed(s, 5), 2);
        kv.allocate_slots(s, 5).unwrap();
        assert_eq!(kv.blocks_needed(s, 3), 0);
        kv.allocate_slots(s, 3).unwrap();
        kv.allocate_slots(s, 1).unwrap();
        let t = kv.table(s).unwrap();
        assert_eq!((t.logical_len_tokens(), t.physical_len_tokens()), (9, 9));
        assert_eq!(t.block_ids(), &[BlockId(0), BlockId(1), BlockId(2)]);
        assert_eq!(kv.slot_mapping(s, 3..9).unwrap(), vec![3, 4, 5, 6, 7, 8]);
        assert_eq!(kv.num_free_blocks(), 5);
        assert!((kv.usage() - 3.0 / 8.0).abs() < 1e-12);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut kv = KvCacheManager::new(2, 4).unwrap();
        kv.allocate_slots(SeqId(1), 6).unwrap();
        assert_eq!(
            kv.allocate_slots(SeqId(2), 1),
            Err(KvError::OutOfBlocks { needed: 1, free: 0 })
        );
        assert!(!kv.contains(SeqId(2)));
        assert_eq!(
            kv.allocate_slots(SeqId(1), 3),
            Err(KvError::OutOfBlocks { needed: 1, free: 0 })
        );
        assert_eq!(kv.table(SeqId(1)).unwrap().logical_len_tokens(), 6);
        // Fits the partial last block: no new block needed.
        kv.allocate_slots(SeqId(1), 2).unwrap();
        kv.check_invariants().unwrap();
    }

    #[test]
    fn free_returns_blocks_last_first() {
        let mut kv = KvCacheManager::new(3, 2).unwrap();
        kv.allocate_slots(SeqId(1), 6).unwrap();
        assert_eq!(kv.free(SeqId(1)), Ok(3));
        assert_eq!(kv.free(SeqId(1)), Err(KvError::UnknownSequence(SeqId(1))));
        // Reuse order follows free order: tail block 2 comes back first.
        kv.allocate_slots(SeqId(2), 2).unwrap();
        assert_eq!(kv.table(SeqId(2)).unwrap().block_ids(), &[BlockId(2)]);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn shrink_physical_frees_tail_blocks_and_keeps_position() {
        let mut kv = KvCacheManager::new(4, 4).unwrap();
        let s = SeqId(3);
        kv.allocate_slots(s, 15).unwrap();
        assert_eq!(kv.shrink_physical(s, 6), Ok(2));
        assert_eq!(kv.shrink_physical(s, 6), Ok(0));
        assert!(kv.shrink_physical(s, 7).is_err());
        let t = kv.table(s).unwrap();
        assert_eq!((t.logical_len_tokens(), t.physical_len_tokens()), (15, 6));
        // New tokens continue the logical count and fill physical slots 6..
        kv.allocate_slots(s, 3).unwrap();
        let t = kv.table(s).unwrap();
        assert_eq!((t.logical_len_tokens(), t.physical_len_tokens()), (18, 9));
        assert_eq!(t.block_ids().len(), 3);
        kv.check_invariants().unwrap();
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(matches!(
            KvCacheManager::new(4, 0),
            Err(KvError::InvalidConfig(_))
        ));
        // 2 * 2^31 slots is exactly the u32 range; 3 * 2^31 is not.
        assert!(KvCacheManager::new(2, 1 << 31).is_ok());
        assert!(matches!(
            KvCacheManager::new(3, 1 << 31),
            Err(KvError::InvalidConfig(_))
        ));
    }
}
