//! Admission control: when the head of the waiting queue may start.
//!
//! vLLM admits a request as soon as its first chunk fits (optimistic): running sequences then
//! grow into the free blocks and the newest is preempted (recomputed) when they collide. With
//! uncompressed requests a collision costs one recompute. With eviction it is worse: a
//! compressed request holds about `(1 − r)` of its length, so the cache admits `1/(1 − r)` times
//! as many, and every one of them grows, and the chunk each prefill step writes is held
//! uncompressed until the compaction that follows it. At ratio 0.5 on the H200 (8 GiB, 3k-token
//! prompts) that was 326 preemptions for 48 requests.
//!
//! [`AdmissionPolicy::ReservePeak`] admits a request only if the blocks still free cover what
//! every running request and the candidate will hold at their peak — `keep(prompt + max_tokens)`
//! plus the decode slack before the next compaction, as the engine projects it — plus, when any
//! of them compresses, one step's worth of uncompressed prefill tokens (the transient between a
//! chunk's write and its compaction; steps share one token budget, so one reserve covers all).
//!
//! Under [`AdmissionPolicy::Optimistic`] a compressing request that was preempted is readmitted
//! only when the free blocks cover the most it will hold itself ([`Footprint::max_held_tokens`]:
//! its peak plus a prefill chunk in flight). Readmitted as soon as its first chunk fits, it
//! would grow into the same running requests at the same point of its prompt and be preempted
//! again, its prefill recomputed each time: on the H100 (session 30, 0.75 GiB of KV, two
//! KeyDiff@0.5 prompts) 10 preemptions at 24k tokens and 22 at 32k, 2.4× the plain engine's
//! time. Waiting for the whole reserve-peak sum instead (every running request's growth and one
//! step of prefill) also ends the thrash, but stalls the queue behind it: on the CPU engine's
//! many-request eviction workloads it took up to 21% more steps than vLLM's rule, this one at
//! most 5% while recomputing fewer prompt tokens. Uncompressed requests keep vLLM's rule, so
//! plain-engine comparisons with vLLM stay like for like; [`AdmissionPolicy::OptimisticReadmit`]
//! applies the own-peak readmission to them too (on the CPU engine: recomputed prompt tokens
//! −0–49% at +0–4.5% steps), for an A/B on the GPU before it could become the default.

use starling_kv::SeqId;

use super::sequence::{SeqProgress, SeqStatus};
use super::Scheduler;

/// How the scheduler decides whether a waiting request may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdmissionPolicy {
    /// Admit while the first chunk fits; collisions later preempt the newest (vLLM's rule). A
    /// compressing request that was preempted is readmitted only when the free blocks cover its
    /// own peak (see the module doc).
    #[default]
    Optimistic,
    /// Admit only while the projected peak of every running request and the candidate fits.
    ReservePeak,
    /// As [`Self::Optimistic`], and every preempted request, compressing or not, is readmitted
    /// only when the free blocks cover its own peak.
    OptimisticReadmit,
}

impl AdmissionPolicy {
    /// The policy's name in flags and result files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Optimistic => "optimistic",
            Self::ReservePeak => "reserve-peak",
            Self::OptimisticReadmit => "optimistic-readmit",
        }
    }
}

/// What a request will hold in the cache at most, as projected when it is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Most token slots it will hold at once once its tokens are compacted.
    pub peak_tokens: usize,
    /// Whether it compresses, and so briefly holds a prefill chunk uncompressed on top of that.
    pub compresses: bool,
    /// Most slots a compressing request ever holds, the prefill chunk in flight included: it
    /// is refused when queued if that exceeds the whole cache (its own policy could never
    /// run). An uncompressed request is refused when its prompt alone exceeds the cache.
    pub max_held_tokens: usize,
}

impl Footprint {
    /// An uncompressed request that may grow to `total_tokens` (prompt plus output).
    pub fn uncompressed(total_tokens: usize) -> Self {
        Self {
            peak_tokens: total_tokens,
            compresses: false,
            max_held_tokens: total_tokens,
        }
    }

    /// A compressing request that holds `peak_tokens` after compaction, never more than
    /// `total_tokens` (prompt plus output), and up to one prefill chunk of `chunk_tokens` more
    /// between compactions.
    pub fn compressed(peak_tokens: usize, total_tokens: usize, chunk_tokens: usize) -> Self {
        let peak_tokens = peak_tokens.min(total_tokens);
        Self {
            peak_tokens,
            compresses: true,
            max_held_tokens: peak_tokens.saturating_add(chunk_tokens).min(total_tokens),
        }
    }
}

impl Scheduler {
    /// Whether `candidate` (the head of the waiting queue) may start now under the policy.
    pub(super) fn admits(&self, candidate: SeqId) -> bool {
        let Some(cand) = self.seqs.get(&candidate) else {
            return false;
        };
        if self.running.is_empty() {
            // Alone, a request always runs: its prompt fits the cache (checked when queued),
            // and growth past the cache ends it at the length limit.
            return true;
        }
        let readmits_by_own_peak = match self.config.admission {
            AdmissionPolicy::ReservePeak => return self.reserve_peak_fits(cand),
            AdmissionPolicy::Optimistic => cand.footprint.compresses,
            AdmissionPolicy::OptimisticReadmit => true,
        };
        !(readmits_by_own_peak && cand.times_preempted > 0)
            || self.kv.num_free_blocks()
                >= self.kv.blocks_for_tokens(cand.footprint.max_held_tokens)
    }

    /// Whether the free blocks cover every running request's growth to its projected peak, the
    /// candidate's peak and, when any of them compresses, one step of uncompressed prefill.
    fn reserve_peak_fits(&self, cand: &SeqProgress) -> bool {
        let block_tokens = self.kv.block_size_tokens();
        let mut reserve_blocks = self.kv.blocks_for_tokens(cand.footprint.peak_tokens);
        let mut any_compresses = cand.footprint.compresses;
        for id in &self.running {
            let Some(seq) = self.seqs.get(id) else {
                continue;
            };
            debug_assert_eq!(seq.status, SeqStatus::Running);
            let held_blocks = self.kv.held_blocks(*id);
            let peak_blocks = self.kv.blocks_for_tokens(seq.footprint.peak_tokens);
            reserve_blocks += peak_blocks.saturating_sub(held_blocks);
            any_compresses |= seq.footprint.compresses;
        }
        if any_compresses {
            reserve_blocks += self.config.max_num_batched_tokens.div_ceil(block_tokens);
        }
        self.kv.num_free_blocks() >= reserve_blocks
    }
}
