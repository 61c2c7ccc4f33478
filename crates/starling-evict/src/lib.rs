//! Token eviction for the paged KV cache: what to compress ([`CompressionConfig`]), how to rank
//! one KV head's tokens ([`Scorer`] and its implementations), and which tokens each head keeps
//! ([`select_keep`], or one choice for the whole layer: [`select_keep_layer_wide`]).
//!
//! Everything here is host-side f32 and device-free: the scorers are the definitions. The engine
//! has each layer scored where the cache lives (`Backend::key_scores`, `Backend::window_scores`,
//! equal to these scorers on the CPU: `tests/device_scores.rs`), selects the kept indices here,
//! compacts the cache (`Backend::compact_kv`) and finally releases the freed tail blocks
//! (`KvCacheManager::shrink_physical`).
#![deny(missing_docs)]

mod config;
mod error;
mod fields;
mod input;
pub mod scorer;

pub use config::{
    CompressionConfig, CompressionMethod, KvCacheDtype, KvCompression, StarKvCache, StarKvFactors,
    StarKvSelection, STAR_KV_METHOD,
};
pub use error::EvictError;
pub use input::{split_heads, HeadKeys, ScoreInput, WindowQueries};
pub use scorer::{scorer_for, Scorer};
pub use starling_backend::keep::{
    keep_count, protected_count, select_keep, select_keep_layer_wide,
};
