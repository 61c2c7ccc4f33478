//! The block pool: the single owner of every KV-cache block's state.
//!
//! Blocks live in an index arena (`Vec<BlockMeta>`), named by [`BlockId`].
//! Free blocks are linked into an intrusive doubly linked list through
//! `prev_free` / `next_free` indices, with [`NO_LINK`] as the sentinel; no
//! `Rc`, no allocation after construction.
//!
//! Costs:
//! - [`BlockPool::allocate`]: O(1) (pop the head of the free list).
//! - [`BlockPool::free`]: O(1) (decrement the ref count; at zero, push to the tail).
//! - [`BlockPool::incr_ref`]: O(1) (share an allocated block).
//! - [`BlockPool::num_free_blocks`], [`BlockPool::num_total_blocks`]: O(1).
//! - [`BlockPool::check_invariants`]: O(n), for tests.
//!
//! Free order: a block whose ref count drops to zero goes to the TAIL of the
//! free list, and allocation takes from the HEAD, so the block freed longest
//! ago is reused first. Callers that free a sequence's blocks in reverse
//! (tail block first, as [`crate::KvCacheManager::free`] does) make a
//! sequence's prefix the last part to be reused, which is what a later
//! prefix cache wants to find still intact.

use std::fmt;

use crate::error::KvError;

/// Sentinel for "no neighbour" in the intrusive free list.
const NO_LINK: u32 = u32::MAX;

/// Index of one block in the pool (and, times the block size, of its first
/// token slot in the cache tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The id as an index into per-block arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Book-keeping for one block.
#[derive(Debug, Clone)]
struct BlockMeta {
    /// Holders of the block; 0 means it is on the free list.
    ref_cnt: u32,
    /// Previous block on the free list, or `NO_LINK`.
    prev_free: u32,
    /// Next block on the free list, or `NO_LINK`.
    next_free: u32,
}

/// Owner of all blocks: O(1) allocate / free with reference counts.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks, linked in id order.
    ///
    /// Fails with [`KvError::InvalidConfig`] if `num_blocks` does not fit in
    /// a `u32` id (the top value is the list sentinel).
    pub fn new(num_blocks: usize) -> Result<Self, KvError> {
        if num_blocks >= NO_LINK as usize {
            return Err(KvError::InvalidConfig(format!(
                "{num_blocks} blocks exceed the {} a u32 block id can name",
                NO_LINK
            )));
        }
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| BlockMeta {
                ref_cnt: 0,
                prev_free: if i == 0 { NO_LINK } else { i - 1 },
                next_free: if i + 1 == n { NO_LINK } else { i + 1 },
            })
            .collect();
        Ok(Self {
            blocks,
            free_head: if n == 0 { NO_LINK } else { 0 },
            free_tail: if n == 0 { NO_LINK } else { n - 1 },
            num_free: num_blocks,
        })
    }

    /// Blocks on the free list.
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    /// Blocks in the pool, free or not.
    pub fn num_total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Holders of `block` (0 when free), or `None` for an id outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.blocks.get(block.index()).map(|m| m.ref_cnt)
    }

    /// Takes the head of the free list; its ref count becomes 1.
    pub fn allocate(&mut self) -> Result<BlockId, KvError> {
        let head = self.free_head;
        if head == NO_LINK {
            return Err(KvError::OutOfBlocks { needed: 1, free: 0 });
        }
        self.unlink(head);
        self.blocks[head as usize].ref_cnt = 1;
        Ok(BlockId(head))
    }

    /// Takes `n` blocks from the head, all or nothing.
    pub fn allocate_n(&mut self, n: usize) -> Result<Vec<BlockId>, KvError> {
        if n > self.num_free {
            return Err(KvError::OutOfBlocks {
                needed: n,
                free: self.num_free,
            });
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.allocate()?);
        }
        Ok(out)
    }

    /// Adds a holder to an allocated block (prefix sharing).
    pub fn incr_ref(&mut self, block: BlockId) -> Result<(), KvError> {
        let meta = self.meta_mut(block)?;
        if meta.ref_cnt == 0 {
            return Err(KvError::BlockNotAllocated(block));
        }
        meta.ref_cnt = meta.ref_cnt.saturating_add(1);
        Ok(())
    }

    /// Drops one holder; at zero the block goes to the tail of the free list.
    ///
    /// Freeing a block that is already free is [`KvError::DoubleFree`].
    pub fn free(&mut self, block: BlockId) -> Result<(), KvError> {
        let meta = self.meta_mut(block)?;
        if meta.ref_cnt == 0 {
            return Err(KvError::DoubleFree(block));
        }
        meta.ref_cnt -= 1;
        if meta.ref_cnt == 0 {
            self.push_tail(block.0);
        }
        Ok(())
    }

    /// Walks the free list and the arena and checks that they agree: every
    /// block is either on the free list exactly once with ref count 0, or off
    /// it with ref count > 0; links are symmetric; counts match.
    pub fn check_invariants(&self) -> Result<(), KvError> {
        let fail = |msg: String| Err(KvError::InvariantViolated(msg));
        let mut seen = vec![false; self.blocks.len()];
        let mut walked = 0usize;
        let mut prev = NO_LINK;
        let mut cur = self.free_head;
        while cur != NO_LINK {
            let Some(meta) = self.blocks.get(cur as usize) else {
                return fail(format!("free list links to missing block {cur}"));
            };
            if seen[cur as usize] {
                return fail(format!("block {cur} is on the free list twice (cycle)"));
            }
            seen[cur as usize] = true;
            if meta.ref_cnt != 0 {
                return fail(format!("free block {cur} has ref count {}", meta.ref_cnt));
            }
            if meta.prev_free != prev {
                return fail(format!(
                    "block {cur}: prev link {} != {prev}",
                    meta.prev_free
                ));
            }
            walked += 1;
            prev = cur;
            cur = meta.next_free;
        }
        if prev != self.free_tail {
            return fail(format!(
                "free tail {} but walk ended at {prev}",
                self.free_tail
            ));
        }
        if walked != self.num_free {
            return fail(format!(
                "{walked} blocks on the free list, count says {}",
                self.num_free
            ));
        }
        for (i, meta) in self.blocks.iter().enumerate() {
            if !seen[i] && meta.ref_cnt == 0 {
                return fail(format!(
                    "block {i} has ref count 0 but is not on the free list"
                ));
            }
        }
        Ok(())
    }

    fn meta_mut(&mut self, block: BlockId) -> Result<&mut BlockMeta, KvError> {
        let num_total_blocks = self.blocks.len();
        self.blocks
            .get_mut(block.index())
            .ok_or(KvError::InvalidBlock {
                block,
                num_total_blocks,
            })
    }

    /// Removes `idx` (known to be on the free list) from it.
    fn unlink(&mut self, idx: u32) {
        let (prev, next) = {
            let m = &self.blocks[idx as usize];
            (m.prev_free, m.next_free)
        };
        if prev == NO_LINK {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next_free = next;
        }
        if next == NO_LINK {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev_free = prev;
        }
        let m = &mut self.blocks[idx as usize];
        m.prev_free = NO_LINK;
        m.next_free = NO_LINK;
        self.num_free -= 1;
    }

    /// Appends `idx` (known to be off the free list) at the tail.
    fn push_tail(&mut self, idx: u32) {
        let old_tail = self.free_tail;
        {
            let m = &mut self.blocks[idx as usize];
            m.prev_free = old_tail;
            m.next_free = NO_LINK;
        }
        if old_tail == NO_LINK {
            self.free_head = idx;
        } else {
            self.blocks[old_tail as usize].next_free = idx;
        }
        self.free_tail = idx;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_from_head_in_id_order() {
        let mut pool = BlockPool::new(3).unwrap();
        assert_eq!(pool.allocate().unwrap(), BlockId(0));
        assert_eq!(pool.allocate().unwrap(), BlockId(1));
        assert_eq!(pool.num_free_blocks(), 1);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn freed_blocks_go_to_the_tail() {
        let mut pool = BlockPool::new(4).unwrap();
        let ids = pool.allocate_n(4).unwrap();
        pool.free(ids[2]).unwrap();
        pool.free(ids[0]).unwrap();
        pool.free(ids[3]).unwrap();
        pool.check_invariants().unwrap();
        // Reused in the order they were freed.
        assert_eq!(pool.allocate().unwrap(), BlockId(2));
        assert_eq!(pool.allocate().unwrap(), BlockId(0));
        assert_eq!(pool.allocate().unwrap(), BlockId(3));
        assert!(matches!(
            pool.allocate(),
            Err(KvError::OutOfBlocks { needed: 1, free: 0 })
        ));
    }

    #[test]
    fn unlink_from_the_middle_keeps_the_list_whole() {
        let mut pool = BlockPool::new(5).unwrap();
        let ids = pool.allocate_n(5).unwrap();
        for id in &ids {
            pool.free(*id).unwrap();
        }
        // Share then free: exercises the ref count path without relinking.
        let a = pool.allocate().unwrap();
        pool.incr_ref(a).unwrap();
        pool.free(a).unwrap();
        assert_eq!(pool.ref_count(a), Some(1));
        assert_eq!(pool.num_free_blocks(), 4);
        pool.free(a).unwrap();
        assert_eq!(pool.num_free_blocks(), 5);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn double_free_is_a_typed_error() {
        let mut pool = BlockPool::new(2).unwrap();
        let a = pool.allocate().unwrap();
        pool.free(a).unwrap();
        assert_eq!(pool.free(a), Err(KvError::DoubleFree(a)));
        // Never-allocated block.
        assert_eq!(pool.free(BlockId(1)), Err(KvError::DoubleFree(BlockId(1))));
        assert!(matches!(
            pool.free(BlockId(7)),
            Err(KvError::InvalidBlock { .. })
        ));
        pool.check_invariants().unwrap();
        assert_eq!(pool.num_free_blocks(), 2);
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let mut pool = BlockPool::new(3).unwrap();
        assert_eq!(
            pool.allocate_n(4),
            Err(KvError::OutOfBlocks { needed: 4, free: 3 })
        );
        assert_eq!(pool.num_free_blocks(), 3);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn empty_pool_is_consistent() {
        let mut pool = BlockPool::new(0).unwrap();
        pool.check_invariants().unwrap();
        assert!(pool.allocate().is_err());
    }

    #[test]
    fn sharing_a_free_block_is_refused() {
        let mut pool = BlockPool::new(1).unwrap();
        assert_eq!(
            pool.incr_ref(BlockId(0)),
            Err(KvError::BlockNotAllocated(BlockId(0)))
        );
    }
}
