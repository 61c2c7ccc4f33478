//! starling-kv: KV-cache bookkeeping for Starling.
//!
//! Pure book-keeping: which blocks exist, who holds them, which token slots
//! each sequence's tokens live in, and how many blocks a memory budget
//! buys under a given (possibly compressed) cache layout.
//!
//! Architecture invariant: this crate knows nothing about tensors or
//! devices. Runners turn its slot mappings and block tables into device
//! buffers; the scheduler asks it only for blocks.
//!
//! - [`BlockPool`]: O(1) block allocate / free with ref counts, and the
//!   prefix cache's hash → block map and LRU of cached free blocks.
//! - [`BlockTable`]: one sequence's blocks, logical vs physical length.
//! - [`KvCacheManager`]: the single owner of the pool and all tables;
//!   automatic prefix caching ([`KvCacheConfig::enable_prefix_caching`]).
//! - [`BlockHash`], [`CacheIdentity`], [`BlockHasher`]: stable content
//!   addresses of full blocks.
//! - [`CacheGroups`]: which layers share a block table (hybrid sliding-window
//!   models keep one table per group, so windowed layers free their old blocks).
//! - [`CacheLayout`]: bytes per token, per layer (full or low-rank latents).
//! - [`CacheSizing`], [`preflight`]: budget to block count, and the refusal
//!   to start when one max-length sequence cannot fit.

#![deny(missing_docs)]

mod block_hash;
mod block_list;
mod block_pool;
mod block_table;
mod bytes;
mod error;
mod groups;
mod ids;
mod layout;
mod manager;
mod sizing;

pub use block_hash::{kept_slot_token, BlockHash, BlockHasher, CacheIdentity, CacheIdentityParts};
pub use block_pool::{BlockCounts, BlockPool};
pub use block_table::BlockTable;
pub use bytes::format_bytes;
pub use error::KvError;
pub use groups::{group_blocks_for_tokens, group_held_tokens, CacheGroup, CacheGroups};
pub use ids::{BlockId, SeqId};
pub use layout::{
    stored_rank, CacheDtype, CacheLayout, LayerLayout, INT4_GROUP_ELEMENTS, LATENT_RANK_MULTIPLE,
    POSITION_BYTES, SCALE_BYTES,
};
pub use manager::{
    CompactedPrefixQuery, KvCacheConfig, KvCacheManager, PrefixCacheStats, PrefixHit, PrefixQuery,
};
pub use sizing::{preflight, preflight_grouped, preflight_with_peak, CacheSizing, Preflight};
