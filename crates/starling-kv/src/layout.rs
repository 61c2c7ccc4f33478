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
}

impl CacheDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            CacheDtype::F32 => 4,
            CacheDtype::F16 | CacheDtype::BF16 => 2,
            CacheDtype::Fp8 => 1,
        }
    }
}

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
    /// differ per head) plus one value latent shared by the layer.
    LowRank {
        /// Latent rank of each KV head's keys.
        key_rank_per_head: Vec<usize>,
        /// Rank of the layer's value latent.
        value_rank: usize,
        /// Element type.
        dtype: CacheDtype,
    },
}

impl LayerLayout {
    /// Elements one token stores in this layer.
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

    /// Element type of the layer.
    pub fn dtype(&self) -> CacheDtype {
        match self {
            LayerLayout::Full { dtype, .. } | LayerLayout::LowRank { dtype, .. } => *dtype,
        }
    }

    /// Bytes one token occupies in this layer (saturating: absurd configs
    /// become "too big", never wrap around).
    pub fn bytes_per_token(&self) -> u64 {
        self.elements_per_token()
            .saturating_mul(self.dtype().bytes())
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
        if let Some(i) = self.layers.iter().position(|l| l.bytes_per_token() == 0) {
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
        assert_eq!(CacheDtype::F32.bytes(), 4);
        assert_eq!(CacheDtype::F16.bytes(), 2);
        assert_eq!(CacheDtype::BF16.bytes(), 2);
        assert_eq!(CacheDtype::Fp8.bytes(), 1);
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
        assert_eq!(l.bytes_per_token(), (16 + 32 + 8 + 24 + 64) * 2);
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
        assert_eq!(layout.bytes_per_token(), 64 + 10);
        assert_eq!(layout.bytes_per_block(16), 74 * 16);
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
