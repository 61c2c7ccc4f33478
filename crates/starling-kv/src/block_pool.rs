//! The block pool: the single owner of every KV-cache block's state — ref
//! counts, prefix-cache hashes, and the two lists free blocks wait on.
//!
//! Blocks live in an index arena, named by [`BlockId`]. A block is in one
//! of three states:
//! - **used**: ref count > 0, held by one or more block tables (more than one
//!   only for a shared, hashed prefix block);
//! - **free, uncached**: ref count 0, no hash, on the *free list*;
//! - **free, cached**: ref count 0 but its [`BlockHash`] still registered, on
//!   the *cached list* (an LRU): a prefix-cache hit can take it back
//!   ([`BlockPool::acquire_cached`]) with its K/V intact.
//!
//! Both lists are intrusive ([`crate::block_list`]): no allocation after
//! construction.
//!
//! Costs:
//! - [`BlockPool::allocate`]: O(1) (head of the free list, else evict the
//!   head of the cached list: drop its hash from the map).
//! - [`BlockPool::free`]: O(1) (decrement; at zero, push to the tail of the
//!   cached list if hashed, else of the free list).
//! - [`BlockPool::acquire_cached`], [`BlockPool::incr_ref`],
//!   [`BlockPool::register`], [`BlockPool::unregister`]: O(1) expected
//!   (one hash-map operation).
//! - counts: O(1); [`BlockPool::check_invariants`]: O(n), for tests.
//!
//! Reuse order: a block whose ref count drops to zero goes to the TAIL of
//! its list and allocation takes from the HEAD, so the block freed longest
//! ago is reused first. Cached blocks are evicted only when no uncached
//! free block is left, oldest first. Callers that free a sequence's blocks
//! in reverse (tail block first, as [`crate::KvCacheManager::free`] does)
//! make a chain's deepest blocks go first and its prefix — the part other
//! requests are likeliest to share, and useless to keep without it — last.
//!
//! With prefix caching off nothing is ever registered: the cached list
//! stays empty and the pool behaves exactly as a plain free list.

use std::collections::HashMap;

use crate::block_hash::BlockHash;
use crate::block_list::{BlockList, Link, NO_LINK};
use crate::error::KvError;
use crate::ids::BlockId;

/// How the pool's blocks divide between the three states; the fields always
/// add up to the pool size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockCounts {
    /// Free blocks with no cached contents.
    pub free_uncached: usize,
    /// Free blocks whose contents are still registered (evictable).
    pub free_cached: usize,
    /// Blocks held by at least one table.
    pub used: usize,
}

impl BlockCounts {
    /// All blocks.
    pub fn total(&self) -> usize {
        self.free_uncached + self.free_cached + self.used
    }
}

/// Book-keeping for one block (its list links live in a parallel arena).
#[derive(Debug, Clone, Copy)]
struct BlockMeta {
    /// Holders of the block; 0 means it is on one of the two free lists.
    ref_cnt: u32,
    /// Registered content address; `Some` exactly when the map points here.
    hash: Option<BlockHash>,
}

/// Owner of all blocks: O(1) allocate / free with reference counts, and the
/// prefix cache's hash → block map.
#[derive(Debug, Clone)]
pub struct BlockPool {
    meta: Vec<BlockMeta>,
    links: Vec<Link>,
    /// Free blocks with no hash.
    free: BlockList,
    /// Free blocks with a hash, least recently freed first.
    cached_free: BlockList,
    /// Registered blocks, free or used. One block per hash: a second block
    /// with the same contents stays unregistered (see [`Self::register`]).
    by_hash: HashMap<BlockHash, BlockId>,
    num_evicted_blocks: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` free, uncached blocks, listed in id order.
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
        let mut links = vec![Link::UNLINKED; num_blocks];
        let free = BlockList::all_in_order(&mut links);
        Ok(Self {
            meta: vec![
                BlockMeta {
                    ref_cnt: 0,
                    hash: None,
                };
                num_blocks
            ],
            links,
            free,
            cached_free: BlockList::new(),
            by_hash: HashMap::new(),
            num_evicted_blocks: 0,
        })
    }

    /// Blocks an allocation can take: free uncached plus free cached ones.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len() + self.cached_free.len()
    }

    /// Free blocks whose contents are still registered (the evictable LRU).
    pub fn num_cached_free_blocks(&self) -> usize {
        self.cached_free.len()
    }

    /// Registered blocks, free or used.
    pub fn num_cached_blocks(&self) -> usize {
        self.by_hash.len()
    }

    /// Blocks in the pool, free or not.
    pub fn num_total_blocks(&self) -> usize {
        self.meta.len()
    }

    /// The three-way split of the pool.
    pub fn counts(&self) -> BlockCounts {
        BlockCounts {
            free_uncached: self.free.len(),
            free_cached: self.cached_free.len(),
            used: self.meta.len() - self.num_free_blocks(),
        }
    }

    /// Cached blocks evicted (hash dropped) to serve allocations, ever.
    pub fn num_evicted_blocks(&self) -> u64 {
        self.num_evicted_blocks
    }

    /// Holders of `block` (0 when free), or `None` for an id outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.meta.get(block.index()).map(|m| m.ref_cnt)
    }

    /// Whether more than one table holds `block`. A shared block must never
    /// be written in place (compaction, appends): its other holders read it.
    pub fn is_shared(&self, block: BlockId) -> bool {
        self.ref_count(block).is_some_and(|n| n > 1)
    }

    /// The hash `block` is registered under, if any.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.meta.get(block.index()).and_then(|m| m.hash)
    }

    /// The block registered under `hash`, free or used.
    pub fn cached_block(&self, hash: BlockHash) -> Option<BlockId> {
        self.by_hash.get(&hash).copied()
    }

    /// Every registered (hash, block) pair, in no particular order.
    pub fn cached_blocks(&self) -> impl Iterator<Item = (BlockHash, BlockId)> + '_ {
        self.by_hash.iter().map(|(h, b)| (*h, *b))
    }

    /// Takes a free block; its ref count becomes 1 and it has no hash.
    ///
    /// An uncached block is taken first (head of the free list); only when
    /// none is left is the least recently freed cached block evicted.
    pub fn allocate(&mut self) -> Result<BlockId, KvError> {
        let idx = match self.free.pop_head(&mut self.links) {
            Some(idx) => idx,
            None => {
                let Some(idx) = self.cached_free.pop_head(&mut self.links) else {
                    return Err(KvError::OutOfBlocks { needed: 1, free: 0 });
                };
                self.evict(idx);
                idx
            }
        };
        self.meta[idx as usize].ref_cnt = 1;
        Ok(BlockId(idx))
    }

    /// Takes `n` blocks as [`Self::allocate`] does, all or nothing.
    pub fn allocate_n(&mut self, n: usize) -> Result<Vec<BlockId>, KvError> {
        if n > self.num_free_blocks() {
            return Err(KvError::OutOfBlocks {
                needed: n,
                free: self.num_free_blocks(),
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

    /// Adds a holder to a registered block found by a prefix-cache hit: a
    /// used one gains a holder, a free cached one leaves the LRU with ref
    /// count 1. A free block with no hash is [`KvError::BlockNotAllocated`]
    /// (its contents are not known).
    pub fn acquire_cached(&mut self, block: BlockId) -> Result<(), KvError> {
        let meta = *self.meta_mut(block)?;
        match (meta.ref_cnt, meta.hash) {
            (0, None) => Err(KvError::BlockNotAllocated(block)),
            (0, Some(_)) => {
                self.cached_free.unlink(&mut self.links, block.0);
                self.meta[block.index()].ref_cnt = 1;
                Ok(())
            }
            _ => self.incr_ref(block),
        }
    }

    /// Drops one holder; at zero the block goes to the tail of the cached
    /// list if it is registered, else of the free list.
    ///
    /// Freeing a block that is already free is [`KvError::DoubleFree`].
    pub fn free(&mut self, block: BlockId) -> Result<(), KvError> {
        let meta = self.meta_mut(block)?;
        if meta.ref_cnt == 0 {
            return Err(KvError::DoubleFree(block));
        }
        meta.ref_cnt -= 1;
        if meta.ref_cnt > 0 {
            return Ok(());
        }
        if meta.hash.is_some() {
            self.cached_free.push_tail(&mut self.links, block.0);
        } else {
            self.free.push_tail(&mut self.links, block.0);
        }
        Ok(())
    }

    /// Registers the contents of the used block `block` under `hash`, once
    /// its K/V is completely written. Returns whether it was registered:
    /// `false` when another block already holds `hash` (two sequences
    /// computed the same block side by side), in which case this one stays
    /// a private, unregistered copy and is freed to the free list.
    ///
    /// Fails with [`KvError::BlockNotAllocated`] for a free block and
    /// [`KvError::BlockAlreadyRegistered`] if `block` has a hash already.
    pub fn register(&mut self, block: BlockId, hash: BlockHash) -> Result<bool, KvError> {
        let meta = *self.meta_mut(block)?;
        if meta.ref_cnt == 0 {
            return Err(KvError::BlockNotAllocated(block));
        }
        if meta.hash.is_some() {
            return Err(KvError::BlockAlreadyRegistered(block));
        }
        if self.by_hash.contains_key(&hash) {
            return Ok(false);
        }
        self.by_hash.insert(hash, block);
        self.meta[block.index()].hash = Some(hash);
        Ok(true)
    }

    /// Drops the registration of the used block `block` before its holder
    /// rewrites it (compaction), so no later hit can find stale contents.
    /// Returns whether it had one.
    ///
    /// Fails with [`KvError::BlockNotAllocated`] for a free block.
    pub fn unregister(&mut self, block: BlockId) -> Result<bool, KvError> {
        let meta = *self.meta_mut(block)?;
        if meta.ref_cnt == 0 {
            return Err(KvError::BlockNotAllocated(block));
        }
        let Some(hash) = meta.hash else {
            return Ok(false);
        };
        self.by_hash.remove(&hash);
        self.meta[block.index()].hash = None;
        Ok(true)
    }

    /// Walks both lists and the arena and checks that they agree: every
    /// block with ref count 0 is on exactly one list — the cached one iff it
    /// has a hash — and a used block is on neither; the hash map and the
    /// blocks' hashes mirror each other; counts match.
    pub fn check_invariants(&self) -> Result<(), KvError> {
        let fail = |msg: String| Err(KvError::InvariantViolated(msg));
        let mut listed = vec![false; self.meta.len()];
        for (list, name, want_hash) in [
            (&self.free, "free", false),
            (&self.cached_free, "cached", true),
        ] {
            for idx in list.walk(&self.links, name)? {
                let meta = &self.meta[idx as usize];
                if std::mem::replace(&mut listed[idx as usize], true) {
                    return fail(format!("block {idx} is on two lists"));
                }
                if meta.ref_cnt != 0 {
                    return fail(format!(
                        "block {idx} on the {name} list has ref count {}",
                        meta.ref_cnt
                    ));
                }
                if meta.hash.is_some() != want_hash {
                    return fail(format!(
                        "block {idx} on the {name} list has hash {:?}",
                        meta.hash
                    ));
                }
            }
        }
        let mut hashed = 0usize;
        for (i, meta) in self.meta.iter().enumerate() {
            if !listed[i] && meta.ref_cnt == 0 {
                return fail(format!("block {i} has ref count 0 but is on no list"));
            }
            if let Some(hash) = meta.hash {
                hashed += 1;
                if self.by_hash.get(&hash) != Some(&BlockId(i as u32)) {
                    return fail(format!(
                        "block {i} has hash {hash} the map does not point at"
                    ));
                }
            }
        }
        if hashed != self.by_hash.len() {
            return fail(format!(
                "{} map entries but {hashed} hashed blocks",
                self.by_hash.len()
            ));
        }
        Ok(())
    }

    fn meta_mut(&mut self, block: BlockId) -> Result<&mut BlockMeta, KvError> {
        let num_total_blocks = self.meta.len();
        self.meta
            .get_mut(block.index())
            .ok_or(KvError::InvalidBlock {
                block,
                num_total_blocks,
            })
    }

    /// Drops the hash of `idx`, just taken off the cached list.
    fn evict(&mut self, idx: u32) {
        if let Some(hash) = self.meta[idx as usize].hash.take() {
            self.by_hash.remove(&hash);
            self.num_evicted_blocks += 1;
        }
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

    fn hash(n: u128) -> BlockHash {
        // Any distinct values will do: the pool never looks inside a hash.
        let id = crate::block_hash::CacheIdentity::new(&crate::block_hash::CacheIdentityParts {
            model_identity: "pool-test",
            layout: &crate::layout::CacheLayout { layers: vec![] },
            checkpoint_identity: None,
        });
        BlockHash::of_block(&id, None, &[n as u32])
    }

    #[test]
    fn freed_registered_blocks_wait_on_the_cached_list() {
        let mut pool = BlockPool::new(3).unwrap();
        let ids = pool.allocate_n(3).unwrap();
        assert!(pool.register(ids[0], hash(0)).unwrap());
        pool.free(ids[0]).unwrap();
        pool.free(ids[1]).unwrap();
        let counts = pool.counts();
        assert_eq!(
            (counts.free_uncached, counts.free_cached, counts.used),
            (1, 1, 1)
        );
        assert_eq!(counts.total(), 3);
        assert_eq!(pool.cached_block(hash(0)), Some(ids[0]));
        pool.check_invariants().unwrap();
        // The uncached block goes first; the cached one survives.
        assert_eq!(pool.allocate().unwrap(), ids[1]);
        assert_eq!(pool.cached_block(hash(0)), Some(ids[0]));
        assert_eq!(pool.num_evicted_blocks(), 0);
        // Now only the cached block is left: allocating evicts it.
        assert_eq!(pool.allocate().unwrap(), ids[0]);
        assert_eq!(pool.cached_block(hash(0)), None);
        assert_eq!(pool.block_hash(ids[0]), None);
        assert_eq!(pool.num_evicted_blocks(), 1);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn cached_blocks_are_evicted_least_recently_freed_first() {
        let mut pool = BlockPool::new(4).unwrap();
        let ids = pool.allocate_n(4).unwrap();
        for (i, id) in ids.iter().enumerate() {
            pool.register(*id, hash(i as u128)).unwrap();
        }
        for i in [2, 0, 3, 1] {
            pool.free(ids[i]).unwrap();
        }
        // A hit on block 0 takes it off the LRU; the rest go in free order.
        pool.acquire_cached(ids[0]).unwrap();
        assert_eq!(pool.ref_count(ids[0]), Some(1));
        let order: Vec<BlockId> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(order, vec![ids[2], ids[3], ids[1]]);
        assert_eq!(pool.num_evicted_blocks(), 3);
        assert_eq!(pool.num_cached_blocks(), 1);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn acquire_shares_used_blocks_and_refuses_uncached_free_ones() {
        let mut pool = BlockPool::new(2).unwrap();
        let a = pool.allocate().unwrap();
        pool.register(a, hash(7)).unwrap();
        pool.acquire_cached(a).unwrap();
        assert!(pool.is_shared(a));
        pool.free(a).unwrap();
        assert!(!pool.is_shared(a));
        assert_eq!(
            pool.acquire_cached(BlockId(1)),
            Err(KvError::BlockNotAllocated(BlockId(1)))
        );
        pool.check_invariants().unwrap();
    }

    #[test]
    fn register_keeps_one_block_per_hash() {
        let mut pool = BlockPool::new(2).unwrap();
        let ids = pool.allocate_n(2).unwrap();
        assert_eq!(pool.register(ids[0], hash(1)), Ok(true));
        assert_eq!(pool.register(ids[1], hash(1)), Ok(false));
        assert_eq!(
            pool.register(ids[0], hash(2)),
            Err(KvError::BlockAlreadyRegistered(ids[0]))
        );
        // The duplicate is freed as a plain block.
        pool.free(ids[1]).unwrap();
        assert_eq!(pool.counts().free_uncached, 1);
        assert_eq!(pool.unregister(ids[0]), Ok(true));
        assert_eq!(pool.unregister(ids[0]), Ok(false));
        assert_eq!(pool.cached_block(hash(1)), None);
        pool.free(ids[0]).unwrap();
        assert_eq!(
            pool.register(ids[0], hash(3)),
            Err(KvError::BlockNotAllocated(ids[0]))
        );
        assert_eq!(pool.counts().free_uncached, 2);
        pool.check_invariants().unwrap();
    }
}
