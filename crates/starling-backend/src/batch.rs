//! Per-step attention metadata: which tokens are in the batch, where their K/V go in the paged cache,
//! and which cache slots each sequence attends to.
//!
//! Built once per engine step by the runner from the KV manager's block tables, then handed to every
//! layer (a device backend uploads it once per step through [`crate::BackendCore::prepare_batch`]).

use crate::BackendError;

/// One sequence's slice of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqBatchMeta {
    /// First row of this sequence's tokens in the flattened batch.
    pub query_start: usize,
    /// Number of new tokens of this sequence in the step (1 when decoding, the chunk length in prefill).
    pub query_len: usize,
    /// Physical tokens this sequence holds in the cache once this step's tokens are written; the
    /// new tokens are the last `query_len` of them. With token eviction this is smaller than the
    /// logical length (the RoPE position), which is why positions are carried separately.
    pub context_len_tokens: usize,
    /// Block ids of the sequence's block table, in order.
    pub block_table: Vec<u32>,
}

/// Host-side description of a step's batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// Logical (RoPE) position of every token in the batch.
    pub positions: Vec<u32>,
    /// Flat physical cache slot (`block * block_size + offset`) where each token's K/V is written.
    pub slot_mapping: Vec<u32>,
    /// The sequences, in batch-row order.
    pub seqs: Vec<SeqBatchMeta>,
    /// Rows whose logits the caller wants (usually each sampling sequence's last token).
    pub logits_rows: Vec<u32>,
    /// Tokens per cache block.
    pub block_size_tokens: usize,
    /// The block tables and slots of cache groups `1..` (a hybrid sliding-window model keeps
    /// its windowed layers' blocks in their own tables: `starling_kv::CacheGroups`); empty
    /// when every layer reads group 0's, which are `slot_mapping` and each sequence's
    /// `block_table`. A layer's [`crate::AttentionDims::cache_group`] picks its group.
    pub cache_groups: Vec<GroupBatchMeta>,
}

/// One cache group's view of a step (groups `1..`, see [`BatchMeta::cache_groups`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupBatchMeta {
    /// Flat cache slot of each token of the batch in this group's blocks.
    pub slot_mapping: Vec<u32>,
    /// Each sequence's block table in this group, in [`BatchMeta::seqs`] order.
    pub block_tables: Vec<Vec<u32>>,
}

impl BatchMeta {
    /// A batch of one sequence whose tokens at positions `[start, start + new)` are new this step
    /// (physical index = position: no eviction), written to `slot_mapping`, attending through
    /// `block_table`; logits are returned for `logits_rows`.
    pub fn single_sequence(
        start_tokens: usize,
        new_tokens: usize,
        slot_mapping: Vec<u32>,
        block_table: Vec<u32>,
        block_size_tokens: usize,
        logits_rows: Vec<u32>,
    ) -> Self {
        Self {
            positions: (start_tokens as u32..(start_tokens + new_tokens) as u32).collect(),
            slot_mapping,
            seqs: vec![SeqBatchMeta {
                query_start: 0,
                query_len: new_tokens,
                context_len_tokens: start_tokens + new_tokens,
                block_table,
            }],
            logits_rows,
            block_size_tokens,
            cache_groups: Vec::new(),
        }
    }

    /// Gives the batch `groups` cache groups, groups `1..` copies of group 0 whose blocks are
    /// shifted by `g * blocks_per_group` (group `g` owns blocks `g * blocks_per_group ..`): how
    /// a single-sequence pass or a benchmark lays out a hybrid model's cache.
    pub fn replicate_groups(&mut self, groups: usize, blocks_per_group: usize) {
        let shift = |g: usize| (g * blocks_per_group) as u32;
        let slot_shift = |g: usize| shift(g) * self.block_size_tokens as u32;
        self.cache_groups = (1..groups)
            .map(|g| GroupBatchMeta {
                slot_mapping: self
                    .slot_mapping
                    .iter()
                    .map(|s| s + slot_shift(g))
                    .collect(),
                block_tables: self
                    .seqs
                    .iter()
                    .map(|s| s.block_table.iter().map(|b| b + shift(g)).collect())
                    .collect(),
            })
            .collect();
    }

    /// Cache groups the batch describes (1 plus [`Self::cache_groups`]).
    pub fn num_cache_groups(&self) -> usize {
        1 + self.cache_groups.len()
    }

    /// The slot of each token in cache group `group` (group 0: [`Self::slot_mapping`]).
    pub fn group_slot_mapping(&self, group: usize) -> Result<&[u32], BackendError> {
        match group {
            0 => Ok(&self.slot_mapping),
            g => self
                .cache_groups
                .get(g - 1)
                .map(|m| m.slot_mapping.as_slice())
                .ok_or_else(|| self.missing_group(g)),
        }
    }

    /// Sequence `seq`'s block table in cache group `group` (group 0: its `block_table`).
    pub fn group_block_table(&self, seq: usize, group: usize) -> Result<&[u32], BackendError> {
        let table = match group {
            0 => self.seqs.get(seq).map(|s| s.block_table.as_slice()),
            g => self
                .cache_groups
                .get(g - 1)
                .ok_or_else(|| self.missing_group(g))?
                .block_tables
                .get(seq)
                .map(Vec::as_slice),
        };
        table.ok_or_else(|| {
            BackendError::Shape(format!(
                "sequence {seq} of a batch of {} in cache group {group}",
                self.seqs.len()
            ))
        })
    }

    fn missing_group(&self, group: usize) -> BackendError {
        BackendError::Shape(format!(
            "cache group {group} of a batch describing {}",
            self.num_cache_groups()
        ))
    }

    /// Number of token rows in the batch.
    pub fn num_tokens(&self) -> usize {
        self.positions.len()
    }

    /// Checks the internal consistency every backend relies on; a runner bug surfaces here as an
    /// error instead of an out-of-bounds access in a kernel.
    pub fn validate(&self, num_cache_blocks: usize) -> Result<(), BackendError> {
        let n = self.positions.len();
        if self.slot_mapping.len() != n {
            return Err(BackendError::Shape(format!(
                "slot_mapping has {} entries for {n} tokens",
                self.slot_mapping.len()
            )));
        }
        if self.block_size_tokens == 0 {
            return Err(BackendError::Shape("block size 0".into()));
        }
        let mut next_row = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.query_start != next_row || s.query_len == 0 {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: rows must be contiguous and non-empty (start {}, len {})",
                    s.query_start, s.query_len
                )));
            }
            next_row += s.query_len;
            if s.context_len_tokens < s.query_len {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: context {} shorter than its {} new tokens",
                    s.context_len_tokens, s.query_len
                )));
            }
            let blocks_needed = s.context_len_tokens.div_ceil(self.block_size_tokens);
            for group in 0..self.num_cache_groups() {
                let table = self.group_block_table(i, group)?;
                if table.len() < blocks_needed {
                    return Err(BackendError::Shape(format!(
                        "sequence {i}: {} blocks for {} tokens in cache group {group}",
                        table.len(),
                        s.context_len_tokens
                    )));
                }
                if let Some(b) = table.iter().find(|&&b| b as usize >= num_cache_blocks) {
                    return Err(BackendError::Shape(format!(
                        "sequence {i}: block {b} outside a cache of {num_cache_blocks} blocks"
                    )));
                }
            }
        }
        if next_row != n {
            return Err(BackendError::Shape(format!(
                "sequences cover {next_row} rows, batch has {n}"
            )));
        }
        let num_slots = num_cache_blocks * self.block_size_tokens;
        for (g, group) in self.cache_groups.iter().enumerate() {
            if group.slot_mapping.len() != n || group.block_tables.len() != self.seqs.len() {
                return Err(BackendError::Shape(format!(
                    "cache group {}: {} slots and {} tables for {n} tokens of {} sequences",
                    g + 1,
                    group.slot_mapping.len(),
                    group.block_tables.len(),
                    self.seqs.len()
                )));
            }
        }
        for group in 0..self.num_cache_groups() {
            if let Some(s) = self
                .group_slot_mapping(group)?
                .iter()
                .find(|&&s| s as usize >= num_slots)
            {
                return Err(BackendError::Shape(format!(
                    "slot {s} outside a cache of {num_slots} slots"
                )));
            }
        }
        if let Some(r) = self.logits_rows.iter().find(|&&r| r as usize >= n) {
            return Err(BackendError::Shape(format!(
                "logits row {r} outside {n} rows"
            )));
        }
        Ok(())
    }
}
