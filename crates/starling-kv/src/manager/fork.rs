//! Copy-on-compact: the [`KvCacheManager`] operations that give a sequence
//! private copies of the cached or shared blocks a compaction will rewrite,
//! so the prefix cache keeps the originals (see the invariant in
//! [`super::prefix`]).

use crate::block_pool::BlockId;
use crate::block_table::SeqId;
use crate::error::KvError;

use super::prefix::check_rewrite_start;
use super::KvCacheManager;

impl KvCacheManager {
    /// Blocks [`Self::fork_for_rewrite`] would copy for a rewrite of `seq`
    /// from `first_rewritten_token` on: those from the block holding that
    /// slot to the end that are registered (cached under their hash) or
    /// shared. 0 with caching off.
    pub fn blocks_to_fork(
        &self,
        seq: SeqId,
        first_rewritten_token: usize,
    ) -> Result<usize, KvError> {
        let table = self.tables.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        if !self.prefix_caching {
            return Ok(0);
        }
        let from = (first_rewritten_token / self.block_size_tokens).min(table.block_ids().len());
        Ok(table.block_ids()[from..]
            .iter()
            .filter(|b| self.must_fork(**b))
            .count())
    }

    /// Copy-on-compact: announces, like [`Self::prepare_rewrite`], that
    /// `seq`'s slots from `first_rewritten_token` on are about to be
    /// rewritten, but instead of dropping the registration of the cached
    /// blocks among them (and refusing shared ones) it gives `seq` a fresh
    /// private block in place of each registered or shared one. The caller
    /// copies every returned `(original, fresh)` pair's K/V in every layer
    /// (`Backend::copy_kv_blocks`) before the rewrite; the originals stay
    /// cached under their hashes, held by their other holders or waiting on
    /// the cached list, so later requests still find the whole prefix and
    /// the compaction may evict over the sequence's whole context. The
    /// originals are released last block first (the prefix stays cached
    /// longest). The table counts as compacted from now on.
    ///
    /// All or nothing: on [`KvError::OutOfBlocks`] (needing
    /// [`Self::blocks_to_fork`] blocks) nothing changes. With caching off
    /// nothing is registered or shared, so this is `prepare_rewrite` and
    /// returns no pair. [`KvError::InvalidRange`] past the physical length.
    pub fn fork_for_rewrite(
        &mut self,
        seq: SeqId,
        first_rewritten_token: usize,
    ) -> Result<Vec<(BlockId, BlockId)>, KvError> {
        let bs = self.block_size_tokens;
        let table = self.tables.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        check_rewrite_start(table, first_rewritten_token)?;
        let from = (first_rewritten_token / bs).min(table.block_ids().len());
        let forked: Vec<usize> = (from..table.block_ids().len())
            .filter(|i| self.prefix_caching && self.must_fork(table.block_ids()[*i]))
            .collect();
        // The originals are held by `seq`, so allocating cannot evict them.
        let fresh = self.pool.allocate_n(forked.len())?;
        let table = self
            .tables
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let pairs: Vec<(BlockId, BlockId)> = forked
            .iter()
            .zip(fresh)
            .map(|(i, new)| (table.replace_block(*i, new), new))
            .collect();
        if table.num_hashed_blocks() > from {
            table.set_num_hashed_blocks(from);
        }
        table.begin_rewrite(first_rewritten_token);
        self.release(pairs.iter().rev().map(|(old, _)| *old).collect())?;
        Ok(pairs)
    }

    /// Whether a block about to be rewritten must be copied first: others
    /// read it, or later requests may find it under its hash.
    fn must_fork(&self, block: BlockId) -> bool {
        self.pool.is_shared(block) || self.pool.block_hash(block).is_some()
    }
}
