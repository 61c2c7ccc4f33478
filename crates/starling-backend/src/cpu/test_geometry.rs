//! The geometry of a full test cache, as constants (a [`KvCacheSpec`] holds a layout, so it
//! cannot be a `const`).

use crate::KvCacheSpec;
use starling_kv::CacheDtype;

/// Blocks, block size and heads of a full f32 test cache.
pub(crate) struct Geometry {
    pub(crate) num_blocks: usize,
    pub(crate) block_size_tokens: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Geometry {
    /// Token slots in the cache.
    pub(crate) const fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }

    /// The spec of a full f32 cache of this geometry.
    pub(crate) fn spec(&self) -> KvCacheSpec {
        KvCacheSpec::full(
            self.num_blocks,
            self.block_size_tokens,
            self.num_kv_heads,
            self.head_dim,
            CacheDtype::F32,
        )
    }
}
