//! Per-sequence block tables: which blocks a sequence holds, and how many
//! tokens it has seen versus how many slots it actually keeps.
//!
//! Two lengths are kept apart on purpose:
//! - `logical_len_tokens`: tokens the model has seen. RoPE positions of new
//!   tokens keep counting from here, whatever was evicted.
//! - `physical_len_tokens`: token slots actually held in the cache. Token
//!   eviction compacts survivors to the front and shrinks this length.
//!
//! Without eviction the two are equal. Physical slot `i` lives at flat slot
//! index `block_ids[i / block_size] * block_size + i % block_size`.
//!
//! Invariant: `block_ids.len() == ceil(physical_len_tokens / block_size)`.
//!
//! A model whose every layer attends over a sliding window never reads the
//! slots its windows have moved past: those leading blocks are given back
//! (`num_released_blocks`) and their entries hold [`BlockId::RELEASED`], so
//! slot `i` keeps its address for the blocks still held.
//!
//! Prefix caching adds a third count, `num_hashed_blocks`: the leading full
//! blocks whose hash chain has been processed — blocks reused from the cache
//! plus blocks this sequence registered (or found registered already, by a
//! copy computed side by side). Only those can carry a hash; blocks after
//! them are private and writable. Once a sequence is compacted
//! (`is_compacted`), physical slot `i` no longer holds token `i` and later
//! tokens' K/V depend on what was evicted, so nothing more of it is
//! registered — unless the compaction was a pure function of the tokens
//! before it: registration then resumes under the compacted state's hashes
//! (see `block_hash`). A table may also start from such a cached state; its
//! logical length then runs ahead of its physical one from the start.

use std::ops::Range;

use crate::error::KvError;
use crate::ids::{BlockId, SeqId};

/// The blocks of one sequence, in order, and its two lengths.
///
/// Read-only outside the crate: only [`crate::KvCacheManager`] mutates it,
/// so that the pool's ref counts and the tables cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    seq: SeqId,
    block_ids: Vec<BlockId>,
    logical_len_tokens: usize,
    physical_len_tokens: usize,
    block_size_tokens: usize,
    num_hashed_blocks: usize,
    /// Leading entries given back under a sliding window ([`BlockId::RELEASED`]).
    num_released_blocks: usize,
    compacted: bool,
    /// First physical slot an announced compaction may rewrite
    /// ([`crate::KvCacheManager::prepare_rewrite`]), until `shrink_physical`.
    pending_rewrite_from_tokens: Option<usize>,
}

impl BlockTable {
    pub(crate) fn new(seq: SeqId, block_size_tokens: usize) -> Self {
        Self {
            seq,
            block_ids: Vec::new(),
            logical_len_tokens: 0,
            physical_len_tokens: 0,
            block_size_tokens,
            num_hashed_blocks: 0,
            num_released_blocks: 0,
            compacted: false,
            pending_rewrite_from_tokens: None,
        }
    }

    /// The sequence this table belongs to.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// One entry per block of the physical length, in token order: the
    /// first [`Self::num_released_blocks`] are [`BlockId::RELEASED`], the
    /// rest the blocks held.
    pub fn block_ids(&self) -> &[BlockId] {
        &self.block_ids
    }

    /// The blocks the table holds (the entries after the released ones).
    pub fn held_block_ids(&self) -> &[BlockId] {
        &self.block_ids[self.num_released_blocks..]
    }

    /// Leading blocks given back because no layer reads them again.
    pub fn num_released_blocks(&self) -> usize {
        self.num_released_blocks
    }

    /// Tokens the model has seen (next RoPE position).
    pub fn logical_len_tokens(&self) -> usize {
        self.logical_len_tokens
    }

    /// Token slots held in the cache.
    pub fn physical_len_tokens(&self) -> usize {
        self.physical_len_tokens
    }

    /// Token slots the held blocks offer (`blocks * block_size`).
    pub fn capacity_tokens(&self) -> usize {
        self.block_ids.len() * self.block_size_tokens
    }

    /// Tokens per block.
    pub fn block_size_tokens(&self) -> usize {
        self.block_size_tokens
    }

    /// Leading full blocks whose hash chain the prefix cache has processed
    /// (reused or registered). Blocks from here on are private to the
    /// sequence; a block before it may be shared and must not be rewritten
    /// without [`crate::KvCacheManager::prepare_rewrite`].
    pub fn num_hashed_blocks(&self) -> usize {
        self.num_hashed_blocks
    }

    /// Whether the sequence has been compacted (or a compaction has been
    /// announced) and registers nothing: its blocks no longer hold whole
    /// token blocks of its prompt (until registration resumes under a
    /// compacted state's chain).
    pub fn is_compacted(&self) -> bool {
        self.compacted
    }

    /// The error for a range of this table's slots ending at `end` that it cannot serve.
    pub(crate) fn range_error(&self, end: usize) -> KvError {
        KvError::InvalidRange {
            seq: self.seq,
            start: 0,
            end,
            physical_len_tokens: self.physical_len_tokens,
        }
    }

    /// Flat slot index of physical token `physical_index`, if it is held.
    pub fn slot(&self, physical_index: usize) -> Option<u32> {
        if physical_index >= self.physical_len_tokens {
            return None;
        }
        let block = self
            .block_ids
            .get(physical_index / self.block_size_tokens)?;
        let offset = physical_index % self.block_size_tokens;
        // Fits: the manager refuses pools whose slot count exceeds u32.
        Some(block.0 * self.block_size_tokens as u32 + offset as u32)
    }

    /// Appends the flat slot indices of `physical_range` to `out`.
    ///
    /// Fails with [`KvError::InvalidRange`] (leaving `out` untouched) if the
    /// range is reversed or reaches past the physical length.
    pub fn write_slot_mapping(
        &self,
        physical_range: Range<usize>,
        out: &mut Vec<u32>,
    ) -> Result<(), KvError> {
        if physical_range.start > physical_range.end
            || physical_range.end > self.physical_len_tokens
        {
            return Err(KvError::InvalidRange {
                seq: self.seq,
                start: physical_range.start,
                end: physical_range.end,
                physical_len_tokens: self.physical_len_tokens,
            });
        }
        out.reserve(physical_range.len());
        let bs = self.block_size_tokens;
        let bs_u32 = bs as u32;
        for i in physical_range {
            // In range by the check above and the table invariant.
            let block = self.block_ids[i / bs];
            out.push(block.0 * bs_u32 + (i % bs) as u32);
        }
        Ok(())
    }

    /// Flat slot indices of `physical_range`, as a new vector.
    pub fn slot_mapping(&self, physical_range: Range<usize>) -> Result<Vec<u32>, KvError> {
        let mut out = Vec::new();
        self.write_slot_mapping(physical_range, &mut out)?;
        Ok(out)
    }

    /// Blocks needed beyond those held for `num_new_tokens` more slots.
    pub(crate) fn blocks_needed(&self, num_new_tokens: usize) -> usize {
        let wanted = self.physical_len_tokens.saturating_add(num_new_tokens);
        wanted
            .div_ceil(self.block_size_tokens)
            .saturating_sub(self.block_ids.len())
    }

    /// Adds freshly allocated blocks and grows both lengths.
    pub(crate) fn grow(&mut self, new_blocks: Vec<BlockId>, num_new_tokens: usize) {
        self.block_ids.extend(new_blocks);
        self.logical_len_tokens += num_new_tokens;
        self.physical_len_tokens += num_new_tokens;
        debug_assert_eq!(
            self.block_ids.len(),
            self.physical_len_tokens.div_ceil(self.block_size_tokens)
        );
    }

    /// Advances the logical length alone: the table starts from a cached compacted state that
    /// stands for more tokens than it holds slots.
    pub(crate) fn skip_logical(&mut self, tokens: usize) {
        self.logical_len_tokens += tokens;
    }

    /// Lets a compacted table register blocks again, under a chain that describes its slots
    /// as they are now; only its first `hashed_blocks` blocks (left in place) count as
    /// processed.
    pub(crate) fn resume_registration(&mut self, hashed_blocks: usize) {
        debug_assert!(self.pending_rewrite_from_tokens.is_none());
        self.compacted = false;
        self.num_hashed_blocks = self.num_hashed_blocks.min(hashed_blocks);
    }

    /// Marks the first `n` blocks as processed by the prefix cache.
    pub(crate) fn set_num_hashed_blocks(&mut self, n: usize) {
        debug_assert!(n <= self.physical_len_tokens / self.block_size_tokens);
        self.num_hashed_blocks = n;
    }

    /// Puts `block` at index `index` (a private copy of the block there),
    /// returning the block it replaces.
    pub(crate) fn replace_block(&mut self, index: usize, block: BlockId) -> BlockId {
        std::mem::replace(&mut self.block_ids[index], block)
    }

    /// First slot of an announced, unfinished compaction.
    pub(crate) fn pending_rewrite_from_tokens(&self) -> Option<usize> {
        self.pending_rewrite_from_tokens
    }

    /// Records an announced compaction from physical slot `from_tokens` on;
    /// from now on nothing more is registered.
    pub(crate) fn begin_rewrite(&mut self, from_tokens: usize) {
        self.compacted = true;
        self.pending_rewrite_from_tokens = Some(from_tokens);
    }

    /// Ends a compaction, announced or not; the table counts as compacted.
    pub(crate) fn end_rewrite(&mut self) {
        self.compacted = true;
        self.pending_rewrite_from_tokens = None;
    }

    /// Shrinks the physical length; returns the tail blocks no longer needed
    /// (last block first, so the caller frees them in reverse order).
    pub(crate) fn shrink_physical(&mut self, new_physical_len_tokens: usize) -> Vec<BlockId> {
        self.physical_len_tokens = new_physical_len_tokens;
        let keep = new_physical_len_tokens.div_ceil(self.block_size_tokens);
        self.num_hashed_blocks = self
            .num_hashed_blocks
            .min(new_physical_len_tokens / self.block_size_tokens);
        let mut dropped = self.block_ids.split_off(keep);
        dropped.reverse();
        dropped
    }

    /// Gives back the held blocks before entry `up_to_blocks` (clamped to
    /// the table), leaving [`BlockId::RELEASED`] in their place; returns
    /// them, last first (a prefix stays cached longest).
    pub(crate) fn release_leading(&mut self, up_to_blocks: usize) -> Vec<BlockId> {
        let end = up_to_blocks.min(self.block_ids.len());
        let mut released = Vec::new();
        for entry in self.block_ids[self.num_released_blocks.min(end)..end].iter_mut() {
            released.push(std::mem::replace(entry, BlockId::RELEASED));
        }
        self.num_released_blocks = self.num_released_blocks.max(end);
        released.reverse();
        released
    }

    /// Consumes the table, giving up all held blocks, last first.
    pub(crate) fn into_blocks_reversed(self) -> Vec<BlockId> {
        let mut blocks = self.block_ids;
        blocks.drain(..self.num_released_blocks);
        blocks.reverse();
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(blocks: &[u32], len: usize, bs: usize) -> BlockTable {
        let mut t = BlockTable::new(SeqId(1), bs);
        t.grow(blocks.iter().map(|b| BlockId(*b)).collect(), len);
        t
    }

    #[test]
    fn slot_mapping_crosses_block_boundaries() {
        // Blocks 7, 2, 5 with 4 slots each; 10 tokens.
        let t = table(&[7, 2, 5], 10, 4);
        assert_eq!(
            t.slot_mapping(2..10).unwrap(),
            vec![30, 31, 8, 9, 10, 11, 20, 21]
        );
        assert_eq!(t.slot(0), Some(28));
        assert_eq!(t.slot(9), Some(21));
        assert_eq!(t.slot(10), None);
    }

    #[test]
    fn slot_mapping_refuses_ranges_past_the_physical_length() {
        let t = table(&[0, 1], 6, 4);
        assert!(matches!(
            t.slot_mapping(4..7),
            Err(KvError::InvalidRange {
                end: 7,
                physical_len_tokens: 6,
                ..
            })
        ));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 5..3;
        assert!(t.slot_mapping(reversed).is_err());
        assert_eq!(t.slot_mapping(6..6).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn blocks_needed_counts_partial_last_block() {
        let t = table(&[0, 1], 6, 4);
        assert_eq!(t.blocks_needed(2), 0);
        assert_eq!(t.blocks_needed(3), 1);
        assert_eq!(t.blocks_needed(7), 2);
    }

    #[test]
    fn released_leading_blocks_keep_the_later_slots_addresses() {
        let mut t = table(&[3, 4, 5, 6], 14, 4);
        assert_eq!(t.release_leading(2), vec![BlockId(4), BlockId(3)]);
        // Again, or a shorter prefix: nothing more.
        assert!(t.release_leading(2).is_empty() && t.release_leading(1).is_empty());
        assert_eq!(t.num_released_blocks(), 2);
        assert_eq!(t.held_block_ids(), &[BlockId(5), BlockId(6)]);
        assert_eq!(t.block_ids()[..2], [BlockId::RELEASED; 2]);
        assert_eq!(t.slot(9), Some(21));
        assert_eq!(t.release_leading(9), vec![BlockId(6), BlockId(5)]);
        assert!(t.into_blocks_reversed().is_empty());
    }

    #[test]
    fn shrink_keeps_logical_length_and_returns_tail_blocks_last_first() {
        let mut t = table(&[3, 4, 5, 6], 14, 4);
        let dropped = t.shrink_physical(5);
        assert_eq!(dropped, vec![BlockId(6), BlockId(5)]);
        assert_eq!(t.block_ids(), &[BlockId(3), BlockId(4)]);
        assert_eq!(t.physical_len_tokens(), 5);
        assert_eq!(t.logical_len_tokens(), 14);
    }
}
