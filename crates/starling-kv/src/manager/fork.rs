//! Copy-on-compact: the [`KvCacheManager`] operations that give a sequence
//! private copies of the cached or shared blocks a compaction will rewrite,
//! so the prefix cache keeps the originals (see the invariant in
//! [`super::prefix`]).

use crate::error::KvError;
use crate::ids::BlockId;
use crate::ids::SeqId;

use super::prefix::check_rewrite_start;
use super::KvCacheManager;

impl KvCacheManager {
    /// Blocks [`Self::fork_for_rewrite`] must take from the pool for a
    /// rewrite of `seq` from `first_rewritten_token` on: the *shared* ones
    /// from the block holding that slot to the end (other holders read
    /// them, so they are never written in place). Registered blocks only
    /// `seq` holds are copied only into uncached free blocks left over
    /// (see there), so they never make a fork fail. Stable between a
    /// step's plan and its compaction: sharing changes only at admission.
    /// 0 with caching off.
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
            .filter(|b| self.pool.is_shared(**b))
            .count())
    }

    /// Copy-on-compact: announces, like [`Self::prepare_rewrite`], that
    /// `seq`'s slots from `first_rewritten_token` on are about to be
    /// rewritten, but instead of refusing the shared blocks among them it
    /// gives `seq` a fresh private block in place of each, and does the
    /// same for the registered blocks only `seq` holds, earliest first, as
    /// long as *uncached* free blocks remain beyond the shared ones' copies.
    /// The caller copies every returned `(original, fresh)` pair's K/V in
    /// every layer (`Backend::copy_kv_blocks`) before the rewrite; the
    /// originals stay cached under their hashes, held by their other
    /// holders or waiting on the cached list, so later requests still find
    /// the prefix. The registered private blocks left without a copy (the
    /// pool is short: keeping them would only evict other cached blocks)
    /// leave the cache, as with `prepare_rewrite`, and so do the registered
    /// blocks after the first of them (their chain is broken there). The
    /// originals are released last block first (the prefix stays cached
    /// longest). The table counts as compacted from now on.
    ///
    /// All or nothing: on [`KvError::OutOfBlocks`] (fewer free blocks than
    /// [`Self::blocks_to_fork`]) nothing changes. With caching off nothing
    /// is registered or shared, so this is `prepare_rewrite` and returns no
    /// pair. [`KvError::InvalidRange`] past the physical length.
    pub fn fork_for_rewrite(
        &mut self,
        seq: SeqId,
        first_rewritten_token: usize,
    ) -> Result<Vec<(BlockId, BlockId)>, KvError> {
        let bs = self.block_size_tokens;
        let table = self.tables.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        check_rewrite_start(table, first_rewritten_token)?;
        let from = (first_rewritten_token / bs).min(table.block_ids().len());
        let ids = &table.block_ids()[from..];
        let shared = ids.iter().filter(|b| self.pool.is_shared(**b)).count();
        let free = self.pool.num_free_blocks();
        if shared > free {
            return Err(KvError::OutOfBlocks {
                needed: shared,
                free,
            });
        }
        // Uncached free blocks beyond the shared copies: a private copy
        // taken from a cached free block would evict one cached block to
        // keep another.
        let mut spare = self.pool.counts().free_uncached.saturating_sub(shared);
        let mut chain_kept = true;
        let mut forked = Vec::new();
        let mut dropped = Vec::new();
        for (i, block) in (from..).zip(ids) {
            if self.pool.is_shared(*block) {
                forked.push(i);
            } else if self.pool.block_hash(*block).is_some() {
                if chain_kept && spare > 0 {
                    spare -= 1;
                    forked.push(i);
                } else {
                    chain_kept = false;
                    dropped.push(*block);
                }
            }
        }
        // The originals are held by `seq`, so allocating cannot evict them.
        let fresh = self.pool.allocate_n(forked.len())?;
        for block in dropped {
            self.pool.unregister(block)?;
        }
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
}
