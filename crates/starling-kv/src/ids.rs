//! The ids the books are kept by: blocks and sequences.
//!
//! A leaf module (it imports nothing from the crate) so that the error type
//! and every bookkeeping module can name ids without importing each other.

use std::fmt;

/// Index of one block in the pool (and, times the block size, of its first
/// token slot in the cache tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The entry a block table keeps for a leading block it gave back because no layer reads
    /// it again (every layer attends over a sliding window that has moved past it). Never a
    /// pool block: a pool has fewer than `u32::MAX` blocks.
    pub const RELEASED: BlockId = BlockId(u32::MAX);

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

/// Identifier of one sequence (request) in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq{}", self.0)
    }
}
