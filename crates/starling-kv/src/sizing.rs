//! Turning a memory budget into a block count, and the pre-flight check that
//! refuses to start when not even one full-length sequence fits (vLLM's rule).

use crate::error::KvError;
use crate::layout::CacheLayout;

/// How a budget is cut into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSizing {
    /// Blocks that fit in the budget.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// Bytes of one block across all layers.
    pub bytes_per_block: u64,
    /// Bytes of one token across all layers.
    pub bytes_per_token: u64,
}

impl CacheSizing {
    /// As many whole blocks of `layout` as fit in `budget_bytes`.
    ///
    /// The count is capped so that every flat slot index fits in a `u32`
    /// (the slot mapping's type); that cap is ~4 billion token slots.
    pub fn from_budget(
        budget_bytes: u64,
        layout: &CacheLayout,
        block_size_tokens: usize,
    ) -> Result<Self, KvError> {
        if block_size_tokens == 0 {
            return Err(KvError::InvalidConfig(
                "block size must be > 0 tokens".into(),
            ));
        }
        layout.validate()?;
        let bytes_per_token = layout.bytes_per_token();
        let bytes_per_block = layout.bytes_per_block(block_size_tokens);
        let max_blocks =
            ((u32::MAX as u64 + 1) / block_size_tokens as u64).min(u32::MAX as u64 - 1);
        let num_blocks = (budget_bytes / bytes_per_block).min(max_blocks);
        Ok(Self {
            // At most u32::MAX - 1, so it fits usize on every supported target.
            num_blocks: num_blocks as usize,
            block_size_tokens,
            bytes_per_block,
            bytes_per_token,
        })
    }

    /// Token slots across all blocks.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size_tokens)
    }

    /// Bytes the blocks occupy (at most the budget).
    pub fn total_bytes(&self) -> u64 {
        (self.num_blocks as u64).saturating_mul(self.bytes_per_block)
    }

    /// Blocks one sequence of `len_tokens` tokens needs.
    pub fn blocks_for_tokens(&self, len_tokens: usize) -> usize {
        len_tokens.div_ceil(self.block_size_tokens)
    }
}

/// The outcome of a successful pre-flight check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preflight {
    /// The block sizing to build the cache with.
    pub sizing: CacheSizing,
    /// Token slots one `max_model_len` sequence holds at its peak: the maximum model length,
    /// or fewer when token eviction keeps fewer (kept tokens + one chunk in flight).
    pub peak_tokens: usize,
    /// Token capacity divided by [`peak_tokens`](Self::peak_tokens): how many
    /// full-length sequences fit at once (as vLLM prints it, fractional; under eviction the
    /// compressed sequences).
    pub max_concurrency: f64,
}

/// Sizes the cache for `budget_bytes` and refuses (with
/// [`KvError::InsufficientMemory`]) if one sequence of `max_model_len_tokens`
/// would not fit, counting whole blocks as the allocator does.
pub fn preflight(
    budget_bytes: u64,
    layout: &CacheLayout,
    block_size_tokens: usize,
    max_model_len_tokens: usize,
) -> Result<Preflight, KvError> {
    preflight_with_peak(
        budget_bytes,
        layout,
        block_size_tokens,
        max_model_len_tokens,
        max_model_len_tokens,
    )
}

/// [`preflight`] for sequences that hold at most `peak_tokens` slots at once although they
/// reach `max_model_len_tokens` positions (token eviction: the kept tokens plus what arrives
/// between two compactions). `peak_tokens` is clamped to `1..=max_model_len_tokens`.
pub fn preflight_with_peak(
    budget_bytes: u64,
    layout: &CacheLayout,
    block_size_tokens: usize,
    max_model_len_tokens: usize,
    peak_tokens: usize,
) -> Result<Preflight, KvError> {
    if max_model_len_tokens == 0 {
        return Err(KvError::InvalidConfig(
            "max_model_len must be > 0 tokens".into(),
        ));
    }
    let peak_tokens = peak_tokens.clamp(1, max_model_len_tokens);
    let sizing = CacheSizing::from_budget(budget_bytes, layout, block_size_tokens)?;
    let blocks_per_seq = sizing.blocks_for_tokens(peak_tokens);
    if blocks_per_seq > sizing.num_blocks {
        return Err(KvError::InsufficientMemory {
            needed_bytes: (blocks_per_seq as u64).saturating_mul(sizing.bytes_per_block),
            available_bytes: budget_bytes,
            max_model_len_tokens,
            peak_tokens,
        });
    }
    Ok(Preflight {
        sizing,
        peak_tokens,
        max_concurrency: sizing.capacity_tokens() as f64 / peak_tokens as f64,
    })
}

/// [`preflight`] for a cache of several block-table groups ([`crate::CacheGroups`]): `layout`
/// is what one block holds (one entry per cache tensor), and one `max_model_len` sequence
/// holds `blocks_per_seq` blocks at its peak over all groups. Refuses as [`preflight`] does;
/// [`Preflight::peak_tokens`] is the length, and the concurrency counts blocks.
pub fn preflight_grouped(
    budget_bytes: u64,
    layout: &CacheLayout,
    block_size_tokens: usize,
    max_model_len_tokens: usize,
    blocks_per_seq: usize,
) -> Result<Preflight, KvError> {
    if max_model_len_tokens == 0 || blocks_per_seq == 0 {
        return Err(KvError::InvalidConfig(
            "max_model_len must be > 0 tokens".into(),
        ));
    }
    let sizing = CacheSizing::from_budget(budget_bytes, layout, block_size_tokens)?;
    if blocks_per_seq > sizing.num_blocks {
        return Err(KvError::InsufficientMemory {
            needed_bytes: (blocks_per_seq as u64).saturating_mul(sizing.bytes_per_block),
            available_bytes: budget_bytes,
            max_model_len_tokens,
            peak_tokens: max_model_len_tokens,
        });
    }
    Ok(Preflight {
        sizing,
        peak_tokens: max_model_len_tokens,
        max_concurrency: sizing.num_blocks as f64 / blocks_per_seq as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{GIB, MIB};
    use crate::layout::{CacheDtype, LayerLayout};

    fn full(num_layers: usize) -> CacheLayout {
        // 2 * 8 * 128 * 2 = 4096 bytes per token per layer.
        CacheLayout::uniform(
            num_layers,
            LayerLayout::Full {
                num_kv_heads: 8,
                head_dim: 128,
                dtype: CacheDtype::BF16,
            },
        )
    }

    /// Two fp8 bytes per token: a key and a value of one element (the smallest full layout).
    fn two_bytes_per_token() -> CacheLayout {
        CacheLayout::uniform(
            1,
            LayerLayout::Full {
                num_kv_heads: 1,
                head_dim: 1,
                dtype: CacheDtype::Fp8,
            },
        )
    }

    #[test]
    fn from_budget_counts_whole_blocks() {
        let layout = full(2); // 8 KiB per token
        let s = CacheSizing::from_budget(10 * 16 * 8192 + 5, &layout, 16).unwrap();
        assert_eq!(s.bytes_per_token, 8192);
        assert_eq!(s.bytes_per_block, 16 * 8192);
        assert_eq!(s.num_blocks, 10);
        assert_eq!(s.capacity_tokens(), 160);
        assert_eq!(s.total_bytes(), 10 * 16 * 8192);
    }

    #[test]
    fn low_rank_with_half_the_bytes_yields_twice_the_blocks() {
        let budget = 64 * MIB;
        let full_layout = full(4); // 4096 B per token per layer
                                   // 16 heads * 48 + 254 = 1022 elements * 2 B + 4 B of position = 2048 B per layer: half.
        let low_rank = CacheLayout::uniform(
            4,
            LayerLayout::LowRank {
                key_rank_per_head: vec![48; 16],
                value_rank: 254,
                dtype: CacheDtype::BF16,
            },
        );
        assert_eq!(
            low_rank.bytes_per_token() * 2,
            full_layout.bytes_per_token()
        );
        let a = CacheSizing::from_budget(budget, &full_layout, 16).unwrap();
        let b = CacheSizing::from_budget(budget, &low_rank, 16).unwrap();
        assert_eq!(a.num_blocks, 256);
        assert_eq!(b.num_blocks, 2 * a.num_blocks);
    }

    #[test]
    fn eviction_peak_boots_where_the_full_length_refuses() {
        // 128 KiB per token; 8192 tokens need 1 GiB, a quarter of them 256 MiB.
        let layout = full(32);
        let budget = 300 * MIB;
        assert!(matches!(
            preflight(budget, &layout, 16, 8192),
            Err(KvError::InsufficientMemory {
                peak_tokens: 8192,
                ..
            })
        ));
        let ok = preflight_with_peak(budget, &layout, 16, 8192, 2048 + 64).unwrap();
        assert_eq!(ok.peak_tokens, 2112);
        assert!((ok.max_concurrency - ok.sizing.capacity_tokens() as f64 / 2112.0).abs() < 1e-12);
        let err = preflight_with_peak(100 * MIB, &layout, 16, 8192, 2112).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("holding 2112 tokens at its peak"), "{msg}");
        // The peak never exceeds the length itself.
        assert_eq!(
            preflight_with_peak(2 * GIB, &layout, 16, 8192, 1 << 20)
                .unwrap()
                .peak_tokens,
            8192
        );
    }

    #[test]
    fn preflight_refuses_with_the_right_numbers() {
        // 32 layers * 4096 B = 128 KiB per token; 8192 tokens = 1 GiB.
        let layout = full(32);
        let budget = 3 * GIB / 4;
        let err = preflight(budget, &layout, 16, 8192).unwrap_err();
        assert_eq!(
            err,
            KvError::InsufficientMemory {
                needed_bytes: GIB,
                available_bytes: budget,
                max_model_len_tokens: 8192,
                peak_tokens: 8192,
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("1.00 GiB"), "{msg}");
        assert!(msg.contains("0.75 GiB"), "{msg}");
        assert!(msg.contains("8192-token"), "{msg}");
        assert!(msg.contains(&GIB.to_string()), "{msg}");
        assert!(!msg.contains("peak"), "{msg}");
    }

    #[test]
    fn preflight_counts_the_partial_last_block() {
        // 2 B per token; block of 16 tokens = 32 B. A 17-token sequence needs
        // 2 blocks = 64 B, so a 63-byte budget (1 block) is not enough.
        let layout = two_bytes_per_token();
        assert!(matches!(
            preflight(63, &layout, 16, 17),
            Err(KvError::InsufficientMemory {
                needed_bytes: 64,
                available_bytes: 63,
                ..
            })
        ));
        let ok = preflight(64, &layout, 16, 17).unwrap();
        assert_eq!(ok.sizing.num_blocks, 2);
    }

    #[test]
    fn preflight_reports_max_concurrency() {
        let layout = full(32); // 128 KiB per token
        let ok = preflight(5 * GIB / 2, &layout, 16, 8192).unwrap();
        assert_eq!(ok.sizing.capacity_tokens(), 20480);
        assert!((ok.max_concurrency - 2.5).abs() < 1e-12);
    }

    #[test]
    fn preflight_refuses_bad_config() {
        let layout = full(1);
        assert!(matches!(
            preflight(GIB, &layout, 0, 10),
            Err(KvError::InvalidConfig(_))
        ));
        assert!(matches!(
            preflight(GIB, &layout, 16, 0),
            Err(KvError::InvalidConfig(_))
        ));
    }

    #[test]
    fn slot_index_cap_applies() {
        let layout = two_bytes_per_token();
        let s = CacheSizing::from_budget(u64::MAX, &layout, 1 << 20).unwrap();
        assert_eq!(s.num_blocks, 1 << 12);
    }
}
