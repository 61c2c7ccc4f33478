//! Token eviction for the paged KV cache: what to compress ([`CompressionConfig`]), how to rank
//! one KV head's tokens ([`Scorer`] and its implementations), and which tokens each head keeps
//! ([`select_keep`]).
//!
//! Everything here is host-side f32 and device-free. The engine reads a sequence's keys
//! (`Backend::read_keys`), scores each KV head, selects the kept indices, compacts the cache
//! (`Backend::compact_kv`) and finally releases the freed tail blocks
//! (`KvCacheManager::shrink_physical`).
#![deny(missing_docs)]

mod config;
mod error;
mod input;
pub mod scorer;
mod select;

pub use config::{
    CompressionConfig, CompressionMethod, KvCompression, StarKvCache, StarKvFactors,
    StarKvSelection, STAR_KV_METHOD,
};
pub use error::EvictError;
pub use input::{split_heads, HeadKeys, ScoreInput, WindowQueries};
pub use scorer::{scorer_for, Scorer};
pub use select::{keep_count, protected_count, select_keep};
