//! What an allocation costs and saves: KV cache per token, and projection parameters.

use serde::{Deserialize, Serialize};
use starling_kv::CacheDtype;

use crate::RankAllocation;

/// Cache and parameter figures of one allocation, as recorded in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressionReport {
    /// Element type the byte figures assume.
    pub cache_dtype: CacheDtype,
    /// K/V elements per token, all layers, uncompressed model.
    pub kv_elements_per_token_original: u64,
    /// K/V (latent) elements per token, all layers, with this allocation.
    pub kv_elements_per_token_compressed: u64,
    /// `kv_elements_per_token_original × dtype bytes`.
    pub kv_bytes_per_token_original: u64,
    /// `kv_elements_per_token_compressed × dtype bytes`.
    pub kv_bytes_per_token_compressed: u64,
    /// Share of K/V cache bytes per token removed, `1 − compressed / original`.
    pub kv_removed_share: f64,
    /// Parameters of every layer's `W_k` and `W_v`, `2 · kv_size · hidden` per layer.
    pub projection_params_original: u64,
    /// Parameters of the factors: `r (m + n)` per factor of an `m × n` map, uncompressed
    /// layers at their original `m · n`.
    pub projection_params_compressed: u64,
    /// The parameter compression rate `C = 1 − compressed / original`. Negative when the
    /// factors hold more parameters than the maps they replace (ranks above `m n / (m + n)`),
    /// which can happen at mild profiles; the cache still shrinks.
    pub parameter_compression_rate: f64,
}

impl CompressionReport {
    /// The figures of `allocation` with a cache of `cache_dtype` elements.
    pub fn of(allocation: &RankAllocation, cache_dtype: CacheDtype) -> Self {
        let shape = allocation.shape();
        let hidden = shape.hidden_size as u64;
        let head_dim = shape.head_dim as u64;
        let kv_size = shape.kv_size() as u64;
        let full_layer_params = 2 * kv_size * hidden;
        let compressed_params: u64 = allocation
            .layers()
            .iter()
            .map(|ranks| match ranks {
                None => full_layer_params,
                Some(r) => {
                    let keys: u64 = r.key_ranks.iter().map(|&k| k as u64).sum();
                    keys * (head_dim + hidden) + r.value_rank as u64 * (kv_size + hidden)
                }
            })
            .sum();
        let original_params = full_layer_params * shape.num_layers as u64;
        let original = shape.full_layer_elements() * shape.num_layers as u64;
        let compressed = allocation.elements_per_token();
        Self {
            cache_dtype,
            kv_elements_per_token_original: original,
            kv_elements_per_token_compressed: compressed,
            kv_bytes_per_token_original: cache_dtype.bytes_for(original),
            kv_bytes_per_token_compressed: cache_dtype.bytes_for(compressed),
            kv_removed_share: 1.0 - compressed as f64 / original.max(1) as f64,
            projection_params_original: original_params,
            projection_params_compressed: compressed_params,
            parameter_compression_rate: 1.0
                - compressed_params as f64 / original_params.max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvShape, LayerRanks};

    #[test]
    fn figures_of_a_hand_built_allocation() {
        let shape = KvShape {
            hidden_size: 10,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 4,
        };
        let ranks = LayerRanks {
            key_ranks: vec![1, 2],
            value_rank: 3,
        };
        let allocation = RankAllocation::new(shape, vec![None, Some(ranks)]).unwrap();
        let report = CompressionReport::of(&allocation, CacheDtype::BF16);
        assert_eq!(report.kv_elements_per_token_original, 32);
        assert_eq!(report.kv_elements_per_token_compressed, 16 + 6);
        assert_eq!(report.kv_bytes_per_token_compressed, 44);
        assert!((report.kv_removed_share - 10.0 / 32.0).abs() < 1e-12);
        // Original: 2 layers × 2 × 8 × 10 = 320. Compressed: 160 + 3·(4+10) + 3·(8+10) = 256.
        assert_eq!(report.projection_params_original, 320);
        assert_eq!(report.projection_params_compressed, 256);
        assert!((report.parameter_compression_rate - 0.2).abs() < 1e-12);
        // The cache stores ranks in multiples of 8 (here [8, 8] and 8) and each token's
        // position: 32 B of the full layer + 24 · 2 + 4.
        let layout = allocation.cache_layout(CacheDtype::BF16);
        assert_eq!(layout.bytes_per_token(), 32 + 48 + 4);
    }
}
