//! Which attention kernel serves which query rows, and how the context is split.
//!
//! A step's rows come in runs, one per sequence. A run of one token (decode) goes to a decode
//! kernel: the tensor-core one (`decode_attention.cu`) for grouped-query models, the per-token one
//! (`attention.cu`) for MHA and other head widths (the backend picks, [`DecodeKernel`]); a run of
//! two or more (a prefill chunk) is cut into query tiles of consecutive tokens for the tiled
//! tensor-core kernel (`prefill_attention.cu`), which loads each K/V tile once for all of a tile's
//! rows. The tiles are built on the host when the batch is
//! prepared, once per possible group size (the batch does not know the model's), and uploaded with
//! the rest of the step's metadata.

use starling_backend::BatchMeta;

use crate::geometry::{PREFILL_RESIDENT_PER_SM, PREFILL_TILE_KEYS, PREFILL_TILE_ROWS};

/// Largest group (query heads per KV head) either kernel takes.
pub(crate) const MAX_GROUP: usize = 8;

/// Resident blocks per SM the split aims for with per-token (decode) blocks only: decode is bound
/// by bytes in flight, and small blocks need many of them.
const DECODE_TARGET_BLOCKS_PER_SM: usize = 8;
/// The same for tiled prefill blocks, which are many times the work of a decode block per key
/// and hold more registers and shared memory (two are resident per SM).
const PREFILL_TARGET_BLOCKS_PER_SM: usize = 4;
/// Shortest split of the tensor-core decode kernel (a ring of K/V tiles per block).
pub(crate) const DECODE_MIN_SPLIT_TOKENS: usize = 256;
/// Shortest split with per-token decode rows only. Such a block walks its keys a few rows at a
/// time, one memory round trip each, so a small batch at a short context is latency-bound: at
/// batch 1 and 512 tokens, splits of 256 (3 blocks per head) took 16 µs for 8 MB (Nsight
/// Compute on the H200). The partials are small (head_dim + 2 floats per row and split).
pub(crate) const PER_TOKEN_MIN_SPLIT_TOKENS: usize = 64;
/// Shortest split once prefill tiles take part: each split of a tile writes a partial of every
/// row (128 rows × (head_dim + 2) f32), so splits must be long enough to amortise it.
const PREFILL_MIN_SPLIT_TOKENS: usize = 512;
/// Most splits of one (row, KV head), unless [`MAX_SPLITS_ENV`] says otherwise.
const MAX_SPLITS: usize = 64;
/// Set to a split count (1..=[`MAX_SPLITS_CEILING`]) to move [`MAX_SPLITS`] for A/B runs: at
/// batch-1 decode over a long context the tensor-core decode kernel's wave plan wants more
/// splits than 64 (two KV heads × 64 splits are 128 blocks, one per SM of an H100).
pub(crate) const MAX_SPLITS_ENV: &str = "STARLING_ATTENTION_MAX_SPLITS";
/// Highest value [`MAX_SPLITS_ENV`] takes (the split combine walks any count; partials and
/// graph buckets are sized from the plan).
const MAX_SPLITS_CEILING: usize = 256;

/// [`MAX_SPLITS`], or the override in [`MAX_SPLITS_ENV`] (read once; an unreadable or
/// out-of-range value is logged and ignored).
fn max_splits() -> usize {
    static VALUE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| match std::env::var(MAX_SPLITS_ENV) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_SPLITS_CEILING).contains(&n) => n,
            _ => {
                tracing::warn!(
                    "{MAX_SPLITS_ENV}={v:?} is not a split count in 1..={MAX_SPLITS_CEILING}: \
                     using {MAX_SPLITS}"
                );
                MAX_SPLITS
            }
        },
        Err(_) => MAX_SPLITS,
    })
}
/// Least fill of the waves (numerator, denominator) a wave plan ([`plan_wave_splits`]) accepts
/// before it tries more splits.
const WAVE_FILL: (usize, usize) = (9, 10);
/// Most decode rows of an MHA layer the tensor-core decode kernel serves. A few rows make few
/// per-token blocks, each walking its keys two rows (one memory round trip) at a time: at batch 1
/// that kernel plus its combine took 14 µs per layer at 512 tokens and 30 µs at 2k (Nsight
/// Compute, `bench kernels`), while the tensor-core kernel keeps two 64-key tiles in flight per
/// block (its M rows are then mostly padding, which a memory-bound step can spare). At batch ≥ 16
/// the per-token kernel is measured at 78–103% of copy, so it keeps those. A power of two, so
/// every CUDA-graph bucket (1, 2, 4, 8, …) lies wholly on one side and replay records the kernel
/// eager steps of its rows choose.
pub(crate) const MMA_MHA_MAX_DECODE_ROWS: usize = 4;

/// Which kernel serves a layer's decode rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeKernel {
    /// `attention.cu`: one lane-parallel dot product per K row and query head. Wins for MHA (it
    /// already beats FlashAttention-2 there) and serves head widths the tensor-core kernel lacks.
    PerToken,
    /// `decode_attention.cu`: the group's query heads as the M rows of `mma.sync`.
    Mma,
}

impl DecodeKernel {
    /// The tensor-core kernel where it exists for the head width on this device, for groups of
    /// two or more query heads per KV head, and for MHA at up to [`MMA_MHA_MAX_DECODE_ROWS`]
    /// decode rows; the per-token kernel otherwise.
    pub(crate) fn choose(group: usize, decode_rows: usize, mma_available: bool) -> Self {
        if mma_available && (group >= 2 || decode_rows <= MMA_MHA_MAX_DECODE_ROWS) {
            Self::Mma
        } else {
            Self::PerToken
        }
    }
}

/// The step's query rows, ordered for the kernels, and the prefill tiles per group size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttentionRows {
    /// Every row once: the decode rows (runs of one token) first, then the prefill rows. The
    /// per-token kernel reads `row_order[blockIdx.x]`: the first `num_decode` entries when the
    /// tiled kernel serves the prefill rows, all of them when it cannot (unsupported head width).
    pub(crate) row_order: Vec<u32>,
    /// Decode rows at the front of `row_order`.
    pub(crate) num_decode: usize,
    /// `(first row, rows)` pairs, flattened; the tiles for group `g` are pairs
    /// `tile_ranges[g - 1].0 .. + tile_ranges[g - 1].1`, the most context first (the prefill
    /// kernel's block `i` takes pair `i`, and blocks start roughly in index order: a prompt's
    /// last tiles, which attend to the most keys, start first and the light ones fill the tail,
    /// as FlashAttention schedules causal tiles).
    pub(crate) tiles: Vec<u32>,
    /// `(first pair, pairs)` of each group size `1..=MAX_GROUP` in `tiles`.
    pub(crate) tile_ranges: [(usize, usize); MAX_GROUP],
}

impl AttentionRows {
    /// Splits the rows of a validated batch (sequences own contiguous, non-empty row ranges).
    pub(crate) fn new(meta: &BatchMeta) -> Self {
        let mut decode = Vec::new();
        let mut prefill = Vec::new();
        // (first row, rows, context before the run's first token) of each prefill run.
        let mut runs = Vec::new();
        for seq in &meta.seqs {
            let (start, len) = (seq.query_start as u32, seq.query_len as u32);
            if len == 1 {
                decode.push(start);
            } else if len > 1 {
                prefill.extend(start..start + len);
                let before = seq.context_len_tokens.saturating_sub(seq.query_len) as u32;
                runs.push((start, len, before));
            }
        }
        let num_decode = decode.len();
        let mut row_order = decode;
        row_order.extend(prefill);
        let mut tiles = Vec::new();
        let mut tile_ranges = [(0, 0); MAX_GROUP];
        for (g, range) in (1..=MAX_GROUP).zip(tile_ranges.iter_mut()) {
            let tile_tokens = (PREFILL_TILE_ROWS / g) as u32;
            let first_pair = tiles.len() / 2;
            // (keys its last token sees, first row, rows): a tile's work grows with the former.
            let mut group_tiles = Vec::new();
            for &(start, len, before) in &runs {
                let mut done = 0;
                while done < len {
                    let rows = tile_tokens.min(len - done);
                    group_tiles.push((before + done + rows, start + done, rows));
                    done += rows;
                }
            }
            // Stable: equal tiles keep their row order.
            group_tiles.sort_by_key(|&(keys, _, _)| std::cmp::Reverse(keys));
            tiles.extend(
                group_tiles
                    .iter()
                    .flat_map(|&(_, start, rows)| [start, rows]),
            );
            *range = (first_pair, tiles.len() / 2 - first_pair);
        }
        Self {
            row_order,
            num_decode,
            tiles,
            tile_ranges,
        }
    }

    /// Rows served by the tiled kernel when it is used.
    pub(crate) fn num_prefill(&self) -> usize {
        self.row_order.len() - self.num_decode
    }
}

/// How the context of every row is cut for the launches: split `s` covers context positions
/// `[s * split_len, (s + 1) * split_len)`; with `splits > 1` the kernels write partials that
/// `attention_combine_bf16` merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitPlan {
    /// Context splits per (row, KV head).
    pub(crate) splits: usize,
    /// Context positions per split.
    pub(crate) split_len: usize,
}

/// The unsplit blocks of one attention call's launches (rows or tiles × KV heads). Decode rows go
/// to one of the two decode kernels, never both: `per_token` or `mma` is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GridBlocks {
    /// Blocks of the per-token kernel (`attention.cu`).
    pub(crate) per_token: usize,
    /// Blocks of the tensor-core decode kernel (`decode_attention.cu`).
    pub(crate) mma: usize,
    /// Resident tensor-core decode blocks per SM (the driver's occupancy figure); any value when
    /// `mma` is zero.
    pub(crate) mma_resident_per_sm: usize,
    /// Blocks of the tiled prefill kernel (`prefill_attention.cu`, or a Hopper one in its
    /// place).
    pub(crate) prefill: usize,
    /// Resident blocks per SM of the prefill kernel that runs (the driver's occupancy figure:
    /// one for the warp-specialised Hopper kernel); `None`: [`PREFILL_RESIDENT_PER_SM`], the
    /// mma.sync kernel's.
    pub(crate) prefill_resident_per_sm: Option<usize>,
}

/// Flash-decoding split of long contexts until the grid fills the GPU. Each kernel's blocks count
/// by its own resident-blocks target, so a batch without tensor-core decode blocks splits exactly
/// as before that kernel existed. A batch of tensor-core decode blocks only is planned by waves
/// ([`plan_wave_splits`]), and so is a batch of tiled prefill blocks only.
pub(crate) fn plan_splits(
    blocks: GridBlocks,
    max_visible_tokens: usize,
    num_sms: usize,
) -> SplitPlan {
    let num_sms = num_sms.max(1);
    let resident = blocks.mma_resident_per_sm.max(1);
    if blocks.per_token == 0 && blocks.prefill == 0 && blocks.mma > 0 {
        return plan_wave_splits(
            blocks.mma,
            max_visible_tokens,
            num_sms * resident,
            DECODE_MIN_SPLIT_TOKENS,
            1,
        );
    }
    if blocks.per_token == 0 && blocks.mma == 0 && blocks.prefill > 0 {
        return plan_wave_splits(
            blocks.prefill,
            max_visible_tokens,
            num_sms
                * blocks
                    .prefill_resident_per_sm
                    .unwrap_or(PREFILL_RESIDENT_PER_SM)
                    .max(1),
            PREFILL_MIN_SPLIT_TOKENS,
            PREFILL_TILE_KEYS,
        );
    }
    // Load and capacity in units of 1 / (DECODE × PREFILL × resident) of an SM's blocks.
    let load = blocks.per_token * PREFILL_TARGET_BLOCKS_PER_SM * resident
        + blocks.prefill * DECODE_TARGET_BLOCKS_PER_SM * resident
        + blocks.mma * DECODE_TARGET_BLOCKS_PER_SM * PREFILL_TARGET_BLOCKS_PER_SM;
    let capacity = DECODE_TARGET_BLOCKS_PER_SM * PREFILL_TARGET_BLOCKS_PER_SM * resident * num_sms;
    let min_split = if blocks.prefill > 0 {
        PREFILL_MIN_SPLIT_TOKENS
    } else if blocks.mma > 0 {
        DECODE_MIN_SPLIT_TOKENS
    } else {
        PER_TOKEN_MIN_SPLIT_TOKENS
    };
    let splits = if load > 0 && load < capacity && max_visible_tokens > min_split {
        capacity
            .div_ceil(load)
            .min(max_visible_tokens.div_ceil(min_split))
            .clamp(1, max_splits())
    } else {
        1
    };
    let split_len = max_visible_tokens.div_ceil(splits).max(1);
    if blocks.prefill == 0 || splits == 1 {
        return SplitPlan { splits, split_len };
    }
    // Whole key tiles per split; rounding up can leave the last splits empty, so recount.
    let split_len = split_len.next_multiple_of(PREFILL_TILE_KEYS);
    SplitPlan {
        splits: max_visible_tokens.div_ceil(split_len),
        split_len,
    }
}

/// Splits for one kernel's large blocks alone: tensor-core decode blocks (a ring of K/V tiles,
/// about two resident per SM at head_dim 128) or tiled prefill blocks (two per SM). With blocks
/// this large the number of waves matters: 128 blocks on 264 slots run at half the bandwidth, 384
/// take two waves for 1.45 waves of work. The plan takes the fewest splits whose waves are at
/// least [`WAVE_FILL`] full (splits cost partial writes and a combine), else the best-filled
/// count; no split is shorter than `min_split` tokens, and each is a whole number of
/// `key_multiple` keys (the prefill kernel's key tiles). The model assumes equal contexts;
/// shorter ones end early.
fn plan_wave_splits(
    blocks: usize,
    max_visible_tokens: usize,
    slots: usize,
    min_split: usize,
    key_multiple: usize,
) -> SplitPlan {
    let most = (max_visible_tokens / min_split).clamp(1, max_splits());
    let splits = wave_splits(blocks, slots, 1, most);
    let split_len = max_visible_tokens
        .div_ceil(splits)
        .max(1)
        .next_multiple_of(key_multiple.max(1));
    // Rounding up to whole key tiles can leave the last splits empty: recount.
    SplitPlan {
        splits: max_visible_tokens.div_ceil(split_len).max(1),
        split_len,
    }
}

/// The fewest splits in `fewest..=most` whose `blocks × splits` blocks fill their waves of
/// `slots` resident blocks to at least [`WAVE_FILL`], else the best-filled count (the fewest on
/// ties). An empty range gives `most` (at least 1).
pub(crate) fn wave_splits(blocks: usize, slots: usize, fewest: usize, most: usize) -> usize {
    let (blocks, slots, most) = (blocks.max(1), slots.max(1), most.max(1));
    let fewest = fewest.clamp(1, most);
    // Fill of the waves as a fraction (used / offered slots), compared without division.
    let fill = |splits: usize| {
        let used = blocks * splits;
        (used, used.div_ceil(slots) * slots)
    };
    let good = |splits: usize| {
        let (used, offered) = fill(splits);
        used * WAVE_FILL.1 >= offered * WAVE_FILL.0
    };
    (fewest..=most).find(|&s| good(s)).unwrap_or_else(|| {
        // Best fill; on ties the fewest splits (`max_by` keeps the last maximum, so run down).
        (fewest..=most)
            .rev()
            .max_by(|&a, &b| {
                let ((ua, oa), (ub, ob)) = (fill(a), fill(b));
                (ua * ob).cmp(&(ub * oa))
            })
            .unwrap_or(fewest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_backend::SeqBatchMeta;

    /// A plan literal.
    fn split_plan(splits: usize, split_len: usize) -> SplitPlan {
        SplitPlan { splits, split_len }
    }

    /// `plan_splits` without tensor-core decode blocks: per-token decode and prefill blocks.
    fn plan(per_token: usize, prefill: usize, visible: usize, sms: usize) -> SplitPlan {
        plan_splits(
            GridBlocks {
                per_token,
                prefill,
                ..Default::default()
            },
            visible,
            sms,
        )
    }

    /// `plan_splits` with tensor-core decode blocks, `resident` of them per SM.
    fn plan_mma(mma: usize, prefill: usize, resident: usize, visible: usize) -> SplitPlan {
        plan_splits(
            GridBlocks {
                mma,
                mma_resident_per_sm: resident,
                prefill,
                ..Default::default()
            },
            visible,
            132,
        )
    }

    /// A batch of sequences with the given new-token counts (context = 100 + new).
    fn meta(query_lens: &[usize]) -> BatchMeta {
        let mut m = BatchMeta {
            block_size_tokens: 16,
            ..Default::default()
        };
        for &len in query_lens {
            let start = m.positions.len();
            m.positions.extend((0..len).map(|i| i as u32));
            m.slot_mapping.extend((0..len).map(|i| i as u32));
            m.seqs.push(SeqBatchMeta {
                query_start: start,
                query_len: len,
                context_len_tokens: 100 + len,
                block_table: (0..16).collect(),
            });
        }
        m
    }

    #[test]
    fn decode_rows_come_first_and_every_row_once() {
        let rows = AttentionRows::new(&meta(&[1, 5, 1, 130, 1]));
        assert_eq!(rows.num_decode, 3);
        assert_eq!(&rows.row_order[..3], &[0, 6, 137]);
        let mut all = rows.row_order.clone();
        all.sort_unstable();
        assert_eq!(all, (0..138).collect::<Vec<u32>>());
        assert_eq!(rows.num_prefill(), 135);
    }

    #[test]
    fn tiles_cover_each_run_without_crossing_sequences() {
        let m = meta(&[1, 5, 64, 130, 1, 2]);
        let rows = AttentionRows::new(&m);
        for g in 1..=MAX_GROUP {
            let (first, count) = rows.tile_ranges[g - 1];
            let pairs = &rows.tiles[2 * first..2 * (first + count)];
            let mut covered = Vec::new();
            for p in pairs.chunks_exact(2) {
                let (start, len) = (p[0] as usize, p[1] as usize);
                assert!(len >= 1 && len * g <= PREFILL_TILE_ROWS, "group {g}: {p:?}");
                let seq = m
                    .seqs
                    .iter()
                    .find(|s| (s.query_start..s.query_start + s.query_len).contains(&start))
                    .expect("tile starts inside a sequence");
                assert!(seq.query_len > 1, "decode row {start} in a tile");
                assert!(
                    start + len <= seq.query_start + seq.query_len,
                    "{p:?} crosses"
                );
                covered.extend(start..start + len);
            }
            covered.sort_unstable();
            let expected: Vec<usize> = (1..6).chain(6..70).chain(70..200).chain(201..203).collect();
            assert_eq!(covered, expected, "group {g}");
        }
        // 128 / 3 = 42 tokens per tile: 5 → 1 tile, 64 → 2, 130 → 4, 2 → 1.
        assert_eq!(rows.tile_ranges[2].1, 8);
        // Group 1: 128-token tiles: 1 + 1 + 2 + 1.
        assert_eq!(rows.tile_ranges[0].1, 5);
        // Group 8: 16-token tiles: 1 + 4 + 9 + 1.
        assert_eq!(rows.tile_ranges[7].1, 15);
        // Most keys first (context 100 + new tokens before each run): the 130-token run's
        // second tile (230 keys at its end), its first (228), then 64 (164), 2 (102), 5 (105)
        // sorted as 105 before 102. Only a run's last tile is partial.
        let (first, count) = rows.tile_ranges[0];
        let pairs: Vec<(u32, u32)> = rows.tiles[2 * first..2 * (first + count)]
            .chunks_exact(2)
            .map(|p| (p[0], p[1]))
            .collect();
        assert_eq!(pairs, [(198, 2), (70, 128), (6, 64), (1, 5), (201, 2)]);
    }

    #[test]
    fn a_long_prompts_tiles_start_with_its_last() {
        let m = meta(&[1, 1000]);
        let rows = AttentionRows::new(&m);
        let (first, count) = rows.tile_ranges[5]; // group 6: 21 tokens a tile
        let starts: Vec<u32> = rows.tiles[2 * first..2 * (first + count)]
            .chunks_exact(2)
            .map(|p| p[0])
            .collect();
        assert_eq!(starts.len(), 1000usize.div_ceil(21));
        assert_eq!(starts.first(), Some(&(1 + 21 * 47)), "the last tile first");
        assert_eq!(starts.last(), Some(&1), "the first tile last");
        assert!(starts.windows(2).all(|w| w[0] > w[1]), "{starts:?}");
    }

    #[test]
    fn decode_only_batches_have_no_tiles() {
        let rows = AttentionRows::new(&meta(&[1, 1, 1]));
        assert_eq!(rows.num_decode, 3);
        assert_eq!(rows.num_prefill(), 0);
        assert!(rows.tiles.is_empty());
        assert!(rows.tile_ranges.iter().all(|&(_, n)| n == 0));
    }

    #[test]
    fn decode_only_splits_follow_the_decode_rule() {
        // 1 token × 8 KV heads on 132 SMs at 32k: ceil(1056 / 8) = 132, capped by 64.
        assert_eq!(plan(8, 0, 32_768, 132), split_plan(64, 512));
        // 64 tokens × 8 heads = 512 blocks: ceil(1056 / 512) = 3 splits of ceil(4096 / 3).
        assert_eq!(plan(512, 0, 4096, 132), split_plan(3, 1366));
        // Short contexts split down to 64 tokens: 1 token × 32 heads at 513 tokens → 9 splits.
        assert_eq!(plan(32, 0, 513, 132), split_plan(9, 57));
        // Contexts of one shortest split and full grids are not split.
        assert_eq!(plan(8, 0, 64, 132).splits, 1);
        assert_eq!(plan(2000, 0, 32_768, 132).splits, 1);
    }

    #[test]
    fn prefill_splits_are_whole_key_tiles_and_none_is_empty() {
        for (decode, prefill, visible) in [
            (0, 64, 32_768),
            (0, 64, 8192),
            (16, 8, 3000),
            (0, 1, 100_000),
            (0, 3, 1000),
        ] {
            let p = plan(decode, prefill, visible, 132);
            assert!(p.splits >= 1 && p.splits <= max_splits(), "{p:?}");
            if p.splits > 1 {
                assert_eq!(p.split_len % PREFILL_TILE_KEYS, 0, "{p:?}");
                assert!((p.splits - 1) * p.split_len < visible, "empty split: {p:?}");
            }
            assert!(
                p.splits * p.split_len >= visible,
                "uncovered context: {p:?}"
            );
        }
        // Prefill alone is planned by waves of 2 blocks per SM (264 slots on 132 SMs).
        // 64 blocks (a chunk of 256 tokens of GQA 32/8 at batch 1: 8 tiles × 8 KV heads) at
        // 32k: 4 splits make 256 blocks, one wave 97% full.
        assert_eq!(plan(0, 64, 32_768, 132), split_plan(4, 8192));
        // A 128-token chunk (32 blocks) at 8k: 8 splits of 1024 keys, one wave (was 16 splits
        // in two waves under the blocks-per-SM rule).
        assert_eq!(plan(0, 32, 8192, 132), split_plan(8, 1024));
        // Batch 4 of 512-token chunks (512 blocks): two waves 97% full unsplit, so no partials.
        assert_eq!(plan(0, 512, 8192, 132).splits, 1);
        // Mixed with decode rows, the blocks-per-SM rule still applies.
        assert_eq!(plan(16, 8, 3000, 132).splits, 6);
        // A grid that already fills the GPU is not split.
        assert_eq!(plan(0, 1024, 32_768, 132).splits, 1);
    }

    #[test]
    fn per_token_plans_ignore_the_mma_residency() {
        for (decode, prefill, visible) in [(8, 0, 32_768), (512, 0, 4096), (16, 8, 3000)] {
            let base = plan(decode, prefill, visible, 132);
            for resident in [1, 2, 3, 5] {
                let with = plan_splits(
                    GridBlocks {
                        per_token: decode,
                        mma_resident_per_sm: resident,
                        prefill,
                        ..Default::default()
                    },
                    visible,
                    132,
                );
                assert_eq!(with, base, "resident {resident}");
            }
        }
    }

    #[test]
    fn mma_decode_fills_whole_waves() {
        // GQA 32/8, batch 16: 128 blocks on 132 SMs × 2 = 264 slots. One split fills 48%;
        // two fill 256 of 264 slots in one wave.
        assert_eq!(plan_mma(128, 0, 2, 4096), split_plan(2, 2048));
        // Batch 64: 512 blocks are 97% of two waves already.
        assert_eq!(plan_mma(512, 0, 2, 8192).splits, 1);
        // Batch 20 at 32k: 160 blocks. 1 or 2 splits fill 61%; 3 fill 480 of 528 (91%).
        assert_eq!(plan_mma(160, 0, 2, 32_768).splits, 3);
        // Batch 1 (8 blocks) at 8k: 30 splits fill 240 of 264 slots (91%); 29 would not.
        assert_eq!(plan_mma(8, 0, 2, 8192), split_plan(30, 274));
        // At 4k no count up to 4096 / 256 = 16 fills 90% of a wave: the best fill is the most.
        assert_eq!(plan_mma(8, 0, 2, 4096), split_plan(16, 256));
        // A context too short to split is never split, whatever the fill.
        assert_eq!(plan_mma(8, 0, 2, 200).splits, 1);
        // Four resident blocks per SM (head_dim 64) double the slots.
        assert_eq!(plan_mma(128, 0, 4, 4096).splits, 4);
    }

    #[test]
    fn prefill_only_plans_count_the_running_kernels_residency() {
        let plan = |tiles: usize, resident: Option<usize>| {
            plan_splits(
                GridBlocks {
                    prefill: tiles,
                    prefill_resident_per_sm: resident,
                    ..Default::default()
                },
                8192,
                132,
            )
        };
        // Unknown residency is the mma.sync kernel's.
        assert_eq!(plan(40, None), plan(40, Some(PREFILL_RESIDENT_PER_SM)));
        // 40 tiles on 132 slots (one block per SM) need fewer splits to fill a wave than on 264.
        let one = plan(40, Some(1));
        let two = plan(40, Some(2));
        assert!(one.splits < two.splits, "{one:?} {two:?}");
        assert!(one.splits * one.split_len >= 8192 && one.split_len % PREFILL_TILE_KEYS == 0);
        // Tiles filling whole waves of one block per SM are not split; at two per SM, 132
        // tiles fill half a wave and are.
        assert_eq!(plan(132, Some(1)).splits, 1);
        assert_eq!(plan(264, Some(1)).splits, 1);
        assert!(plan(132, Some(2)).splits > 1);
    }

    #[test]
    fn mma_decode_plans_cover_the_context_within_bounds() {
        for blocks in [1, 2, 7, 8, 64, 100, 128, 160, 264, 512, 1000, 5000] {
            for resident in [1, 2, 3, 4] {
                for visible in [1, 17, 255, 256, 257, 300, 4096, 5000, 32_768, 100_000] {
                    let p = plan_mma(blocks, 0, resident, visible);
                    assert!(p.splits >= 1 && p.splits <= max_splits(), "{p:?}");
                    assert!(p.splits * p.split_len >= visible, "uncovered: {p:?}");
                    assert!((p.splits - 1) * p.split_len < visible, "empty split: {p:?}");
                    if p.splits > 1 {
                        assert!(p.split_len >= DECODE_MIN_SPLIT_TOKENS, "{p:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn mma_decode_blocks_weigh_in_mixed_batches_by_residency() {
        // With prefill tiles the weighted rule holds: an mma block counts as 1 / resident of an
        // SM, a tile as 1 / 4. 66 mma blocks at 2 per SM = 33 SMs; 8 tiles = 2 SMs: ceil(132 /
        // 35) = 4 splits, whole key tiles.
        let p = plan_mma(66, 8, 2, 32_768);
        assert_eq!(p.splits, 4);
        assert_eq!(p.split_len % PREFILL_TILE_KEYS, 0);
        // More residency: the same blocks fill less of the GPU, so more splits.
        assert!(plan_mma(66, 8, 4, 32_768).splits > p.splits);
    }

    #[test]
    fn grouped_query_models_take_the_tensor_core_decode_kernel() {
        for rows in 1..=MMA_MHA_MAX_DECODE_ROWS {
            assert_eq!(DecodeKernel::choose(1, rows, true), DecodeKernel::Mma);
            assert_eq!(DecodeKernel::choose(1, rows, false), DecodeKernel::PerToken);
        }
        for rows in [MMA_MHA_MAX_DECODE_ROWS + 1, 16, 256] {
            assert_eq!(DecodeKernel::choose(1, rows, true), DecodeKernel::PerToken);
        }
        for group in 2..=MAX_GROUP {
            for rows in [1, 5, 256] {
                assert_eq!(DecodeKernel::choose(group, rows, true), DecodeKernel::Mma);
                assert_eq!(
                    DecodeKernel::choose(group, rows, false),
                    DecodeKernel::PerToken
                );
            }
        }
        // Graph buckets are powers of two up to the largest batch: none straddles the bound.
        for max_seqs in 1..=64 {
            let buckets = crate::backend::graphs::bucket_sizes(max_seqs);
            for (i, &b) in buckets.iter().enumerate() {
                let fewest = if i == 0 { 1 } else { buckets[i - 1] + 1 };
                let side = |rows: usize| rows <= MMA_MHA_MAX_DECODE_ROWS;
                assert_eq!(side(fewest), side(b), "bucket {fewest}..={b} of {max_seqs}");
            }
        }
    }
}
