//! Prefix caching that survives compression (issue 19): the compacted states of a compressing
//! request's prefill, named so that another request with the same prompt start and the same
//! policy can start from them.
//!
//! A policy that scores from the keys alone (KeyDiff, KNorm) or from positions (StreamingLLM),
//! with no question split, compacts a long prompt at fixed points — multiples of the step
//! budget `S` (`Scheduler::align_chunks`) — over the whole context (copy-on-compact, so shared
//! blocks never bound it). What it keeps at point `P` is then a function of the tokens before
//! `P`, the weights and cache layout (the [`starling_kv::CacheIdentity`]) and the policy with
//! `S`; and every token after `P` is computed over that state. So the state is named by the
//! dense hash of the tokens before `P` and the policy ([`BlockHash::of_compacted_state`]), the
//! slots after it are hashed in a chain from that name, and a later request reuses the state
//! whole as it would reuse dense blocks: it computes exactly what it would have computed
//! alone, since alone it would have compacted at `P` to the same slots.
//!
//! [`prefill_compactions`] replays where a fresh prefill compacts and what it keeps (the
//! policy's `due_target` is a function of the lengths alone); the request's own compactions are
//! checked against that replay before its slots register under a state's chain, and a
//! compaction that departs from it (one that kept a shared prefix whole, for want of blocks to
//! copy it) stops the request registering until it is recomputed. SnapKV and TOVA score with
//! the queries of a window, Random with a stream of draws, and the question split depends on
//! the prompt's end: their states are not named (their dense hits stop before the first point,
//! as before).

use starling_backend::Backend;
use starling_kv::{BlockHash, SeqId};

use super::compression::SeqCompression;
use super::{Engine, EngineError};
use crate::scheduler::{CompactedPrefix, CompactedPrefixes};

/// One compaction a fresh prefill of a request makes before its prompt's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefillCompaction {
    /// Tokens before the point (a multiple of the step budget).
    pub(crate) logical_tokens: usize,
    /// First slot it rewrites.
    pub(crate) first_rewritten_tokens: usize,
    /// Slots it keeps.
    pub(crate) kept_tokens: usize,
}

/// Where a fresh prefill of `num_prompt_tokens` under `policy` compacts, with chunks cut at
/// multiples of `stride_tokens`, and what each compaction keeps: the engine's decision at each
/// chunk that ends on a multiple (`plan_compactions`) with nothing shared, before the prompt's
/// end (the compaction at the end samples, and is the request's own).
pub(crate) fn prefill_compactions(
    policy: &SeqCompression,
    stride_tokens: usize,
    num_prompt_tokens: usize,
) -> Vec<PrefillCompaction> {
    let mut out = Vec::new();
    if stride_tokens == 0 {
        return out;
    }
    let mut physical = 0;
    let mut last_point = 0;
    let mut point = stride_tokens;
    while point < num_prompt_tokens {
        physical += point - last_point;
        last_point = point;
        if let Some(due) = policy.due_target(point, physical, false, num_prompt_tokens, 0) {
            out.push(PrefillCompaction {
                logical_tokens: point,
                first_rewritten_tokens: due.first_rewritten_tokens,
                kept_tokens: due.target_tokens,
            });
            physical = due.target_tokens;
        }
        point += stride_tokens;
    }
    out
}

impl<B: Backend> Engine<B> {
    /// Names the compacted states a new request's prefill passes through and hands them to the
    /// scheduler (a no-op with caching off, or for a policy whose states are not a function of
    /// the tokens; see the module docs). Its dense chain must already cover its prompt.
    pub(crate) fn plan_compacted_prefixes(&mut self, seq_id: SeqId) -> Result<(), EngineError> {
        let Some(hasher) = &self.hasher else {
            return Ok(());
        };
        let stride = self.scheduler.config().max_num_batched_tokens;
        let bs = hasher.block_size_tokens();
        let Some(seq) = self.seqs.get(&seq_id) else {
            return Err(EngineError::UnknownRequest(seq_id));
        };
        let Some(policy) = &seq.compression else {
            return Ok(());
        };
        let Some(policy_name) = policy.cacheable_state_name(stride) else {
            return Ok(());
        };
        if !stride.is_multiple_of(bs) {
            return Ok(());
        }
        let prompt = &seq.token_ids[..seq.num_prompt_tokens];
        let dense = self.scheduler.block_hashes(seq_id);
        let points = prefill_compactions(policy, stride, prompt.len());
        let mut states: Vec<CompactedPrefix> = Vec::with_capacity(points.len());
        for (k, p) in points.iter().enumerate() {
            let next = points.get(k + 1).map(|n| n.logical_tokens);
            let before: &[BlockHash] = match states.last() {
                Some(s) => &s.block_hashes,
                None => dense,
            };
            let in_place = p.first_rewritten_tokens / bs;
            let (Some(before), Some(&last_dense)) =
                (before.get(..in_place), dense.get(p.logical_tokens / bs - 1))
            else {
                // Not reachable: the chains cover every slot up to the point.
                break;
            };
            let mut block_hashes = before.to_vec();
            let state = BlockHash::of_compacted_state(hasher.identity(), last_dense, &policy_name);
            let after = &prompt[p.logical_tokens..next.unwrap_or(prompt.len())];
            hasher.extend_compacted_hashes(state, p.kept_tokens, after, &mut block_hashes);
            states.push(CompactedPrefix {
                logical_start_tokens: p.logical_tokens,
                kept_tokens: p.kept_tokens,
                first_rewritten_tokens: p.first_rewritten_tokens,
                next_point_tokens: next,
                block_hashes,
            });
        }
        self.scheduler
            .set_compacted_prefixes(seq_id, CompactedPrefixes { states })?;
        Ok(())
    }

    /// After a request's compaction during its prefill at `point_tokens` (`forked`: over the
    /// whole context): when it is the compaction a fresh prefill makes there, its slots
    /// register again under the state's chain; otherwise it registers nothing more until
    /// recomputed.
    pub(crate) fn register_compacted_state(
        &mut self,
        seq_id: SeqId,
        point_tokens: usize,
        forked: bool,
        kept_tokens: usize,
        first_rewritten_tokens: usize,
    ) -> Result<(), EngineError> {
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return Ok(());
        };
        if !forked || seq.compacted_off_plan {
            seq.compacted_off_plan = true;
            return Ok(());
        }
        let resumed = self.scheduler.resume_after_compaction(
            seq_id,
            point_tokens,
            kept_tokens,
            first_rewritten_tokens,
        )?;
        if !resumed {
            if let Some(seq) = self.seqs.get_mut(&seq_id) {
                seq.compacted_off_plan = true;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_evict::{CompressionConfig, CompressionMethod};

    fn keydiff() -> SeqCompression {
        let config = CompressionConfig {
            method: CompressionMethod::KeyDiff,
            ratio: 0.5,
            sink_tokens: 2,
            window_tokens: 4,
            every_n_tokens: 8,
            ..CompressionConfig::default()
        };
        SeqCompression::new(&config, None).unwrap()
    }

    #[test]
    fn a_prefill_compacts_at_every_multiple_of_the_stride_before_its_end() {
        let points = prefill_compactions(&keydiff(), 64, 200);
        let at: Vec<usize> = points.iter().map(|p| p.logical_tokens).collect();
        assert_eq!(at, [64, 128, 192]);
        // The 2 sinks and 4 recent tokens, and half of the rest of what the model has seen
        // (the target follows the logical length); the sinks stay in place.
        let kept: Vec<usize> = points.iter().map(|p| p.kept_tokens).collect();
        assert_eq!(kept, [35, 67, 99]);
        assert!(points.iter().all(|p| p.first_rewritten_tokens == 2));
        // At 0.3 with 8 sinks: two blocks of 4 stay in place, and what is kept ends inside a
        // block (the tokens after the point fill it: the engine test's mixed block).
        let config = CompressionConfig {
            ratio: 0.3,
            sink_tokens: 8,
            ..keydiff().config
        };
        let points = prefill_compactions(&SeqCompression::new(&config, None).unwrap(), 64, 170);
        assert!(points.iter().all(|p| p.first_rewritten_tokens == 8));
        assert!(points.iter().any(|p| p.kept_tokens % 4 != 0), "{points:?}");
        // A prompt ending on a point compacts there as its own (sampling) compaction.
        assert_eq!(prefill_compactions(&keydiff(), 64, 128).len(), 1);
        assert!(prefill_compactions(&keydiff(), 64, 64).is_empty());
    }

    #[test]
    fn only_policies_that_score_from_keys_or_positions_name_their_states() {
        let name = |method| {
            let config = CompressionConfig {
                method,
                ratio: 0.5,
                ..CompressionConfig::default()
            };
            SeqCompression::new(&config, None).and_then(|c| c.cacheable_state_name(64))
        };
        for cacheable in [
            CompressionMethod::KeyDiff,
            CompressionMethod::KNorm,
            CompressionMethod::StreamingLlm,
        ] {
            assert!(name(cacheable).is_some(), "{cacheable:?}");
        }
        for not in [
            CompressionMethod::SnapKv,
            CompressionMethod::Tova,
            CompressionMethod::Random,
        ] {
            assert!(name(not).is_none(), "{not:?}");
        }
        // The stride and every field of the policy are in the name.
        let k = keydiff();
        assert_ne!(k.cacheable_state_name(64), k.cacheable_state_name(128));
        let split = SeqCompression::new(&k.config, Some(8)).unwrap();
        assert!(split.cacheable_state_name(64).is_none());
    }
}
