//! A step's metadata as the kernels read it: every per-row and per-sequence array packed into one
//! `u32` device buffer, so a step costs one host-to-device copy.
//!
//! Two kinds of batch share the layout. An eager batch ([`CudaBatch::upload`]) is sized for its
//! step. A replay batch ([`CudaBatch::for_replay`]) is sized once for a decode bucket (rows,
//! block-table width) and lives as long as its CUDA graph: the graph recorded its addresses, so
//! each replayed step overwrites it in place ([`CudaBatch::write`]) with [`replay_inputs`]. Its
//! padding rows decode token 0 at position 0, see no context, and write no cache slot
//! ([`PAD_SLOT`], which the KV-write kernel skips), so their outputs are discarded unread.

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use starling_backend::{BatchMeta, GroupBatchMeta, SeqBatchMeta};

use super::attention_plan::{AttentionRows, SplitPlan};
use super::latent_plan::LatentSplitShape;
use crate::CudaError;

/// The cache slot of a padding row: `write_kv_bf16` skips it.
pub(crate) const PAD_SLOT: u32 = u32::MAX;

/// Where each array sits in the packed buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchLayout {
    pub(crate) positions: Range<usize>,
    /// `[cache groups, rows]`: each group's slot of every row.
    pub(crate) slots: Range<usize>,
    pub(crate) tok_seq: Range<usize>,
    pub(crate) tok_visible: Range<usize>,
    pub(crate) row_order: Range<usize>,
    pub(crate) prefill_tiles: Range<usize>,
    /// `[cache groups, sequences, max_blocks]`, row-major.
    pub(crate) block_tables: Range<usize>,
    /// `rows + 1` prefix sums, in `row_order`'s order, of the context positions each row sees:
    /// where each row's attention scores start in the latent kernels' scratch (entry `i` for
    /// `row_order[i]`; the last entry is the total).
    pub(crate) score_offsets: Range<usize>,
    /// Replay batches only (empty otherwise): the token ids the embedding gathers.
    pub(crate) token_ids: Range<usize>,
    /// Replay batches only (empty otherwise): `{splits, split_len}` of this step's attention,
    /// then the same pair of each latent split shape the batch was made for, in its order.
    pub(crate) plan: Range<usize>,
    /// Cache groups (block tables per sequence; `BatchMeta::num_cache_groups`).
    pub(crate) groups: usize,
}

impl BatchLayout {
    fn new(
        rows: usize,
        seqs: usize,
        tiles: usize,
        max_blocks: usize,
        groups: usize,
        replay: bool,
        latent_shapes: usize,
    ) -> Self {
        let mut end = 0;
        let mut take = |len: usize| {
            let r = end..end + len;
            end += len;
            r
        };
        Self {
            positions: take(rows),
            slots: take(groups * rows),
            tok_seq: take(rows),
            tok_visible: take(rows),
            row_order: take(rows),
            prefill_tiles: take(tiles),
            block_tables: take(groups * seqs * max_blocks),
            score_offsets: take(rows + 1),
            token_ids: take(if replay { rows } else { 0 }),
            plan: take(if replay { 2 + 2 * latent_shapes } else { 0 }),
            groups,
        }
    }

    /// Group `group`'s part of `range` (`groups` equal parts).
    fn group_part(&self, range: &Range<usize>, group: usize) -> Range<usize> {
        let len = range.len() / self.groups.max(1);
        range.start + group * len..range.start + (group + 1) * len
    }

    /// Elements of the packed buffer (at least one: a device buffer is never empty).
    pub(crate) fn len(&self) -> usize {
        self.plan.end.max(1)
    }
}

/// What a replay batch fixes for the life of its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplayShape {
    /// Rows of the bucket (real rows first, padding after).
    pub(crate) rows: usize,
    /// Block-table entries per row (`max_model_len / block_size`, rounded up).
    pub(crate) max_blocks: usize,
    /// Attention splits the launches are sized for; each step's plan uses at most this many.
    pub(crate) max_splits: usize,
    /// The same for the latent layers' plans (1 without latent layers).
    pub(crate) max_latent_splits: usize,
    /// KV heads of the model the graph was recorded for (the plan depends on it).
    pub(crate) num_kv_heads: usize,
    /// Token slots of the cache: the most context positions all rows of a step can see
    /// together (sizes the latent kernels' score scratch; padding rows see none).
    pub(crate) num_cache_slots: usize,
    /// Tokens per cache block.
    pub(crate) block_size_tokens: usize,
    /// Cache groups (block tables per sequence) of the model the graph was recorded for.
    pub(crate) num_cache_groups: usize,
}

/// A step's metadata on the device (uploaded once, read by every layer).
pub struct CudaBatch {
    pub(crate) meta: BatchMeta,
    buf: CudaSlice<u32>,
    pub(crate) layout: BatchLayout,
    pub(crate) max_blocks: usize,
    pub(crate) max_visible: usize,
    /// Which rows each attention kernel serves, and the prefill tiles (host copy: counts and
    /// offsets for the launches).
    pub(crate) rows: AttentionRows,
    /// `Some` for a replay batch: launches are sized by it and read the split plan and the
    /// token ids from the buffer.
    pub(crate) replay: Option<ReplayShape>,
    /// Context positions the latent kernels' score scratch must hold for every row of the
    /// batch (an eager batch's exact total; a replay batch's bound, the cache's slots).
    pub(crate) score_capacity: usize,
    /// The same for the decode rows alone (the front of `row_order`), when prefill chunks take
    /// the reconstruction path.
    pub(crate) decode_score_capacity: usize,
    /// A latent prefill's reconstruction plan, made on first use (one per step, shared by
    /// every latent layer).
    pub(crate) latent_prefill: std::sync::OnceLock<super::latent_reconstruct::PrefillScratchPlan>,
    /// A replay batch's latent split shapes (empty for an eager batch), whose plans follow the
    /// attention plan in the plan words, in this order.
    pub(crate) latent_shapes: Vec<LatentSplitShape>,
}

impl CudaBatch {
    /// Packs and uploads a validated step (one copy).
    pub(crate) fn upload(
        stream: &std::sync::Arc<CudaStream>,
        meta: &BatchMeta,
    ) -> Result<Self, CudaError> {
        let groups = meta.num_cache_groups();
        let max_blocks = (0..meta.seqs.len())
            .flat_map(|s| (0..groups).map(move |g| (s, g)))
            .filter_map(|(s, g)| meta.group_block_table(s, g).ok().map(<[u32]>::len))
            .max()
            .unwrap_or(1)
            .max(1);
        let rows = AttentionRows::new(meta);
        let n = meta.num_tokens();
        let layout = BatchLayout::new(
            n,
            meta.seqs.len(),
            rows.tiles.len(),
            max_blocks,
            groups,
            false,
            0,
        );
        let mut host = vec![0u32; layout.len()];
        host[layout.positions.clone()].copy_from_slice(&meta.positions);
        write_group_tables(&mut host, &layout, max_blocks, meta, meta.seqs.len())?;
        host[layout.row_order.clone()].copy_from_slice(&rows.row_order);
        host[layout.prefill_tiles.clone()].copy_from_slice(&rows.tiles);
        let mut max_visible = 0;
        let mut row = 0;
        for (s, seq) in meta.seqs.iter().enumerate() {
            for i in 0..seq.query_len {
                let visible = (seq.context_len_tokens - seq.query_len + i + 1) as u32;
                host[layout.tok_seq.start + row] = s as u32;
                host[layout.tok_visible.start + row] = visible;
                max_visible = max_visible.max(visible as usize);
                row += 1;
            }
        }
        let score_capacity = fill_score_offsets(&mut host, &layout, &rows.row_order)?;
        let decode_score_capacity = host[layout.score_offsets.start + rows.num_decode] as usize;
        Ok(Self {
            meta: meta.clone(),
            buf: stream.clone_htod(&host)?,
            layout,
            max_blocks,
            max_visible,
            rows,
            replay: None,
            score_capacity,
            decode_score_capacity,
            latent_prefill: std::sync::OnceLock::new(),
            latent_shapes: Vec::new(),
        })
    }

    /// An empty replay batch of `shape` whose latent layers have `latent_shapes` (fill it with
    /// [`CudaBatch::write`] before any launch).
    pub(crate) fn for_replay(
        stream: &std::sync::Arc<CudaStream>,
        shape: ReplayShape,
        latent_shapes: Vec<LatentSplitShape>,
    ) -> Result<Self, CudaError> {
        let meta = padded_meta(shape.rows, shape.block_size_tokens, shape.num_cache_groups);
        let layout = replay_layout(&shape, latent_shapes.len());
        Ok(Self {
            rows: AttentionRows::new(&meta),
            meta,
            buf: stream.alloc_zeros::<u32>(layout.len())?,
            layout,
            max_blocks: shape.max_blocks,
            max_visible: 0,
            replay: Some(shape),
            score_capacity: shape.num_cache_slots,
            decode_score_capacity: shape.num_cache_slots,
            latent_prefill: std::sync::OnceLock::new(),
            latent_shapes,
        })
    }

    /// Overwrites the whole packed buffer in place (one copy; the addresses stay).
    pub(crate) fn write(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        host: &[u32],
    ) -> Result<(), CudaError> {
        if host.len() != self.layout.len() {
            return Err(CudaError::Shape(format!(
                "replay inputs: {} values for a buffer of {}",
                host.len(),
                self.layout.len()
            )));
        }
        Ok(stream.memcpy_htod(host, &mut self.buf)?)
    }

    fn view(&self, r: &Range<usize>) -> CudaView<'_, u32> {
        self.buf.slice(r.clone())
    }
    pub(crate) fn positions(&self) -> CudaView<'_, u32> {
        self.view(&self.layout.positions)
    }
    /// Cache group `group`'s slot of every row (group 0: the batch's `slot_mapping`).
    pub(crate) fn slots(&self, group: usize) -> CudaView<'_, u32> {
        self.view(&self.layout.group_part(&self.layout.slots, group))
    }
    pub(crate) fn tok_seq(&self) -> CudaView<'_, u32> {
        self.view(&self.layout.tok_seq)
    }
    pub(crate) fn tok_visible(&self) -> CudaView<'_, u32> {
        self.view(&self.layout.tok_visible)
    }
    pub(crate) fn row_order(&self, count: usize) -> CudaView<'_, u32> {
        let start = self.layout.row_order.start;
        self.view(&(start..start + count))
    }
    /// Pairs `first..first + count` of the prefill tiles.
    pub(crate) fn prefill_tiles(&self, first: usize, count: usize) -> CudaView<'_, u32> {
        let start = self.layout.prefill_tiles.start;
        self.view(&(start + 2 * first..start + 2 * (first + count)))
    }
    /// Cache group `group`'s `[sequences, max_blocks]` block tables.
    pub(crate) fn block_tables(&self, group: usize) -> CudaView<'_, u32> {
        self.view(&self.layout.group_part(&self.layout.block_tables, group))
    }
    /// Entries `first..=first + count` of the score offsets.
    pub(crate) fn score_offsets(&self, first: usize, count: usize) -> CudaView<'_, u32> {
        let start = self.layout.score_offsets.start;
        self.view(&(start + first..start + first + count + 1))
    }
    pub(crate) fn token_ids(&self) -> CudaView<'_, u32> {
        self.view(&self.layout.token_ids)
    }
    /// The attention plan's words (replay batches).
    pub(crate) fn plan(&self) -> CudaView<'_, u32> {
        let start = self.layout.plan.start;
        self.view(&(start..start + 2.min(self.layout.plan.len())))
    }
    /// The plan words of latent split shape `shape` (replay batches made for it).
    pub(crate) fn latent_plan(&self, shape: &LatentSplitShape) -> Option<CudaView<'_, u32>> {
        let i = self.latent_shapes.iter().position(|s| s == shape)?;
        let start = self.layout.plan.start + 2 + 2 * i;
        (start + 2 <= self.layout.plan.end).then(|| self.view(&(start..start + 2)))
    }
}

/// Writes every cache group's slots and the block tables of the first `seqs` sequences (a
/// replay layout's further rows keep their padding).
fn write_group_tables(
    host: &mut [u32],
    layout: &BatchLayout,
    max_blocks: usize,
    meta: &BatchMeta,
    seqs: usize,
) -> Result<(), CudaError> {
    let shape = |e: starling_backend::BackendError| CudaError::Shape(e.to_string());
    for g in 0..layout.groups {
        let slots = meta.group_slot_mapping(g).map_err(shape)?;
        let start = layout.group_part(&layout.slots, g).start;
        host[start..start + slots.len()].copy_from_slice(slots);
        let tables = layout.group_part(&layout.block_tables, g).start;
        for s in 0..seqs {
            let table = meta.group_block_table(s, g).map_err(shape)?;
            let at = tables + s * max_blocks;
            host[at..at + table.len()].copy_from_slice(table);
        }
    }
    Ok(())
}

/// Writes the score offsets of rows listed in `order` (prefix sums of `tok_visible`) and returns
/// their total.
fn fill_score_offsets(
    host: &mut [u32],
    layout: &BatchLayout,
    order: &[u32],
) -> Result<usize, CudaError> {
    let mut total = 0usize;
    for (i, &row) in order.iter().enumerate() {
        host[layout.score_offsets.start + i] = u32::try_from(total)
            .map_err(|_| CudaError::Shape("score offsets exceed u32".into()))?;
        total += host[layout.tok_visible.start + row as usize] as usize;
    }
    host[layout.score_offsets.start + order.len()] =
        u32::try_from(total).map_err(|_| CudaError::Shape("score offsets exceed u32".into()))?;
    Ok(total)
}

/// The host-side meta of a replay batch: `rows` one-token sequences in `cache_groups` groups
/// wanting every row's logits (only its shape is read: row counts for the launches and the
/// model's checks).
pub(crate) fn padded_meta(rows: usize, block_size_tokens: usize, cache_groups: usize) -> BatchMeta {
    let group = GroupBatchMeta {
        slot_mapping: vec![PAD_SLOT; rows],
        block_tables: vec![Vec::new(); rows],
    };
    BatchMeta {
        positions: vec![0; rows],
        slot_mapping: vec![PAD_SLOT; rows],
        seqs: (0..rows)
            .map(|i| SeqBatchMeta {
                query_start: i,
                query_len: 1,
                context_len_tokens: 1,
                block_table: Vec::new(),
            })
            .collect(),
        logits_rows: (0..rows as u32).collect(),
        block_size_tokens,
        cache_groups: vec![group; cache_groups.saturating_sub(1)],
    }
}

/// Rows of a step a replay can serve: every sequence decodes exactly one token, there is at
/// least one, and every block table fits `max_blocks`. `None` otherwise (prefill, mixed, empty,
/// longer than the replay buffers).
pub(crate) fn replayable_rows(
    meta: &BatchMeta,
    token_ids: &[u32],
    max_blocks: usize,
) -> Option<usize> {
    let n = meta.seqs.len();
    let decode_only = meta.seqs.iter().all(|s| s.query_len == 1);
    let fits = (0..n).all(|s| {
        (0..meta.num_cache_groups()).all(|g| {
            meta.group_block_table(s, g)
                .is_ok_and(|t| t.len() <= max_blocks)
        })
    });
    // The graph's logits are every row's, in order: a step must want exactly those.
    let all_logits = (0..n as u32).eq(meta.logits_rows.iter().copied());
    (n > 0 && decode_only && fits && all_logits && meta.num_tokens() == n && token_ids.len() == n)
        .then_some(n)
}

/// The packed buffer of a replay batch for one decode step (validated, `replayable_rows` rows):
/// the step's rows first, then padding up to `layout`'s row count.
pub(crate) fn replay_inputs(
    layout: &BatchLayout,
    max_blocks: usize,
    meta: &BatchMeta,
    token_ids: &[u32],
    plan: SplitPlan,
    latent_plans: &[SplitPlan],
) -> Vec<u32> {
    let rows = layout.positions.len();
    let mut host = vec![0u32; layout.len()];
    // Padding: token 0 at position 0, no slot, no context; every row is its own sequence.
    host[layout.slots.clone()].fill(PAD_SLOT);
    for (i, seq) in meta.seqs.iter().enumerate() {
        host[layout.token_ids.start + i] = token_ids[i];
        host[layout.positions.start + i] = meta.positions[i];
        host[layout.tok_visible.start + i] = seq.context_len_tokens as u32;
    }
    // `replayable_rows` checked every group's tables; a failure here is a caller's bug and
    // leaves the padding (no slot written, no block read).
    let _ = write_group_tables(&mut host, layout, max_blocks, meta, meta.seqs.len());
    for i in 0..rows {
        host[layout.tok_seq.start + i] = i as u32;
        host[layout.row_order.start + i] = i as u32;
    }
    // Rows are in order and padding rows see nothing, so the total is the step's contexts,
    // within the cache's slots (the replay buffer's bound).
    let mut total = 0u32;
    for i in 0..rows {
        host[layout.score_offsets.start + i] = total;
        total = total.saturating_add(host[layout.tok_visible.start + i]);
    }
    host[layout.score_offsets.start + rows] = total;
    let plans = std::iter::once(&plan).chain(latent_plans);
    for (words, p) in host[layout.plan.clone()].chunks_exact_mut(2).zip(plans) {
        words[0] = p.splits as u32;
        words[1] = p.split_len as u32;
    }
    host
}

/// The layout of a replay batch of `shape` with `latent_shapes` latent plans (what
/// [`CudaBatch::for_replay`] allocates).
pub(crate) fn replay_layout(shape: &ReplayShape, latent_shapes: usize) -> BatchLayout {
    BatchLayout::new(
        shape.rows,
        shape.rows,
        0,
        shape.max_blocks,
        shape.num_cache_groups.max(1),
        true,
        latent_shapes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode rows with contexts `ctx` (block size 4; seq i owns blocks 10i..).
    fn decode_meta(ctx: &[usize]) -> BatchMeta {
        let mut m = BatchMeta {
            block_size_tokens: 4,
            ..Default::default()
        };
        for (i, &c) in ctx.iter().enumerate() {
            let table: Vec<u32> = (0..c.div_ceil(4) as u32)
                .map(|b| 10 * i as u32 + b)
                .collect();
            m.positions.push(c as u32 - 1);
            m.slot_mapping
                .push(table[(c - 1) / 4] * 4 + ((c - 1) % 4) as u32);
            m.seqs.push(SeqBatchMeta {
                query_start: i,
                query_len: 1,
                context_len_tokens: c,
                block_table: table,
            });
            m.logits_rows.push(i as u32);
        }
        m
    }

    #[test]
    fn only_decode_steps_that_fit_are_replayable() {
        let m = decode_meta(&[5, 9, 1]);
        assert_eq!(replayable_rows(&m, &[1, 2, 3], 3), Some(3));
        // A 9-token context needs 3 blocks of 4.
        assert_eq!(replayable_rows(&m, &[1, 2, 3], 2), None);
        assert_eq!(replayable_rows(&m, &[1, 2], 3), None);
        assert_eq!(replayable_rows(&BatchMeta::default(), &[], 3), None);
        let prefill = BatchMeta::single_sequence(0, 3, vec![0, 1, 2], vec![0], 4, vec![2]);
        assert_eq!(replayable_rows(&prefill, &[1, 2, 3], 3), None);
    }

    #[test]
    fn replay_inputs_put_the_step_first_and_pad_the_rest() {
        let m = decode_meta(&[5, 9, 1]);
        let shape = ReplayShape {
            rows: 4,
            max_blocks: 3,
            max_splits: 2,
            max_latent_splits: 4,
            num_kv_heads: 2,
            num_cache_slots: 64,
            block_size_tokens: 4,
            num_cache_groups: 1,
        };
        let layout = replay_layout(&shape, 2);
        let plan = SplitPlan {
            splits: 2,
            split_len: 5,
        };
        let latent = [
            SplitPlan {
                splits: 3,
                split_len: 4,
            },
            SplitPlan {
                splits: 1,
                split_len: 9,
            },
        ];
        let host = replay_inputs(&layout, 3, &m, &[7, 8, 9], plan, &latent);
        assert_eq!(host.len(), layout.len());
        let at = |r: &Range<usize>| host[r.clone()].to_vec();
        assert_eq!(at(&layout.token_ids), vec![7, 8, 9, 0]);
        assert_eq!(at(&layout.positions), vec![4, 8, 0, 0]);
        assert_eq!(at(&layout.slots), vec![4, 48, 80, PAD_SLOT]);
        assert_eq!(at(&layout.tok_visible), vec![5, 9, 1, 0]);
        assert_eq!(at(&layout.tok_seq), vec![0, 1, 2, 3]);
        assert_eq!(at(&layout.row_order), vec![0, 1, 2, 3]);
        assert_eq!(
            at(&layout.block_tables),
            vec![0, 1, 0, 10, 11, 12, 20, 0, 0, 0, 0, 0]
        );
        assert_eq!(at(&layout.plan), vec![2, 5, 3, 4, 1, 9]);
        assert_eq!(at(&layout.score_offsets), vec![0, 5, 14, 15, 15]);
        assert!(layout.prefill_tiles.is_empty());
    }

    #[test]
    fn each_cache_group_gets_its_own_slots_and_tables() {
        let mut m = decode_meta(&[5, 9]);
        // Group 1 holds the same sequences in blocks 100.., its slots shifted accordingly.
        m.cache_groups = vec![GroupBatchMeta {
            slot_mapping: m.slot_mapping.iter().map(|s| s + 400).collect(),
            block_tables: m
                .seqs
                .iter()
                .map(|s| s.block_table.iter().map(|b| b + 100).collect())
                .collect(),
        }];
        m.validate(1000).unwrap();
        let shape = ReplayShape {
            rows: 3,
            max_blocks: 3,
            max_splits: 1,
            max_latent_splits: 1,
            num_kv_heads: 1,
            num_cache_slots: 4000,
            block_size_tokens: 4,
            num_cache_groups: 2,
        };
        assert_eq!(replayable_rows(&m, &[1, 2], 3), Some(2));
        let layout = replay_layout(&shape, 0);
        let plan = SplitPlan {
            splits: 1,
            split_len: 9,
        };
        let host = replay_inputs(&layout, 3, &m, &[1, 2], plan, &[]);
        let part = |r: &Range<usize>, g| host[layout.group_part(r, g)].to_vec();
        assert_eq!(part(&layout.slots, 0), vec![4, 48, PAD_SLOT]);
        assert_eq!(part(&layout.slots, 1), vec![404, 448, PAD_SLOT]);
        assert_eq!(
            part(&layout.block_tables, 1),
            vec![100, 101, 0, 110, 111, 112, 0, 0, 0]
        );
        assert_eq!(
            part(&layout.block_tables, 0),
            vec![0, 1, 0, 10, 11, 12, 0, 0, 0]
        );
    }

    #[test]
    fn a_full_bucket_has_no_padding_row() {
        let m = decode_meta(&[2, 3]);
        let shape = ReplayShape {
            rows: 2,
            max_blocks: 1,
            max_splits: 1,
            max_latent_splits: 1,
            num_kv_heads: 1,
            num_cache_slots: 8,
            block_size_tokens: 4,
            num_cache_groups: 1,
        };
        let layout = replay_layout(&shape, 0);
        let plan = SplitPlan {
            splits: 1,
            split_len: 3,
        };
        let host = replay_inputs(&layout, 1, &m, &[4, 5], plan, &[]);
        assert!(!host[layout.slots.clone()].contains(&PAD_SLOT));
        assert_eq!(&host[layout.tok_visible.clone()], &[2, 3]);
    }

    #[test]
    fn layouts_do_not_overlap_and_eager_ones_carry_no_replay_fields() {
        let l = BatchLayout::new(5, 2, 6, 3, 1, false, 0);
        let parts = [
            &l.positions,
            &l.slots,
            &l.tok_seq,
            &l.tok_visible,
            &l.row_order,
            &l.prefill_tiles,
            &l.block_tables,
            &l.score_offsets,
            &l.token_ids,
            &l.plan,
        ];
        for w in parts.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(l.token_ids.is_empty() && l.plan.is_empty());
        assert_eq!(l.len(), 5 * 5 + 6 + 6 + 6);
        assert_eq!(BatchLayout::new(0, 0, 0, 1, 1, false, 0).len(), 1);
    }

    #[test]
    fn padded_meta_is_a_valid_decode_shape() {
        let m = padded_meta(3, 16, 1);
        assert_eq!(m.num_tokens(), 3);
        assert_eq!(m.block_size_tokens, 16);
        assert_eq!(m.logits_rows, vec![0, 1, 2]);
        assert_eq!(AttentionRows::new(&m).num_decode, 3);
        assert_eq!(padded_meta(3, 16, 3).num_cache_groups(), 3);
    }
}
