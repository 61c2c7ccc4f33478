//! The [`KvCacheManager`] side of cache groups ([`crate::CacheGroups`]): one block table per
//! group and sequence, all drawn from the one pool. Group 0's table is the sequence's main one
//! ([`KvCacheManager::table`]); the others live here. Every group's table has the same
//! lengths; a windowed group's leading blocks are given back once its window has passed them.
//!
//! With more than one group, prefix caching and compaction are refused: a block would need a
//! hash per group, and compacted slots are no longer positions (a window over them is wrong).

use std::collections::HashMap;
use std::ops::Range;

use crate::block_table::BlockTable;
use crate::error::KvError;
use crate::groups::group_blocks_for_tokens;
use crate::ids::{BlockId, SeqId};

use super::KvCacheManager;

/// Groups beyond the main table.
#[derive(Debug, Clone)]
pub(super) struct GroupTables {
    /// Every group's window, group 0 first (one `None` entry: one full-attention group).
    pub(super) windows: Vec<Option<usize>>,
    /// Most tokens one step writes for a sequence (a prefill chunk): what a windowed group
    /// holds beyond its window until the step's release.
    pub(super) chunk_tokens: usize,
    /// Tables of groups `1..` per sequence.
    pub(super) extra: HashMap<SeqId, Vec<BlockTable>>,
}

impl Default for GroupTables {
    fn default() -> Self {
        Self {
            windows: vec![None],
            chunk_tokens: 0,
            extra: HashMap::new(),
        }
    }
}

impl GroupTables {
    pub(super) fn num_extra(&self) -> usize {
        self.windows.len() - 1
    }
}

impl KvCacheManager {
    /// Sets the cache groups (each one's window, group 0 first; see [`crate::CacheGroups`])
    /// and the most tokens one step writes per sequence (`chunk_tokens`). Only before any
    /// sequence holds a table; more than one group refuses prefix caching.
    pub fn set_cache_groups(
        &mut self,
        windows: Vec<Option<usize>>,
        chunk_tokens: usize,
    ) -> Result<(), KvError> {
        if windows.is_empty() || windows.contains(&Some(0)) {
            return Err(KvError::InvalidConfig(format!(
                "cache groups {windows:?}: at least one, no window of 0 tokens"
            )));
        }
        if !self.tables.is_empty() {
            return Err(KvError::InvalidConfig(
                "cache groups are set before any sequence holds blocks".into(),
            ));
        }
        if windows.len() > 1 && self.prefix_caching {
            return Err(KvError::InvalidConfig(format!(
                "prefix caching is not built for a cache of {} block-table groups (a hybrid \
                 sliding-window model)",
                windows.len()
            )));
        }
        self.groups = GroupTables {
            windows,
            chunk_tokens,
            extra: HashMap::new(),
        };
        Ok(())
    }

    /// Block tables per sequence (1 unless the model mixes attention kinds).
    pub fn num_cache_groups(&self) -> usize {
        self.groups.windows.len()
    }

    /// `seq`'s table of cache group `group` (group 0: [`Self::table`]).
    pub fn group_table(&self, seq: SeqId, group: usize) -> Option<&BlockTable> {
        match group {
            0 => self.tables.get(&seq),
            g => self.groups.extra.get(&seq).and_then(|t| t.get(g - 1)),
        }
    }

    /// [`Self::write_slot_mapping`] in cache group `group`'s table.
    pub fn write_group_slot_mapping(
        &self,
        seq: SeqId,
        group: usize,
        physical_range: Range<usize>,
        out: &mut Vec<u32>,
    ) -> Result<(), KvError> {
        self.group_table(seq, group)
            .ok_or(KvError::UnknownSequence(seq))?
            .write_slot_mapping(physical_range, out)
    }

    /// Blocks `seq` holds over all its groups' tables (released entries not counted).
    pub fn held_blocks(&self, seq: SeqId) -> usize {
        (0..self.num_cache_groups())
            .filter_map(|g| self.group_table(seq, g))
            .map(|t| t.held_block_ids().len())
            .sum()
    }

    /// Blocks a sequence of `tokens` holds at most over all groups: every slot in a
    /// full-attention group, a window plus a block and a step's chunk in a windowed one
    /// ([`group_held_tokens`]). With one full group, `ceil(tokens / block_size)`.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        group_blocks_for_tokens(
            &self.groups.windows,
            self.block_size_tokens,
            tokens,
            self.groups.chunk_tokens,
        )
    }

    /// The longest sequence the whole pool holds on its own ([`Self::blocks_for_tokens`] of
    /// it fits every block); `usize::MAX` when every group is windowed and one window fits.
    pub fn max_tokens_one_seq(&self) -> usize {
        let total = self.num_total_blocks();
        let top = total.saturating_mul(self.block_size_tokens);
        if self.groups.windows.iter().all(Option::is_some)
            && self.blocks_for_tokens(usize::MAX / 2) <= total
        {
            return usize::MAX;
        }
        // Monotone in tokens: the largest count that fits, by bisection over 0..=top.
        let (mut lo, mut hi) = (0usize, top);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.blocks_for_tokens(mid) <= total {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Sliding-window release in every windowed group of `seq`: gives back the leading blocks
    /// the next query's window (slots `n + 1 - window ..= n` of `n`) no longer reaches. Returns
    /// the blocks given back. Refused for a compacted table, as [`Self::release_before`].
    pub fn release_behind_windows(&mut self, seq: SeqId) -> Result<usize, KvError> {
        let mut released = 0;
        for g in 0..self.groups.windows.len() {
            let Some(w) = self.groups.windows[g] else {
                continue;
            };
            let first_needed = {
                let table = self
                    .group_table(seq, g)
                    .ok_or(KvError::UnknownSequence(seq))?;
                (table.physical_len_tokens() + 1).saturating_sub(w)
            };
            released += if g == 0 {
                self.release_before(seq, first_needed)?
            } else {
                let bs = self.block_size_tokens;
                let table = self
                    .groups
                    .extra
                    .get_mut(&seq)
                    .and_then(|t| t.get_mut(g - 1))
                    .ok_or(KvError::UnknownSequence(seq))?;
                let blocks = table.release_leading(first_needed / bs);
                self.release(blocks)?
            };
        }
        Ok(released)
    }

    /// Blocks groups `1..` of `seq` must still get so that `num_new_tokens` more tokens fit.
    pub(super) fn extra_blocks_needed(&self, seq: SeqId, num_new_tokens: usize) -> usize {
        match self.groups.extra.get(&seq) {
            Some(tables) => tables.iter().map(|t| t.blocks_needed(num_new_tokens)).sum(),
            None => self.groups.num_extra() * num_new_tokens.div_ceil(self.block_size_tokens),
        }
    }

    /// Grows groups `1..` of `seq` by `num_new_tokens` from `blocks` (exactly
    /// [`Self::extra_blocks_needed`] of them, in group order).
    pub(super) fn grow_extra(&mut self, seq: SeqId, num_new_tokens: usize, blocks: Vec<BlockId>) {
        let (n, bs) = (self.groups.num_extra(), self.block_size_tokens);
        if n == 0 {
            return;
        }
        let tables = self
            .groups
            .extra
            .entry(seq)
            .or_insert_with(|| (0..n).map(|_| BlockTable::new(seq, bs)).collect());
        let mut blocks = blocks.into_iter();
        for table in tables {
            let take = table.blocks_needed(num_new_tokens);
            table.grow(blocks.by_ref().take(take).collect(), num_new_tokens);
        }
    }

    /// Removes groups `1..` of `seq`, returning their held blocks last first.
    pub(super) fn take_extra_blocks(&mut self, seq: SeqId) -> Vec<BlockId> {
        self.groups
            .extra
            .remove(&seq)
            .into_iter()
            .flatten()
            .rev()
            .flat_map(BlockTable::into_blocks_reversed)
            .collect()
    }

    /// Checks groups `1..`: each table belongs to a main table, has its lengths and
    /// `ceil(physical / block_size)` entries; counts the blocks each holds into `holders`.
    pub(super) fn check_extra_groups(
        &self,
        holders: &mut HashMap<BlockId, u32>,
    ) -> Result<(), KvError> {
        let fail = |msg: String| Err(KvError::InvariantViolated(msg));
        for (seq, tables) in &self.groups.extra {
            let Some(main) = self.tables.get(seq) else {
                return fail(format!("{seq}: group tables without a main table"));
            };
            if tables.len() != self.groups.num_extra() {
                return fail(format!("{seq}: {} group tables", tables.len()));
            }
            for t in tables {
                let lens = (t.logical_len_tokens(), t.physical_len_tokens());
                if lens != (main.logical_len_tokens(), main.physical_len_tokens())
                    || t.block_ids().len() != lens.1.div_ceil(self.block_size_tokens)
                {
                    return fail(format!("{seq}: a group table disagrees with the main one"));
                }
                for block in t.held_block_ids() {
                    *holders.entry(*block).or_default() += 1;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{BlockId, KvCacheManager, KvError, SeqId};

    /// One full group and two windowed ones (window 4), blocks of 2 tokens, chunks of 4.
    fn hybrid(num_blocks: usize) -> KvCacheManager {
        let mut kv = KvCacheManager::new(num_blocks, 2).unwrap();
        kv.set_cache_groups(vec![None, Some(4), Some(4)], 4)
            .unwrap();
        kv
    }

    #[test]
    fn every_group_grows_and_windowed_ones_release_behind_their_window() {
        let mut kv = hybrid(32);
        let s = SeqId(1);
        assert_eq!(kv.blocks_needed(s, 4), 3 * 2);
        kv.allocate_slots(s, 4).unwrap();
        assert_eq!(kv.held_blocks(s), 6);
        for _ in 0..8 {
            kv.allocate_slots(s, 1).unwrap();
            kv.release_behind_windows(s).unwrap();
            kv.check_invariants().unwrap();
        }
        // 12 tokens: the full group holds 6 blocks; each windowed one the blocks that the
        // next query's window (slots 9..=12) reaches: slots 8.. = blocks 4 and 5.
        let full = kv.group_table(s, 0).unwrap();
        assert_eq!(full.held_block_ids().len(), 6);
        for g in 1..3 {
            let t = kv.group_table(s, g).unwrap();
            assert_eq!(t.physical_len_tokens(), 12);
            assert_eq!(t.num_released_blocks(), 4);
            assert_eq!(t.held_block_ids().len(), 2);
        }
        assert_eq!(kv.held_blocks(s), 6 + 2 * 2);
        assert_eq!(kv.num_free_blocks(), 32 - 10);
        let mut slots = Vec::new();
        kv.write_group_slot_mapping(s, 2, 11..12, &mut slots)
            .unwrap();
        let last = kv.group_table(s, 2).unwrap().block_ids()[5];
        assert_eq!(slots, vec![last.0 * 2 + 1]);
        assert_eq!(kv.free(s), Ok(10));
        assert_eq!(kv.num_free_blocks(), 32);
        assert!(kv.group_table(s, 1).is_none());
        kv.check_invariants().unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing_over_the_groups() {
        let mut kv = hybrid(5);
        assert_eq!(
            kv.allocate_slots(SeqId(1), 4),
            Err(KvError::OutOfBlocks { needed: 6, free: 5 })
        );
        assert!(!kv.contains(SeqId(1)));
        assert!(kv.group_table(SeqId(1), 1).is_none());
        kv.check_invariants().unwrap();
    }

    #[test]
    fn footprints_count_each_groups_peak() {
        let kv = hybrid(100);
        // 40 tokens: 20 blocks in the full group; a windowed group holds at most
        // 4 + 2 + 4 = 10 tokens = 5 blocks.
        assert_eq!(kv.blocks_for_tokens(40), 20 + 2 * 5);
        assert_eq!(kv.blocks_for_tokens(3), 3 * 2);
        // 100 blocks: 10 for the windowed groups leave 90 full blocks = 180 tokens.
        assert_eq!(kv.max_tokens_one_seq(), 180);
        let mut all_windowed = KvCacheManager::new(8, 2).unwrap();
        all_windowed.set_cache_groups(vec![Some(4)], 4).unwrap();
        assert_eq!(all_windowed.max_tokens_one_seq(), usize::MAX);
        let plain = KvCacheManager::new(8, 2).unwrap();
        assert_eq!(plain.blocks_for_tokens(5), 3);
        assert_eq!(plain.max_tokens_one_seq(), 16);
    }

    #[test]
    fn groups_are_set_up_front_and_refuse_the_prefix_cache_and_compaction() {
        let mut kv = KvCacheManager::new(8, 2).unwrap();
        kv.allocate_slots(SeqId(1), 1).unwrap();
        assert!(kv.set_cache_groups(vec![None, Some(2)], 2).is_err());
        let mut cached = KvCacheManager::with_config(crate::KvCacheConfig {
            num_blocks: 8,
            block_size_tokens: 2,
            enable_prefix_caching: true,
        })
        .unwrap();
        assert!(cached.set_cache_groups(vec![None, Some(2)], 2).is_err());
        assert!(cached.set_cache_groups(vec![None], 2).is_ok());
        let mut kv = hybrid(16);
        kv.allocate_slots(SeqId(2), 6).unwrap();
        assert!(kv.shrink_physical(SeqId(2), 2).is_err());
        assert_eq!(
            kv.group_table(SeqId(2), 1).map(|t| t.block_ids()[0]),
            Some(BlockId(3))
        );
    }
}
