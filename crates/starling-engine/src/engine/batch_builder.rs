//! Turns a scheduler plan into the model's inputs: token ids, positions, slot mapping, block
//! tables and the rows whose logits are sampled.

use std::collections::HashMap;

use starling_backend::{BatchMeta, GroupBatchMeta, SeqBatchMeta};
use starling_kv::{BlockId, KvCacheManager, SeqId};

use super::sequence::Sequence;
use super::EngineError;
use crate::scheduler::StepPlan;

/// The inputs of one forward pass.
pub(crate) struct BuiltBatch {
    pub(crate) token_ids: Vec<u32>,
    pub(crate) meta: BatchMeta,
    /// Sequences that sample this step, in the order of `meta.logits_rows`.
    pub(crate) sampling_seqs: Vec<SeqId>,
}

pub(crate) fn build(
    plan: &StepPlan,
    seqs: &HashMap<SeqId, Sequence>,
    kv: &KvCacheManager,
) -> Result<BuiltBatch, EngineError> {
    let n = plan.num_scheduled_tokens;
    let mut token_ids = Vec::with_capacity(n);
    let mut meta = BatchMeta {
        positions: Vec::with_capacity(n),
        slot_mapping: Vec::with_capacity(n),
        seqs: Vec::with_capacity(plan.scheduled.len()),
        logits_rows: Vec::new(),
        block_size_tokens: kv.block_size_tokens(),
        cache_groups: vec![GroupBatchMeta::default(); kv.num_cache_groups() - 1],
    };
    let mut sampling_seqs = Vec::new();
    for s in &plan.scheduled {
        let seq = seqs
            .get(&s.seq_id)
            .ok_or(EngineError::UnknownRequest(s.seq_id))?;
        let table = kv
            .table(s.seq_id)
            .ok_or(EngineError::UnknownRequest(s.seq_id))?;
        let tokens = seq
            .token_ids
            .get(s.start_position..s.start_position + s.num_tokens)
            .ok_or_else(|| {
                EngineError::InvalidRequest(format!(
                    "plan asks for tokens {}..{} of {:?}, which has {}",
                    s.start_position,
                    s.start_position + s.num_tokens,
                    s.seq_id,
                    seq.token_ids.len()
                ))
            })?;
        let query_start = token_ids.len();
        token_ids.extend_from_slice(tokens);
        meta.positions
            .extend((s.start_position..s.start_position + s.num_tokens).map(|p| p as u32));
        let physical = s.physical_start_index..s.physical_start_index + s.num_tokens;
        meta.slot_mapping
            .extend(kv.slot_mapping(s.seq_id, physical.clone())?);
        meta.seqs.push(SeqBatchMeta {
            query_start,
            query_len: s.num_tokens,
            context_len_tokens: s.physical_start_index + s.num_tokens,
            block_table: kernel_table(table.block_ids()),
        });
        for (g, group) in meta.cache_groups.iter_mut().enumerate() {
            let table = kv
                .group_table(s.seq_id, g + 1)
                .ok_or(EngineError::UnknownRequest(s.seq_id))?;
            kv.write_group_slot_mapping(
                s.seq_id,
                g + 1,
                physical.clone(),
                &mut group.slot_mapping,
            )?;
            group.block_tables.push(kernel_table(table.block_ids()));
        }
        if s.samples_next_token {
            meta.logits_rows
                .push((query_start + s.num_tokens - 1) as u32);
            sampling_seqs.push(s.seq_id);
        }
    }
    Ok(BuiltBatch {
        token_ids,
        meta,
        sampling_seqs,
    })
}

/// A block table as the kernels read it. A block released behind a sliding window is before
/// every query's window, so no kernel reads its entry: block 0 keeps the table in the cache's
/// range.
fn kernel_table(blocks: &[BlockId]) -> Vec<u32> {
    blocks
        .iter()
        .map(|b| if *b == BlockId::RELEASED { 0 } else { b.0 })
        .collect()
}
