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
        }
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
            if s.block_table.len() < blocks_needed {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: {} blocks for {} tokens",
                    s.block_table.len(),
                    s.context_len_tokens
                )));
            }
            if let Some(b) = s
                .block_table
                .iter()
                .find(|&&b| b as usize >= num_cache_blocks)
            {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: block {b} outside a cache of {num_cache_blocks} blocks"
                )));
            }
        }
        if next_row != n {
            return Err(BackendError::Shape(format!(
                "sequences cover {next_row} rows, batch has {n}"
            )));
        }
        let num_slots = num_cache_blocks * self.block_size_tokens;
        if let Some(s) = self.slot_mapping.iter().find(|&&s| s as usize >= num_slots) {
            return Err(BackendError::Shape(format!(
                "slot {s} outside a cache of {num_slots} slots"
            )));
        }
        if let Some(r) = self.logits_rows.iter().find(|&&r| r as usize >= n) {
            return Err(BackendError::Shape(format!(
                "logits row {r} outside {n} rows"
            )));
        }
        Ok(())
    }
}
