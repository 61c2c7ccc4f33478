//! How a latent layer's decode rows split their context: a plan of its own, not the dense
//! layers'.
//!
//! The latent kernels (`kernels/latent.cu`) run two grids per layer: scores over
//! `rows × KV heads × splits` blocks, then weighted value latents over `rows × splits × value
//! column chunks`. The dense plan counts only the first (and only for the lighter dense decode
//! kernels), so at batch 1 on MHA it left the value kernel 64 blocks on 132 SMs (0.60 TB/s,
//! Nsight on the H100, session 35). This plan takes the fewest splits that give the score kernel
//! [`SCORE_TARGET_BLOCKS_PER_SM`] and the value kernel [`VALUE_TARGET_BLOCKS_PER_SM`] blocks per
//! SM, capped twice: splits stay [`LONG_SPLIT_TOKENS`] long where that still feeds both grids
//! (each split pays a fixed start), and no split is shorter than the point where the partials
//! (every query head's weighted latent per split, written then merged) cost more than
//! `1 / PARTIAL_TRAFFIC_SHARE` of the latent bytes it reads.
//!
//! MHA at 50% (32 heads, value latent 2048) writes 256 KB of partials per split, as much as 32
//! tokens of its cache: there the partials bound the splits of short contexts. The GQA shapes
//! (12 heads over a value latent of 128) barely feel it.
//!
//! A plan depends on the layer's shape ([`LatentSplitShape`]), the rows, the longest context and
//! the SM count alone, so an eager step and its graph replay split alike: a replay batch carries
//! one plan per distinct shape in its plan words (`batch.rs`), written per step from the same
//! function.

use super::attention_plan::SplitPlan;

/// Score blocks per SM the plan aims for: a score block reconstructs a tile of keys on the tensor
/// cores (latency-bound; 3 resident per SM at head width 128, 138 registers). Measured on the
/// H100 (session 36, `latent_plan_ab.sh`): 14 against 8 takes MHA 20 × 32k from 0.75× to 0.91×
/// of dense and Qwen2.5 1.5B 20 × 32k from 0.40× to 0.47×.
const SCORE_TARGET_BLOCKS_PER_SM: usize = 14;
/// Value blocks per SM the plan aims for: a value block streams its split's latents through a
/// ring of four 16-token tiles (~34 KB in flight).
const VALUE_TARGET_BLOCKS_PER_SM: usize = 3;
/// The partials of a split may cost at most this fraction (1 / n) of the latent bytes it reads.
/// Short contexts, where the bound binds, are latency-bound: half is cheap next to an idle grid.
const PARTIAL_TRAFFIC_SHARE: usize = 2;
/// Shortest split while the grids stay fed: a score block loads its `B_h` (head width × rank,
/// ~18 KB from L2) and fills its ring before its first key. Measured on the H100 (session 36,
/// `latent_plan_ab.sh`, one call): 256 against none, 512 and 768 — MHA 1 × 8k 0.117 ms against
/// 0.120, 0.145 and 0.143; Qwen 64 × 8k 0.386 against 0.403, 0.412 and 0.436.
const LONG_SPLIT_TOKENS: usize = 256;
/// Score blocks per SM below which long splits leave the score grid starved (three fit an SM at
/// head width 128: 138 registers per thread)...
const STARVED_SCORE_BLOCKS_PER_SM: usize = 3;
/// ... and value blocks per SM below which they leave the value grid starved.
const STARVED_VALUE_BLOCKS_PER_SM: usize = 1;
/// Every split but the last is a whole number of these keys (the score kernels' tile).
const SPLIT_KEY_MULTIPLE: usize = 64;
/// Most splits of one row (the partials and the replay grids are sized from the plan; the
/// combine walks any count).
pub(crate) const LATENT_MAX_SPLITS: usize = 256;
/// Set to `score,value,share,long` (the two targets in blocks per SM, the partials' share, the
/// long split in tokens, 0 for none) to move the plan's constants for A/B runs.
pub(crate) const LATENT_SPLIT_TUNING_ENV: &str = "STARLING_LATENT_SPLITS";

/// The plan's constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tuning {
    score_blocks_per_sm: usize,
    value_blocks_per_sm: usize,
    partial_share: usize,
    long_split_tokens: usize,
}

const DEFAULT_TUNING: Tuning = Tuning {
    score_blocks_per_sm: SCORE_TARGET_BLOCKS_PER_SM,
    value_blocks_per_sm: VALUE_TARGET_BLOCKS_PER_SM,
    partial_share: PARTIAL_TRAFFIC_SHARE,
    long_split_tokens: LONG_SPLIT_TOKENS,
};

/// The defaults, or the override in [`LATENT_SPLIT_TUNING_ENV`] (read once; an unreadable value
/// is logged and ignored).
fn tuning() -> Tuning {
    static VALUE: std::sync::OnceLock<Tuning> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| match std::env::var(LATENT_SPLIT_TUNING_ENV) {
        Ok(v) => parse_tuning(&v).unwrap_or_else(|| {
            tracing::warn!(
                "{LATENT_SPLIT_TUNING_ENV}={v:?} is not `score,value,share,long` (1..=64 each, \
                 long 0..=65536): using {DEFAULT_TUNING:?}"
            );
            DEFAULT_TUNING
        }),
        Err(_) => DEFAULT_TUNING,
    })
}

/// `score,value,share,long`: three counts in 1..=64 and a split length in 0..=65536.
fn parse_tuning(text: &str) -> Option<Tuning> {
    let mut parts = text.split(',').map(|s| s.trim().parse::<usize>().ok());
    let mut count = || parts.next()?.filter(|n| (1..=64).contains(n));
    let score_blocks_per_sm = count()?;
    let value_blocks_per_sm = count()?;
    let partial_share = count()?;
    let long_split_tokens = parts.next()??;
    let tuning = Tuning {
        score_blocks_per_sm,
        value_blocks_per_sm,
        partial_share,
        long_split_tokens,
    };
    (long_split_tokens <= 65536 && parts.next().is_none()).then_some(tuning)
}

/// M-tiles (16 query heads each) of the value kernel for `num_heads` heads over a value latent
/// of `value_width` columns: enough for the heads, and small enough that its `512 / m_tiles`
/// columns per block leave no warp without columns.
pub(crate) fn latent_value_m_tiles(num_heads: usize, value_width: usize) -> usize {
    let mut m_tiles = num_heads.div_ceil(16).max(1);
    while m_tiles < 4 && 512 / m_tiles > value_width.div_ceil(128) * 128 {
        m_tiles *= 2;
    }
    m_tiles
}

/// Value columns one value block takes at `m_tiles`.
pub(crate) fn latent_value_chunk_cols(m_tiles: usize) -> usize {
    512 / m_tiles.max(1)
}

/// What a latent layer's split plan depends on besides rows and context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LatentSplitShape {
    /// Score blocks per row and split.
    pub(crate) kv_heads: usize,
    /// Value blocks per row and split (column chunks of the value latent).
    pub(crate) value_chunks: usize,
    /// Shortest split (a multiple of [`SPLIT_KEY_MULTIPLE`]): below it the partials outweigh
    /// `1 / PARTIAL_TRAFFIC_SHARE` of the latent bytes read.
    pub(crate) min_split_tokens: usize,
}

impl LatentSplitShape {
    /// The shape of a layer of `num_heads` query heads over `num_kv_heads` key latents whose
    /// cache planes are `key_words` and `value_words` bf16 words per token (fp8 planes count
    /// half) with a value latent of `value_width` columns.
    pub(crate) fn new(
        num_heads: usize,
        num_kv_heads: usize,
        key_words: usize,
        value_words: usize,
        value_width: usize,
    ) -> Self {
        let chunk_cols = latent_value_chunk_cols(latent_value_m_tiles(num_heads, value_width));
        // Per split and row: every head's f32 partial of the value width plus its max and sum,
        // written by the value kernel and read by the combine.
        let partial_bytes = num_heads * (value_width + 2) * 4 * 2;
        let token_bytes = (2 * (key_words + value_words)).max(1);
        Self {
            kv_heads: num_kv_heads.max(1),
            value_chunks: value_width.div_ceil(chunk_cols).max(1),
            min_split_tokens: (tuning().partial_share * partial_bytes)
                .div_ceil(token_bytes)
                .max(1)
                .next_multiple_of(SPLIT_KEY_MULTIPLE),
        }
    }

    /// Splits that meet both targets at `rows` rows, before the context caps them.
    fn target_splits(&self, rows: usize, num_sms: usize) -> usize {
        let t = tuning();
        let rows = rows.max(1);
        let by_scores = (t.score_blocks_per_sm * num_sms).div_ceil(rows * self.kv_heads);
        let by_values = (t.value_blocks_per_sm * num_sms).div_ceil(rows * self.value_chunks);
        by_scores.max(by_values).max(1)
    }

    /// Most splits a context of `visible` tokens takes at `rows` rows: splits no shorter than
    /// the long split, unless that starves a grid — then as many more as feed both grids, down
    /// to the partials' bound. Never more as the rows grow, never fewer as the context grows.
    fn most_splits(&self, rows: usize, visible: usize, num_sms: usize) -> usize {
        let short = self.short_most_splits(visible);
        let long_tokens = tuning().long_split_tokens;
        if long_tokens == 0 {
            return short;
        }
        let long = (visible / long_tokens.max(self.min_split_tokens)).clamp(1, LATENT_MAX_SPLITS);
        let rows = rows.max(1);
        let fed = (STARVED_SCORE_BLOCKS_PER_SM * num_sms)
            .div_ceil(rows * self.kv_heads)
            .max((STARVED_VALUE_BLOCKS_PER_SM * num_sms).div_ceil(rows * self.value_chunks));
        long.max(fed.min(short))
    }

    /// Most splits the partials' bound allows a context of `visible` tokens.
    fn short_most_splits(&self, visible: usize) -> usize {
        (visible / self.min_split_tokens).clamp(1, LATENT_MAX_SPLITS)
    }

    /// The split of `rows` decode rows whose longest context is `max_visible_tokens`.
    pub(crate) fn plan(&self, rows: usize, max_visible_tokens: usize, num_sms: usize) -> SplitPlan {
        let visible = max_visible_tokens.max(1);
        let splits = self
            .target_splits(rows, num_sms)
            .min(self.most_splits(rows, visible, num_sms));
        if splits == 1 {
            return SplitPlan {
                splits: 1,
                split_len: visible,
            };
        }
        let split_len = visible
            .div_ceil(splits)
            .next_multiple_of(SPLIT_KEY_MULTIPLE);
        // Whole tiles per split can leave the last splits empty: recount.
        SplitPlan {
            splits: visible.div_ceil(split_len),
            split_len,
        }
    }

    /// Most splits any step of at least `fewest_rows` rows and at most `max_visible_tokens` of
    /// context plans: the targets fall with the rows, every cap is at most the partials' bound,
    /// which grows with the context, and the recount never adds a split.
    pub(crate) fn split_bound(
        &self,
        fewest_rows: usize,
        max_visible_tokens: usize,
        num_sms: usize,
    ) -> usize {
        self.target_splits(fewest_rows, num_sms)
            .min(self.short_most_splits(max_visible_tokens.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prior work's MHA shape at 50%: 32 heads × 128, key rank 64 per head, value latent
    /// 2048 (bf16).
    fn mha() -> LatentSplitShape {
        LatentSplitShape::new(32, 32, 32 * 64, 2048, 2048)
    }

    /// Qwen2.5-Coder-1.5B's balanced shape: 12 query heads over 2 KV heads, key rank 64 each,
    /// value latent 128.
    fn qwen() -> LatentSplitShape {
        LatentSplitShape::new(12, 2, 128, 128, 128)
    }

    #[test]
    fn shapes_count_their_blocks_and_shortest_split() {
        // 32 heads: two m-tiles, 256 columns a block, 8 chunks; partials 32 × 2050 × 8 bytes
        // per split against 8 KB a token: 64 tokens, ×2 → 128.1 → 192.
        assert_eq!(
            mha(),
            LatentSplitShape {
                kv_heads: 32,
                value_chunks: 8,
                min_split_tokens: 192
            }
        );
        // 12 heads over 128 columns: four m-tiles of 128 columns, one chunk; 12 × 130 × 8 × 2 /
        // 512 = 48.75 → 64.
        assert_eq!(
            qwen(),
            LatentSplitShape {
                kv_heads: 2,
                value_chunks: 1,
                min_split_tokens: 64
            }
        );
    }

    #[test]
    fn batch_one_fills_both_grids_where_the_dense_plan_left_them_starved() {
        // 132 SMs: scores want 1848 / 32 → 58 splits, values 396 / 8 → 50; long splits allow
        // 128 → 58, rounded to whole tiles of 576 keys: 57.
        let p = mha().plan(1, 32 * 1024, 132);
        assert_eq!(
            p,
            SplitPlan {
                splits: 57,
                split_len: 576
            }
        );
        // Seven times the value blocks of the dense plan's 8 splits.
        assert_eq!(p.splits * mha().value_chunks, 456);
        // At 4k long splits (16) would starve the value grid: 17 feed it (rounded: 16 of 256),
        // within the partials' bound (4096 / 192 = 21).
        let p = mha().plan(1, 4096, 132);
        assert_eq!(
            p,
            SplitPlan {
                splits: 16,
                split_len: 256
            }
        );
        assert!(p.split_len >= mha().min_split_tokens);
        // GQA at batch 1: two score blocks per split; 198 splits make three per SM.
        assert_eq!(
            qwen().plan(1, 32 * 1024, 132),
            SplitPlan {
                splits: 171,
                split_len: 192
            }
        );
    }

    #[test]
    fn fed_grids_take_long_splits_and_full_grids_do_not_split() {
        // Qwen at 20 × 32k: the score target (47 splits of 704 keys) within the long splits.
        assert_eq!(
            qwen().plan(20, 32 * 1024, 132),
            SplitPlan {
                splits: 47,
                split_len: 704
            }
        );
        // At 16 × 8k the target (58) would cut 160-key splits; long ones (32) feed both grids.
        assert_eq!(
            qwen().plan(16, 8192, 132),
            SplitPlan {
                splits: 32,
                split_len: 256
            }
        );
        // MHA at 20 × 32k: three splits meet both targets.
        assert_eq!(mha().plan(20, 32 * 1024, 132).splits, 3);
        // 256 rows × 32 KV heads fill any target at once.
        assert_eq!(
            mha().plan(256, 32 * 1024, 132),
            SplitPlan {
                splits: 1,
                split_len: 32 * 1024
            }
        );
    }

    proptest::proptest! {
        /// What the kernels and the replay buffers rely on, for any shape: every plan covers the
        /// context with no empty split, stays within the bucket bound that sizes a replay's
        /// grids and partials (any rows from the bucket's fewest, any context up to the
        /// longest), and never plans more splits for more rows.
        #[test]
        fn plans_cover_the_context_and_stay_within_the_bound(
            kv_heads in 1usize..=32,
            group in 1usize..=8,
            key_rank in 1usize..=16,
            value_width in 1usize..=512,
            fewest_rows in 1usize..=300,
            extra_rows in 0usize..=200,
            max_len in 1usize..=140_000,
            visible_share in 0.0f64..=1.0,
            num_sms in 1usize..=200,
        ) {
            let heads = kv_heads * group;
            let value_width = 8 * value_width;
            let shape = LatentSplitShape::new(
                heads,
                kv_heads,
                kv_heads * 8 * key_rank,
                value_width,
                value_width,
            );
            let rows = fewest_rows + extra_rows;
            let visible = (max_len as f64 * visible_share) as usize;
            let bound = shape.split_bound(fewest_rows, max_len, num_sms);
            let p = shape.plan(rows, visible, num_sms);
            proptest::prop_assert!(p.splits >= 1 && p.splits <= LATENT_MAX_SPLITS, "{:?}", p);
            proptest::prop_assert!(p.splits * p.split_len >= visible.max(1), "{:?}", p);
            proptest::prop_assert!((p.splits - 1) * p.split_len < visible.max(1), "{:?}", p);
            proptest::prop_assert!(p.splits <= bound, "{:?} > {}", p, bound);
            proptest::prop_assert!(shape.plan(rows + 1, visible, num_sms).splits <= p.splits);
        }
    }

    #[test]
    fn the_tuning_override_parses_four_numbers() {
        let t = |s, v, p, l| Tuning {
            score_blocks_per_sm: s,
            value_blocks_per_sm: v,
            partial_share: p,
            long_split_tokens: l,
        };
        assert_eq!(parse_tuning("4,1,2,0"), Some(t(4, 1, 2, 0)));
        assert_eq!(parse_tuning(" 16 , 8 ,4, 512"), Some(t(16, 8, 4, 512)));
        for bad in [
            "",
            "4",
            "4,2,2",
            "0,2,2,0",
            "4,65,2,0",
            "a,b,c,d",
            "4,2,1,70000",
            "4,2,1,1,1",
        ] {
            assert_eq!(parse_tuning(bad), None, "{bad}");
        }
    }
}
