//! Cache layouts: how many bytes one token occupies in each layer's cache.
//!
//! A block holds `block_size` token slots across ALL layers, so a layout
//! storing fewer bytes per token yields proportionally more blocks from the
//! same memory budget. That is how KV-cache compression turns into capacity.

use serde::{Deserialize, Serialize};

use crate::error::KvError;

/// Element type of the cache tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CacheDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float (e4m3 / e5m2; the byte count is the same).
    Fp8,
    /// Symmetric 8-bit integers with one scale per vector ([`SCALE_BYTES`] each): per token, a
    /// full layer scales each KV head's key row and value row, a latent layer each key head's
    /// latent and its value latent (per-token scales, as KIVI and KVQuant do for values).
    Int8,
    /// Symmetric 4-bit integers (two per byte) with one scale ([`SCALE_BYTES`]) per group of
    /// [`INT4_GROUP_ELEMENTS`] consecutive elements of a vector (per token, group-wise, as
    /// KIVI's and QServe's 4-bit caches): a vector narrower than a group, or its last partial
    /// group, still has a scale of its own.
    Int4,
}

impl CacheDtype {
    /// Bits per element.
    pub fn bits(self) -> u64 {
        match self {
            CacheDtype::F32 => 32,
            CacheDtype::F16 | CacheDtype::BF16 => 16,
            CacheDtype::Fp8 | CacheDtype::Int8 => 8,
            CacheDtype::Int4 => 4,
        }
    }

    /// Bytes that `elements` elements occupy, scales excluded (rounded up to whole bytes;
    /// saturating).
    pub fn bytes_for(self, elements: u64) -> u64 {
        elements.saturating_mul(self.bits()).div_ceil(8)
    }

    /// Whether stored vectors carry scales ([`SCALE_BYTES`] each).
    pub fn is_scaled(self) -> bool {
        matches!(self, CacheDtype::Int8 | CacheDtype::Int4)
    }

    /// Scales one stored vector of `width` elements carries: one for int8, one per (started)
    /// group of [`INT4_GROUP_ELEMENTS`] for int4, none for the float types.
    pub fn scales_per_vector(self, width: usize) -> u64 {
        match self {
            CacheDtype::Int8 => 1,
            CacheDtype::Int4 => width.div_ceil(INT4_GROUP_ELEMENTS) as u64,
            CacheDtype::F32 | CacheDtype::F16 | CacheDtype::BF16 | CacheDtype::Fp8 => 0,
        }
    }
}

/// Bytes of the scale an [`CacheDtype::Int8`] vector or an [`CacheDtype::Int4`] group stores
/// (an IEEE half).
pub const SCALE_BYTES: u64 = 2;

/// Elements of a vector that share one scale in an [`CacheDtype::Int4`] cache.
pub const INT4_GROUP_ELEMENTS: usize = 32;

/// What one layer stores per token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerLayout {
    /// Plain K and V: `num_kv_heads * head_dim` elements each.
    Full {
        /// KV heads of the layer.
        num_kv_heads: usize,
        /// Elements per head.
        head_dim: usize,
        /// Element type.
        dtype: CacheDtype,
    },
    /// STAR-KV low-rank latents: one key latent per KV head (ranks may
    /// differ per head) plus one value latent shared by the layer, and each
    /// token's RoPE position ([`POSITION_BYTES`]): keys are cached before
    /// RoPE and rotated when attended, at the position the slot holds (after
    /// eviction a slot's index is no longer its position).
    ///
    /// Ranks are the *stored* ranks: [`LowRank::padded`](LayerLayout::low_rank_padded)
    /// rounds a checkpoint's ranks up to [`LATENT_RANK_MULTIPLE`].
    LowRank {
        /// Stored latent rank of each KV head's keys.
        key_rank_per_head: Vec<usize>,
        /// Rank of the layer's value latent.
        value_rank: usize,
        /// Element type.
        dtype: CacheDtype,
    },
}

/// Bytes of the RoPE position a latent layer stores per token (`u32`).
pub const POSITION_BYTES: u64 = 4;

/// Latent ranks are stored in multiples of this many elements, so every head's latent starts
/// and ends on a 16-byte boundary in a bf16 cache (what a GPU's 16-byte loads and its matrix
/// instructions need). The padding components are zero; they cost bytes, which the layout
/// counts.
pub const LATENT_RANK_MULTIPLE: usize = 8;

/// `rank` rounded up to the stored multiple ([`LATENT_RANK_MULTIPLE`]).
pub fn stored_rank(rank: usize) -> usize {
    rank.div_ceil(LATENT_RANK_MULTIPLE) * LATENT_RANK_MULTIPLE
}

impl LayerLayout {
    /// A latent layer storing the given (effective) ranks, each rounded up to
    /// [`LATENT_RANK_MULTIPLE`].
    pub fn low_rank_padded(key_ranks: &[usize], value_rank: usize, dtype: CacheDtype) -> Self {
        LayerLayout::LowRank {
            key_rank_per_head: key_ranks.iter().map(|&r| stored_rank(r)).collect(),
            value_rank: stored_rank(value_rank),
            dtype,
        }
    }

    /// The same geometry stored in `dtype` (a backend's own element, or fp8).
    pub fn with_dtype(&self, dtype: CacheDtype) -> Self {
        match self {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => LayerLayout::Full {
                num_kv_heads: *num_kv_heads,
                head_dim: *head_dim,
                dtype,
            },
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => LayerLayout::LowRank {
                key_rank_per_head: key_rank_per_head.clone(),
                value_rank: *value_rank,
                dtype,
            },
        }
    }

    /// Whether this layer holds latents (STAR-KV) rather than full K/V.
    pub fn is_low_rank(&self) -> bool {
        matches!(self, LayerLayout::LowRank { .. })
    }

    /// Elements of the key plane and of the value plane per token: `num_kv_heads * head_dim`
    /// each for a full layer, `(Σ key ranks, value rank)` for a latent one.
    pub fn plane_widths(&self) -> (usize, usize) {
        match self {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => (num_kv_heads * head_dim, num_kv_heads * head_dim),
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => (key_rank_per_head.iter().sum(), *value_rank),
        }
    }

    /// Elements one token stores in this layer (positions excluded).
    pub fn elements_per_token(&self) -> u64 {
        match self {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => 2u64
                .saturating_mul(*num_kv_heads as u64)
                .saturating_mul(*head_dim as u64),
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => key_rank_per_head
                .iter()
                .fold(*value_rank as u64, |acc, r| acc.saturating_add(*r as u64)),
        }
    }

    /// Vectors one token stores in this layer, each with its own scale(s) in a scaled dtype:
    /// a key row and a value row per KV head (full), a latent per key head plus the value
    /// latent (low-rank).
    pub fn vectors_per_token(&self) -> u64 {
        self.vector_widths().count() as u64
    }

    /// The width in elements of each vector one token stores, keys first (the order of the
    /// planes): every KV head's key row then every value row (full), every key head's latent
    /// then the value latent (low-rank).
    pub fn vector_widths(&self) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            LayerLayout::Full {
                num_kv_heads,
                head_dim,
                ..
            } => Box::new(std::iter::repeat_n(*head_dim, 2 * num_kv_heads)),
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => Box::new(key_rank_per_head.iter().copied().chain([*value_rank])),
        }
    }

    /// Scales one token stores in this layer (0 unless the dtype is scaled).
    pub fn scales_per_token(&self) -> u64 {
        let dtype = self.dtype();
        self.vector_widths().fold(0u64, |acc, w| {
            acc.saturating_add(dtype.scales_per_vector(w))
        })
    }

    /// Element type of the layer.
    pub fn dtype(&self) -> CacheDtype {
        match self {
            LayerLayout::Full { dtype, .. } | LayerLayout::LowRank { dtype, .. } => *dtype,
        }
    }

    /// Bytes one token occupies in this layer, positions and scales included (saturating:
    /// absurd configs become "too big", never wrap around).
    pub fn bytes_per_token(&self) -> u64 {
        let scales = self.scales_per_token().saturating_mul(SCALE_BYTES);
        let elements = self
            .dtype()
            .bytes_for(self.elements_per_token())
            .saturating_add(scales);
        match self {
            LayerLayout::Full { .. } => elements,
            LayerLayout::LowRank { .. } => elements.saturating_add(POSITION_BYTES),
        }
    }
}

/// The cache layout of a whole model; layers may differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheLayout {
    /// One entry per attention layer, in model order.
    pub layers: Vec<LayerLayout>,
}

impl CacheLayout {
    /// `num_layers` copies of the same layer layout.
    pub fn uniform(num_layers: usize, layer: LayerLayout) -> Self {
        Self {
            layers: vec![layer; num_layers],
        }
    }

    /// Bytes one token occupies across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.layers
            .iter()
            .fold(0u64, |acc, l| acc.saturating_add(l.bytes_per_token()))
    }

    /// Layers that hold latents.
    pub fn num_low_rank_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.is_low_rank()).count()
    }

    /// Bytes one block of `block_size_tokens` slots occupies across all layers.
    pub fn bytes_per_block(&self, block_size_tokens: usize) -> u64 {
        self.bytes_per_token()
            .saturating_mul(block_size_tokens as u64)
    }

    /// Refuses layouts with no layers or with a layer that stores nothing
    /// (a zero-byte token would make the block count meaningless).
    pub fn validate(&self) -> Result<(), KvError> {
        if self.layers.is_empty() {
            return Err(KvError::InvalidConfig("cache layout has no layers".into()));
        }
        if let Some(i) = self.layers.iter().position(|l| l.elements_per_token() == 0) {
            return Err(KvError::InvalidConfig(format!(
                "layer {i} of the cache layout stores 0 bytes per token"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_bytes() {
        assert_eq!(CacheDtype::F32.bytes_for(3), 12);
        assert_eq!(CacheDtype::F16.bytes_for(3), 6);
        assert_eq!(CacheDtype::BF16.bytes_for(3), 6);
        assert_eq!(CacheDtype::Fp8.bytes_for(3), 3);
        assert_eq!(CacheDtype::Int8.bytes_for(3), 3);
        assert_eq!(CacheDtype::Int4.bytes_for(64), 32);
        assert_eq!(CacheDtype::Int4.bytes_for(3), 2);
    }

    #[test]
    fn int4_layers_count_a_scale_per_group() {
        let full = LayerLayout::Full {
            num_kv_heads: 2,
            head_dim: 128,
            dtype: CacheDtype::Int4,
        };
        // Four rows of 128 nibbles, each with 128 / 32 = 4 scales.
        assert_eq!(full.bytes_per_token(), 4 * 64 + 16 * SCALE_BYTES);
        let latent = LayerLayout::LowRank {
            key_rank_per_head: vec![8, 40],
            value_rank: 96,
            dtype: CacheDtype::Int4,
        };
        // 1 + 2 + 3 groups: a group started is a scale stored.
        assert_eq!(latent.scales_per_token(), 6);
        assert_eq!(
            latent.bytes_per_token(),
            (8 + 40 + 96) / 2 + 6 * SCALE_BYTES + POSITION_BYTES
        );
    }

    #[test]
    fn int8_layers_count_a_scale_per_vector() {
        let full = LayerLayout::Full {
            num_kv_heads: 2,
            head_dim: 128,
            dtype: CacheDtype::Int8,
        };
        // A key row and a value row per KV head, each with its half-precision scale.
        assert_eq!(full.bytes_per_token(), 2 * 2 * 128 + 4 * SCALE_BYTES);
        let latent = LayerLayout::LowRank {
            key_rank_per_head: vec![32, 48],
            value_rank: 96,
            dtype: CacheDtype::Int8,
        };
        assert_eq!(latent.vectors_per_token(), 3);
        assert_eq!(
            latent.bytes_per_token(),
            32 + 48 + 96 + 3 * SCALE_BYTES + POSITION_BYTES
        );
        // fp8 carries no scale: the same geometry costs the scales less.
        let fp8 = latent.with_dtype(CacheDtype::Fp8);
        assert_eq!(
            fp8.bytes_per_token() + 3 * SCALE_BYTES,
            latent.bytes_per_token()
        );
    }

    #[test]
    fn full_layer_counts_k_and_v() {
        let l = LayerLayout::Full {
            num_kv_heads: 8,
            head_dim: 128,
            dtype: CacheDtype::BF16,
        };
        assert_eq!(l.bytes_per_token(), 2 * 8 * 128 * 2);
    }

    #[test]
    fn low_rank_layer_sums_per_head_key_ranks_and_value_rank() {
        let l = LayerLayout::LowRank {
            key_rank_per_head: vec![16, 32, 8, 24],
            value_rank: 64,
            dtype: CacheDtype::F16,
        };
        assert_eq!(
            l.bytes_per_token(),
            (16 + 32 + 8 + 24 + 64) * 2 + POSITION_BYTES
        );
        assert_eq!(l.plane_widths(), (80, 64));
    }

    #[test]
    fn padded_ranks_round_up_to_the_stored_multiple() {
        let l = LayerLayout::low_rank_padded(&[1, 8, 9, 0], 17, CacheDtype::BF16);
        assert_eq!(
            l,
            LayerLayout::LowRank {
                key_rank_per_head: vec![8, 8, 16, 0],
                value_rank: 24,
                dtype: CacheDtype::BF16,
            }
        );
        assert_eq!(stored_rank(16), 16);
        assert_eq!(l.bytes_per_token(), (32 + 24) * 2 + POSITION_BYTES);
    }

    #[test]
    fn mixed_layers_sum() {
        let layout = CacheLayout {
            layers: vec![
                LayerLayout::Full {
                    num_kv_heads: 2,
                    head_dim: 4,
                    dtype: CacheDtype::F32,
                },
                LayerLayout::LowRank {
                    key_rank_per_head: vec![3, 5],
                    value_rank: 2,
                    dtype: CacheDtype::Fp8,
                },
            ],
        };
        assert_eq!(layout.bytes_per_token(), 64 + 10 + POSITION_BYTES);
        assert_eq!(layout.bytes_per_block(16), (74 + POSITION_BYTES) * 16);
        assert_eq!(layout.num_low_rank_layers(), 1);
        layout.validate().unwrap();
    }

    #[test]
    fn validate_refuses_empty_and_zero_byte_layers() {
        assert!(CacheLayout { layers: vec![] }.validate().is_err());
        let zero = CacheLayout::uniform(
            2,
            LayerLayout::LowRank {
                key_rank_per_head: vec![],
                value_rank: 0,
                dtype: CacheDtype::F16,
            },
        );
        assert!(matches!(zero.validate(), Err(KvError::InvalidConfig(_))));
    }
}
