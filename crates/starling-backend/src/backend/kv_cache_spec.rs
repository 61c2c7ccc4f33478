//! One layer's paged-cache description ([`KvCacheSpec`]), from which every backend allocates.

use starling_kv::{CacheDtype, LayerLayout};

use crate::BackendError;

/// One layer's paged cache: how many blocks of how many token slots, and what each slot stores
/// ([`LayerLayout`], the same description that sized the cache: full K/V, or STAR-KV latents
/// with each token's position). Every backend allocates from it.
///
/// Storage, on every backend: a *key plane* `[num_slots, key_width]` and a *value plane*
/// `[num_slots, value_width]` ([`plane_widths`](Self::plane_widths)), slot-major; a full layer's
/// key row is `num_kv_heads` heads of `head_dim`, a latent layer's is its heads' key latents
/// side by side (head `h` at the sum of the ranks before it) and its value row the one value
/// latent; a latent layer also stores one `u32` position per slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Number of blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// What one slot stores.
    pub layout: LayerLayout,
}

impl KvCacheSpec {
    /// A full (uncompressed) K/V layer of `num_kv_heads` heads of `head_dim` elements.
    pub fn full(
        num_blocks: usize,
        block_size_tokens: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: CacheDtype,
    ) -> Self {
        Self {
            num_blocks,
            block_size_tokens,
            layout: LayerLayout::Full {
                num_kv_heads,
                head_dim,
                dtype,
            },
        }
    }

    /// Token slots in the whole cache.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }

    /// The same geometry stored in `dtype` (a backend's own: the CPU caches f32, CUDA bf16).
    pub fn with_dtype(&self, dtype: CacheDtype) -> Self {
        let layout = self.layout.with_dtype(dtype);
        Self {
            layout,
            ..self.clone()
        }
    }

    /// Elements per slot of the key plane and of the value plane.
    pub fn plane_widths(&self) -> (usize, usize) {
        self.layout.plane_widths()
    }

    /// `(num_kv_heads, head_dim)` of a full layer; `None` for a latent one.
    pub fn full_heads(&self) -> Option<(usize, usize)> {
        match self.layout {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => Some((num_kv_heads, head_dim)),
            LayerLayout::LowRank { .. } => None,
        }
    }

    /// The stored key rank of each KV head of a latent layer; `None` for a full one.
    pub fn latent_key_ranks(&self) -> Option<&[usize]> {
        match &self.layout {
            LayerLayout::LowRank {
                key_rank_per_head, ..
            } => Some(key_rank_per_head),
            LayerLayout::Full { .. } => None,
        }
    }

    /// Whether the layer stores latents.
    pub fn is_latent(&self) -> bool {
        self.layout.is_low_rank()
    }

    /// How many kept-index lists [`crate::KvCacheOps::compact_kv`] takes: one per KV head for a full layer,
    /// one for a latent layer (its value latent is shared by every head, so every head keeps the
    /// same tokens).
    pub fn keep_lists(&self) -> usize {
        match self.full_heads() {
            Some((heads, _)) => heads,
            None => 1,
        }
    }

    /// The spec's geometry as a full layer, or an error naming `op` (the ops that only full
    /// layers support).
    pub fn require_full(&self, op: &str) -> Result<(usize, usize), BackendError> {
        self.full_heads().ok_or_else(|| {
            BackendError::Shape(format!(
                "{op} needs full K/V; this layer caches STAR-KV latents (reconstruct them first: \
                 Backend::reconstruct_kv)"
            ))
        })
    }

    /// The spec's key ranks as a latent layer, or an error naming `op`.
    pub fn require_latent(&self, op: &str) -> Result<&[usize], BackendError> {
        self.latent_key_ranks().ok_or_else(|| {
            BackendError::Shape(format!(
                "{op} works on STAR-KV latent layers; this layer caches full K/V"
            ))
        })
    }
}
