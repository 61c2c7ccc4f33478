//! One layer's compaction plan ([`KeepPlan`]): which of one sequence's physical tokens each
//! kept-index list keeps, given the layer's scores. [`KeepPlan::keep_lists`] is the definition
//! and the CPU reference of the device selection behind
//! [`KvCacheOps::compact_kv_by_scores`](crate::KvCacheOps::compact_kv_by_scores).

use super::select::{select_keep, select_keep_layer_wide};
use crate::{BackendError, HostTensor, KvCacheOps};

/// Which of one sequence's `physical_tokens` a layer's compaction keeps.
///
/// Every token before `first_evictable_tokens` (a shared prefix) and from
/// `evictable_end_tokens` on is kept. Among the candidates between them, the first
/// `sink_tokens − first_evictable_tokens` (sinks count from the sequence's start) and the last
/// `window_tokens` are protected, and the best of the rest by score (ties to the lower index,
/// NaN lowest) fill the kept count up to `target_tokens`. Per KV head, or one choice for the
/// whole layer ranked by the mean of the heads' scores (`layer_wide`).
///
/// The compaction is handed only the slots from `skip_tokens` on (whole blocks the plan keeps
/// in place: the prefix and the sinks after it); its lists hold indices relative to that slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepPlan {
    /// The sequence's physical length (the scores' width).
    pub physical_tokens: usize,
    /// Tokens kept, all lists alike.
    pub target_tokens: usize,
    /// Start of the evictable range (the tokens before it are kept).
    pub first_evictable_tokens: usize,
    /// End of the evictable range (the tokens from it on are kept).
    pub evictable_end_tokens: usize,
    /// Protected sinks, counted from the sequence's start.
    pub sink_tokens: usize,
    /// Protected newest candidates.
    pub window_tokens: usize,
    /// One choice for the whole layer (the heads' mean score) instead of one per KV head.
    pub layer_wide: bool,
    /// Kept-index lists the compaction takes: one per KV head, or 1 for a layer whose heads
    /// share rows (a latent layer; requires `layer_wide`).
    pub lists: usize,
    /// Leading slots not handed to the compaction, a multiple of the block size; every one of
    /// them must be kept in place by the plan.
    pub skip_tokens: usize,
}

impl KeepPlan {
    /// Rows each list moves: the kept tokens after the skipped slots.
    pub fn rewritten_kept_tokens(&self) -> usize {
        self.target_tokens.saturating_sub(self.skip_tokens)
    }

    /// The block table of the slots the compaction is handed (from `skip_tokens` on).
    pub fn rewritten_table<'t>(
        &self,
        block_table: &'t [u32],
        block_size_tokens: usize,
    ) -> Result<&'t [u32], BackendError> {
        if block_size_tokens == 0 || !self.skip_tokens.is_multiple_of(block_size_tokens) {
            return Err(BackendError::Shape(format!(
                "keep plan: {} skipped slots are not whole blocks of {block_size_tokens}",
                self.skip_tokens
            )));
        }
        Ok(block_table
            .get(self.skip_tokens / block_size_tokens..)
            .unwrap_or(&[]))
    }

    /// Slots the compaction is handed (from `skip_tokens` on).
    pub fn rewritten_tokens(&self) -> usize {
        self.physical_tokens.saturating_sub(self.skip_tokens)
    }

    /// The protection inside the candidates `first_evictable_tokens..evictable_end_tokens`:
    /// `(sinks, window)`, the protected candidates at each end, each at most the candidate
    /// count (sinks count from the sequence's start, so a prefix takes its share of them).
    pub fn protection(&self) -> (usize, usize) {
        let candidates = self
            .evictable_end_tokens
            .saturating_sub(self.first_evictable_tokens);
        (
            self.sink_tokens
                .saturating_sub(self.first_evictable_tokens)
                .min(candidates),
            self.window_tokens.min(candidates),
        )
    }

    /// The selection among the candidates: `(candidates, protected, room)`, where `room`
    /// more are kept by score. The protected count is kept even when the target is lower
    /// (which [`check`](Self::check) refuses).
    pub fn candidate_counts(&self) -> (usize, usize, usize) {
        let (first, end) = (self.first_evictable_tokens, self.evictable_end_tokens);
        let candidates = end.saturating_sub(first);
        let (sinks, window) = self.protection();
        let protected = super::protected_count(candidates, sinks, window);
        let kept_outside = first + self.physical_tokens.saturating_sub(end);
        let keep = self
            .target_tokens
            .saturating_sub(kept_outside)
            .max(protected)
            .min(candidates);
        (candidates, protected, keep - protected)
    }

    /// The score rows (KV heads) of scores shaped `shape`, which must be
    /// `[heads, physical_tokens]`.
    pub fn score_rows(&self, shape: &[usize]) -> Result<usize, BackendError> {
        match shape {
            [heads, width] if *width == self.physical_tokens => Ok(*heads),
            s => Err(BackendError::Shape(format!(
                "keep plan: scores {s:?} for {} tokens",
                self.physical_tokens
            ))),
        }
    }

    /// Checks the plan against `heads` score rows: the lists, the ranges, that the selection
    /// keeps exactly the target, and that the skipped slots stay in place.
    pub fn check(&self, heads: usize) -> Result<(), BackendError> {
        let n = self.physical_tokens;
        let bad = |why: String| Err(BackendError::Shape(format!("keep plan {self:?}: {why}")));
        if heads == 0 {
            return bad("no score rows".into());
        }
        if self.lists != heads && !(self.lists == 1 && self.layer_wide) {
            return bad(format!(
                "{} lists for {heads} score rows (one per row, or one layer-wide list)",
                self.lists
            ));
        }
        if i32::try_from(n).is_err() {
            return bad("the length exceeds i32 indices".into());
        }
        if self.first_evictable_tokens > self.evictable_end_tokens || self.evictable_end_tokens > n
        {
            return bad("the evictable range must lie inside the sequence".into());
        }
        let (candidates, protected, room) = self.candidate_counts();
        let kept = n - candidates + protected + room;
        if kept != self.target_tokens {
            return bad(format!(
                "the selection would keep {kept} tokens, not the target {}",
                self.target_tokens
            ));
        }
        // The skipped slots stay in place only if all of them are kept: the prefix, then the
        // protected sinks right after it.
        let in_place = self
            .first_evictable_tokens
            .max(self.sink_tokens.min(self.evictable_end_tokens));
        if self.skip_tokens > in_place {
            return bad(format!(
                "{} skipped slots, but only the first {in_place} are sure to stay in place",
                self.skip_tokens
            ));
        }
        Ok(())
    }

    /// The kept indices per list given `scores` (`[heads, physical_tokens]`), ascending and
    /// relative to `skip_tokens`: what the compaction moves. Every list holds
    /// [`rewritten_kept_tokens`](Self::rewritten_kept_tokens) indices; a target below what
    /// the plan must keep (the ranges outside the candidates and the protected ones) is an
    /// error.
    pub fn keep_lists(&self, scores: &HostTensor) -> Result<Vec<Vec<u32>>, BackendError> {
        let n = self.physical_tokens;
        let heads = self.score_rows(scores.shape())?;
        self.check(heads)?;
        let (first, evictable) = (self.first_evictable_tokens, self.evictable_end_tokens);
        let (_, protected, room) = self.candidate_counts();
        let (sinks, window) = self.protection();
        let candidates: Vec<Vec<f32>> = scores
            .data()
            .chunks_exact(n.max(1))
            .take(heads)
            .map(|row| row[first..evictable].to_vec())
            .collect();
        let select = if self.layer_wide {
            select_keep_layer_wide
        } else {
            select_keep
        };
        let chosen = select(
            &candidates,
            evictable - first,
            protected + room,
            sinks,
            window,
        )?;
        let skip = self.skip_tokens as u32;
        chosen
            .into_iter()
            .take(self.lists)
            .map(|head| {
                let kept: Vec<u32> = (0..first as u32)
                    .chain(head.into_iter().map(|i| i + first as u32))
                    .chain(evictable as u32..n as u32)
                    .collect();
                debug_assert_eq!(kept.len(), self.target_tokens, "checked by `check`");
                Ok(kept[self.skip_tokens..].iter().map(|&i| i - skip).collect())
            })
            .collect()
    }

    /// Compacts one layer by host `scores`: [`keep_lists`](Self::keep_lists), then
    /// [`KvCacheOps::compact_kv`] on the slots from `skip_tokens` on. The default of
    /// [`KvCacheOps::compact_kv_by_scores`], and the path of scores made on the host.
    pub fn compact_on_host<B: KvCacheOps + ?Sized>(
        &self,
        backend: &B,
        cache: &mut B::KvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        scores: &HostTensor,
    ) -> Result<(), BackendError> {
        let keep = self.keep_lists(scores)?;
        let table = self.rewritten_table(block_table, block_size_tokens)?;
        backend.compact_kv(
            cache,
            table,
            block_size_tokens,
            self.rewritten_tokens(),
            &keep,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(n: usize, target: usize) -> KeepPlan {
        KeepPlan {
            physical_tokens: n,
            target_tokens: target,
            first_evictable_tokens: 0,
            evictable_end_tokens: n,
            sink_tokens: 4,
            window_tokens: 8,
            layer_wide: false,
            lists: 2,
            skip_tokens: 0,
        }
    }

    fn scores(heads: usize, n: usize, seed: u64) -> HostTensor {
        let mut state = seed;
        let data = (0..heads * n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                // Few distinct values, so ties are common.
                ((state >> 60) as f32) - 8.0
            })
            .collect();
        HostTensor::new(vec![heads, n], data).expect("shape")
    }

    #[test]
    fn a_plan_keeps_the_prefix_the_tail_and_the_protected_candidates() {
        // 40 tokens: prefix 8, candidates 8..32, tail 32..40; sinks 4 (inside the prefix),
        // window 8 → candidates 24..32 protected; target 28 → 4 more from 8..24 by score.
        let p = KeepPlan {
            first_evictable_tokens: 8,
            evictable_end_tokens: 32,
            ..plan(40, 28)
        };
        let s = HostTensor::new(
            vec![1, 40],
            (0..40)
                .map(|i| {
                    if i == 9 || i == 12 || i == 13 || i == 20 {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect(),
        )
        .unwrap();
        let p = KeepPlan { lists: 1, ..p };
        let kept = p.keep_lists(&s).unwrap();
        let want: Vec<u32> = (0..8).chain([9, 12, 13, 20]).chain(24..40).collect();
        assert_eq!(kept, vec![want]);
    }

    #[test]
    fn skipped_slots_are_cut_off_and_the_rest_shifted() {
        let p = KeepPlan {
            first_evictable_tokens: 8,
            evictable_end_tokens: 32,
            skip_tokens: 8,
            lists: 1,
            ..plan(40, 28)
        };
        let s = HostTensor::new(vec![1, 40], vec![0.0; 40]).unwrap();
        let kept = p.keep_lists(&s).unwrap();
        // Ties go to the lower index: candidates 8..12, then the protected 24..32, the tail.
        let want: Vec<u32> = (0..4).chain(16..32).collect();
        assert_eq!(kept, vec![want]);
        assert_eq!(kept[0].len(), p.rewritten_kept_tokens());
        assert_eq!(
            p.rewritten_table(&[5, 6, 7, 9, 11], 8).unwrap(),
            &[6, 7, 9, 11]
        );
    }

    #[test]
    fn protection_counts_inside_the_candidates() {
        // Candidates 8..20 (12): the sinks (4) fall inside the prefix of 8, the window (30)
        // covers every candidate.
        let p = KeepPlan {
            first_evictable_tokens: 8,
            evictable_end_tokens: 20,
            window_tokens: 30,
            ..plan(40, 40)
        };
        assert_eq!(p.protection(), (0, 12));
        assert_eq!(p.candidate_counts(), (12, 12, 0));
        assert_eq!(
            KeepPlan {
                sink_tokens: 10,
                ..p
            }
            .protection(),
            (2, 12)
        );
        assert_eq!(p.rewritten_tokens(), 40);
        assert_eq!(p.score_rows(&[3, 40]).unwrap(), 3);
        assert!(p.score_rows(&[3, 39]).is_err() && p.score_rows(&[40]).is_err());
    }

    #[test]
    fn a_30k_token_layer_keeps_its_target_per_head_and_layer_wide() {
        // The sizes users run: 30k tokens, 8 KV heads, a shared prefix of 2 blocks, skipped.
        let n = 30_000;
        let scores = scores(8, n, 7);
        for layer_wide in [false, true] {
            let p = KeepPlan {
                first_evictable_tokens: 32,
                sink_tokens: 4,
                window_tokens: 64,
                layer_wide,
                lists: 8,
                skip_tokens: 32,
                ..plan(n, 15_000)
            };
            let kept = p.keep_lists(&scores).unwrap();
            assert_eq!(kept.len(), 8);
            for list in &kept {
                assert_eq!(list.len(), p.rewritten_kept_tokens());
                assert!(list.windows(2).all(|w| w[0] < w[1]));
                // The window's 64 candidates are the last rows kept.
                assert_eq!(
                    list[list.len() - 64..],
                    (n as u32 - 32 - 64..n as u32 - 32).collect::<Vec<_>>()[..]
                );
            }
            assert_eq!(kept.iter().all(|l| l == &kept[0]), layer_wide);
        }
    }

    #[test]
    fn invalid_plans_are_errors() {
        let s = scores(2, 40, 1);
        // Three lists for two heads; one list without layer_wide.
        assert!(KeepPlan {
            lists: 3,
            ..plan(40, 20)
        }
        .keep_lists(&s)
        .is_err());
        assert!(KeepPlan {
            lists: 1,
            ..plan(40, 20)
        }
        .keep_lists(&s)
        .is_err());
        // Scores of another length.
        assert!(plan(41, 20).keep_lists(&s).is_err());
        // A target below the protected tokens cannot be met.
        assert!(plan(40, 6).keep_lists(&s).is_err());
        // Skipped slots beyond the sinks could move.
        assert!(KeepPlan {
            skip_tokens: 8,
            ..plan(40, 20)
        }
        .keep_lists(&s)
        .is_err());
        assert!(plan(40, 20).rewritten_table(&[1, 2], 0).is_err());
        assert!(KeepPlan {
            skip_tokens: 4,
            ..plan(40, 20)
        }
        .rewritten_table(&[1, 2, 3], 8)
        .is_err());
    }

    proptest! {
        #[test]
        fn lists_hold_the_target_ascending_with_every_protected_token(
            n in 1usize..200,
            heads in 1usize..5,
            first_share in 0.0f64..0.5,
            end_share in 0.5f64..1.0,
            target_share in 0.0f64..1.0,
            sink in 0usize..12,
            window in 0usize..24,
            layer_wide in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let first = (first_share * n as f64) as usize;
            let end = ((end_share * n as f64) as usize).max(first);
            let candidates = end - first;
            let protected = crate::keep::protected_count(
                candidates, sink.saturating_sub(first), window.min(candidates));
            let floor = first + protected + (n - end);
            let target = floor + ((n - floor) as f64 * target_share) as usize;
            let p = KeepPlan {
                physical_tokens: n,
                target_tokens: target,
                first_evictable_tokens: first,
                evictable_end_tokens: end,
                sink_tokens: sink,
                window_tokens: window,
                layer_wide,
                lists: heads,
                skip_tokens: 0,
            };
            let kept = p.keep_lists(&scores(heads, n, seed)).unwrap();
            prop_assert_eq!(kept.len(), heads);
            for list in &kept {
                prop_assert_eq!(list.len(), target);
                prop_assert!(list.windows(2).all(|w| w[0] < w[1]));
                for i in 0..n {
                    let protected = i < first.max(sink.min(end)) || i >= end
                        || (i >= first && i + window >= end);
                    if protected {
                        prop_assert!(list.contains(&(i as u32)), "token {} dropped", i);
                    }
                }
            }
            if layer_wide {
                prop_assert!(kept.iter().all(|l| l == &kept[0]));
            }
        }
    }
}
