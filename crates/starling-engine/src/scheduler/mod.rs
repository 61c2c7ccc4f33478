//! The scheduler: continuous batching with chunked prefill and preemption by
//! recompute, in the vLLM V1 style.
//!
//! It counts tokens, not phases. Each sequence has `num_tokens` (prompt plus
//! generated, all known token ids, kept by the engine) and
//! `num_computed_tokens` (tokens whose KV is in the cache). A step schedules,
//! per chosen sequence, the contiguous range
//! `[num_computed_tokens, num_computed_tokens + n)`.
//!
//! Protocol, one step at a time (the scheduler never waits on a device):
//! 1. [`Scheduler::schedule`] returns a [`StepPlan`]. KV slots for every
//!    scheduled token are allocated, and `num_computed_tokens` advances AT
//!    ONCE (as vLLM's `_update_after_schedule` does): the engine must run
//!    every plan it gets, or abort the sequences it could not run.
//! 2. The engine runs the model; for each `samples_next_token` sequence it
//!    samples, then calls [`Scheduler::append_token`] or [`Scheduler::finish`].
//!
//! Preemption is by recompute: the victim's blocks are freed, its
//! `num_computed_tokens` drops to 0, and it goes to the FRONT of the waiting
//! queue. Nothing is lost, because the engine keeps its token ids; when it
//! is readmitted, its prompt and generated tokens are prefilled again and the
//! chunk that reaches the end samples the next token as before.
//!
//! A running sequence can be *held* ([`Scheduler::hold`]): it stays running and
//! keeps its blocks, but no plan schedules it until [`Scheduler::release`]. The
//! engine holds a request while it compacts its cache over several steps, so
//! its block table cannot change under the compaction. A held sequence may
//! still be preempted (that releases it).
//!
//! Prefix caching: the engine hands each sequence's [`BlockHash`] chain to the
//! scheduler as its tokens become known ([`Scheduler::extend_block_hashes`];
//! opaque content addresses, never token ids). A sequence starting from
//! nothing computed (new, or preempted) reuses the longest cached run of its
//! full blocks, except the block holding its last known token, whose logits
//! must be computed; its `num_computed_tokens` starts at the hit. After each
//! forward pass the engine registers the blocks that became full
//! ([`Scheduler::register_computed_blocks`]).

mod admission;
mod compacted_prefix;
mod config;
mod error;
mod plan;
mod sequence;
mod step;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};

use starling_kv::{BlockHash, BlockId, KvCacheManager, KvError, SeqId};

pub use admission::{AdmissionPolicy, Footprint};
pub use compacted_prefix::{CompactedPrefix, CompactedPrefixes};
pub use config::SchedulerConfig;
pub use error::SchedulerError;
pub use plan::{ScheduledSeq, StepPlan, StepStats};
pub use sequence::{SeqProgress, SeqStatus};

/// Decides which tokens of which sequences each step computes, and owns the
/// KV-cache manager that backs those decisions.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    seqs: HashMap<SeqId, SeqProgress>,
    /// FCFS queue; preempted sequences are pushed to the front.
    waiting: VecDeque<SeqId>,
    /// Admission order: the last one is the first preemption victim.
    running: Vec<SeqId>,
    /// Running sequences no plan schedules until released (see the module doc).
    held: HashSet<SeqId>,
    /// Each sequence's chain of full-block hashes so far (prefix caching; empty when off).
    block_hashes: HashMap<SeqId, Vec<BlockHash>>,
    /// Per sequence, the newest known tokens admission always computes, cached or not (an
    /// observation window whose queries the forward pass must capture); 1 when absent.
    uncached_tail_tokens: HashMap<SeqId, usize>,
    /// Per sequence, the stride its multi-token chunks never cross (see [`Self::align_chunks`]).
    chunk_stride_tokens: HashMap<SeqId, usize>,
    /// Per compressing sequence, the compacted states its prefill passes through (see
    /// `compacted_prefix`).
    compacted_prefixes: HashMap<SeqId, CompactedPrefixes>,
    /// Per sequence that reached or started from a compacted state, the chain of its slots it
    /// registers under instead of its dense chain (until preempted).
    slot_chains: HashMap<SeqId, Vec<BlockHash>>,
    num_preemptions: u64,
}

impl Scheduler {
    /// A scheduler over `kv`, which must be empty and use the config's block size.
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Result<Self, SchedulerError> {
        config.validate()?;
        if kv.block_size_tokens() != config.block_size_tokens {
            return Err(SchedulerError::InvalidConfig(format!(
                "block size {} tokens differs from the KV cache's {}",
                config.block_size_tokens,
                kv.block_size_tokens()
            )));
        }
        if kv.seq_ids().next().is_some() {
            return Err(SchedulerError::InvalidConfig(
                "the KV-cache manager already holds sequences".into(),
            ));
        }
        Ok(Self {
            config,
            kv,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            held: HashSet::new(),
            block_hashes: HashMap::new(),
            uncached_tail_tokens: HashMap::new(),
            chunk_stride_tokens: HashMap::new(),
            compacted_prefixes: HashMap::new(),
            slot_chains: HashMap::new(),
            num_preemptions: 0,
        })
    }

    /// The limits this scheduler enforces.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Longest an uncompressed sequence may grow: `min(max_model_len, KV capacity)`, so a
    /// sequence running alone always fits in the cache. A compressing one grows to
    /// max_model_len: admission checked that its peak fits.
    pub fn max_seq_len_tokens(&self) -> usize {
        self.config
            .max_model_len_tokens
            .min(self.kv.max_tokens_one_seq())
    }

    /// Queues a new request at the back of the waiting queue, projected to grow to the
    /// context limit ([`Self::add_request_with_footprint`] tells the scheduler more).
    pub fn add_request(
        &mut self,
        seq_id: SeqId,
        num_prompt_tokens: usize,
    ) -> Result<(), SchedulerError> {
        let footprint = Footprint::uncompressed(self.max_seq_len_tokens());
        self.add_request_with_footprint(seq_id, num_prompt_tokens, footprint)
    }

    /// [`Self::add_request`] with the most the request is projected to hold in the cache.
    pub fn add_request_with_footprint(
        &mut self,
        seq_id: SeqId,
        num_prompt_tokens: usize,
        footprint: Footprint,
    ) -> Result<(), SchedulerError> {
        if self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::DuplicateSequence(seq_id));
        }
        if num_prompt_tokens == 0 {
            return Err(SchedulerError::EmptyPrompt(seq_id));
        }
        if num_prompt_tokens > self.config.max_model_len_tokens {
            return Err(SchedulerError::PromptTooLong {
                seq_id,
                num_prompt_tokens,
                max_model_len_tokens: self.config.max_model_len_tokens,
            });
        }
        let capacity_tokens = self.kv.max_tokens_one_seq();
        if footprint.compresses {
            // Whole blocks, as the allocator hands them out.
            let blocks = self.kv.blocks_for_tokens(footprint.max_held_tokens);
            if blocks > self.kv.num_total_blocks() {
                return Err(SchedulerError::PeakExceedsCache {
                    seq_id,
                    max_held_tokens: footprint.max_held_tokens,
                    capacity_tokens,
                });
            }
        } else if num_prompt_tokens > capacity_tokens {
            return Err(SchedulerError::PromptExceedsCache {
                seq_id,
                num_prompt_tokens,
                capacity_tokens,
            });
        }
        self.seqs.insert(
            seq_id,
            SeqProgress {
                status: SeqStatus::Waiting,
                num_prompt_tokens,
                num_tokens: num_prompt_tokens,
                num_computed_tokens: 0,
                footprint,
                times_preempted: 0,
            },
        );
        self.waiting.push_back(seq_id);
        Ok(())
    }

    /// Records a token sampled for `seq_id` (its KV slot is allocated by the
    /// next `schedule`). Refused unless every known token has been computed,
    /// and at [`Self::max_seq_len_tokens`] ([`SchedulerError::LengthLimit`]:
    /// the engine should finish the sequence).
    pub fn append_token(&mut self, seq_id: SeqId) -> Result<(), SchedulerError> {
        let (max_model_len, max_seq_len) =
            (self.config.max_model_len_tokens, self.max_seq_len_tokens());
        let seq = self
            .seqs
            .get_mut(&seq_id)
            .ok_or(SchedulerError::UnknownSequence(seq_id))?;
        // A compressing sequence holds at most its admitted peak, never its whole length: it
        // may grow past the cache's slots (that is what eviction buys), up to max_model_len.
        let limit_tokens = if seq.footprint.compresses {
            max_model_len
        } else {
            max_seq_len
        };
        if seq.num_computed_tokens != seq.num_tokens {
            return Err(SchedulerError::NotAwaitingToken {
                seq_id,
                num_tokens: seq.num_tokens,
                num_computed_tokens: seq.num_computed_tokens,
            });
        }
        if seq.num_tokens >= limit_tokens {
            return Err(SchedulerError::LengthLimit {
                seq_id,
                limit_tokens,
            });
        }
        seq.num_tokens += 1;
        Ok(())
    }

    /// Removes a running sequence that is done and frees its blocks at once.
    pub fn finish(&mut self, seq_id: SeqId) -> Result<(), SchedulerError> {
        match self.seqs.get(&seq_id) {
            None => Err(SchedulerError::UnknownSequence(seq_id)),
            Some(seq) if seq.status != SeqStatus::Running => {
                Err(SchedulerError::NotRunning(seq_id))
            }
            Some(_) => self.remove(seq_id),
        }
    }

    /// Removes a sequence, waiting or running, and frees its blocks.
    pub fn abort(&mut self, seq_id: SeqId) -> Result<(), SchedulerError> {
        if !self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::UnknownSequence(seq_id));
        }
        self.remove(seq_id)
    }

    /// Token-eviction hook: keeps `new_physical_len_tokens` KV slots of a
    /// running sequence (the caller already compacted survivors to the
    /// front); its logical length and `num_computed_tokens` are unchanged.
    /// Returns the blocks freed.
    pub fn shrink_physical(
        &mut self,
        seq_id: SeqId,
        new_physical_len_tokens: usize,
    ) -> Result<usize, SchedulerError> {
        match self.seqs.get(&seq_id) {
            None => Err(SchedulerError::UnknownSequence(seq_id)),
            Some(seq) if seq.status != SeqStatus::Running => {
                Err(SchedulerError::NotRunning(seq_id))
            }
            Some(_) => Ok(self.kv.shrink_physical(seq_id, new_physical_len_tokens)?),
        }
    }

    /// Keeps a running sequence out of every plan until [`Self::release`]; its blocks and
    /// progress stay as they are. Refused for a sequence that is not running.
    pub fn hold(&mut self, seq_id: SeqId) -> Result<(), SchedulerError> {
        match self.seqs.get(&seq_id) {
            None => Err(SchedulerError::UnknownSequence(seq_id)),
            Some(seq) if seq.status != SeqStatus::Running => {
                Err(SchedulerError::NotRunning(seq_id))
            }
            Some(_) => {
                self.held.insert(seq_id);
                Ok(())
            }
        }
    }

    /// Lets plans schedule a held sequence again (a no-op for one that is not held).
    pub fn release(&mut self, seq_id: SeqId) {
        self.held.remove(&seq_id);
    }

    /// Whether `seq_id` is held.
    pub fn is_held(&self, seq_id: SeqId) -> bool {
        self.held.contains(&seq_id)
    }

    /// Sequences held.
    pub fn num_held(&self) -> usize {
        self.held.len()
    }

    /// Appends to `seq_id`'s chain the hashes of the full blocks that follow the ones it has
    /// ([`Self::block_hashes`]), in order: the engine extends it as tokens become known (the
    /// prompt when queued, a block's worth of generated tokens as it fills).
    pub fn extend_block_hashes(
        &mut self,
        seq_id: SeqId,
        hashes: &[BlockHash],
    ) -> Result<(), SchedulerError> {
        if !self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::UnknownSequence(seq_id));
        }
        self.block_hashes
            .entry(seq_id)
            .or_default()
            .extend_from_slice(hashes);
        Ok(())
    }

    /// Makes admission compute at least the newest `tokens` known tokens of `seq_id` even
    /// when the prefix cache holds them (at least the last one is always computed, for its
    /// logits): an eviction policy that scores with the queries of an observation window needs
    /// those rows to run through the model.
    pub fn keep_tail_uncached(
        &mut self,
        seq_id: SeqId,
        tokens: usize,
    ) -> Result<(), SchedulerError> {
        if !self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::UnknownSequence(seq_id));
        }
        self.uncached_tail_tokens.insert(seq_id, tokens);
        Ok(())
    }

    /// Cuts `seq_id`'s chunks so that none crosses a multiple of `stride_tokens` (positions
    /// `k × stride`), and makes admission reuse cached tokens only before the first multiple
    /// (strictly: the chunk that ends there runs, and compacts).
    /// A compressing sequence compacts at those positions (and at its prompt's end), so its
    /// compaction points, hence its cache contents and outputs, are the same whatever the
    /// batch around it cuts its chunks to and whatever the prefix cache holds: the tokens
    /// after the first point were computed, in a run without the cache, over a compacted
    /// context, so cached dense blocks there are not theirs. `stride_tokens` 0 is refused.
    pub fn align_chunks(
        &mut self,
        seq_id: SeqId,
        stride_tokens: usize,
    ) -> Result<(), SchedulerError> {
        if !self.seqs.contains_key(&seq_id) {
            return Err(SchedulerError::UnknownSequence(seq_id));
        }
        if stride_tokens == 0 {
            return Err(SchedulerError::InvalidConfig(
                "a chunk stride of 0 tokens".into(),
            ));
        }
        self.chunk_stride_tokens.insert(seq_id, stride_tokens);
        Ok(())
    }

    /// The most tokens a chunk of `seq_id` starting at `computed_tokens` may hold under its
    /// [`Self::align_chunks`] stride (`usize::MAX` without one).
    fn chunk_room_tokens(&self, seq_id: SeqId, computed_tokens: usize) -> usize {
        self.chunk_stride_tokens
            .get(&seq_id)
            .map_or(usize::MAX, |&stride| stride - computed_tokens % stride)
    }

    /// `seq_id`'s chain of full-block hashes so far (empty for an unknown sequence).
    pub fn block_hashes(&self, seq_id: SeqId) -> &[BlockHash] {
        self.block_hashes.get(&seq_id).map_or(&[], Vec::as_slice)
    }

    /// After a forward pass over a model with sliding-window layers: gives back, in every
    /// windowed cache group, each scheduled sequence's leading blocks that the next query's
    /// window (slots `n + 1 - window ..= n` for a sequence of `n` slots) no longer reaches
    /// ([`KvCacheManager::release_behind_windows`]). A failure (a compacted table) only keeps
    /// the blocks, so it is logged.
    pub fn release_behind_windows(&mut self, plan: &StepPlan) {
        for s in &plan.scheduled {
            if !self.kv.contains(s.seq_id) {
                continue;
            }
            if let Err(e) = self.kv.release_behind_windows(s.seq_id) {
                tracing::warn!("{:?}: blocks behind the window kept: {e}", s.seq_id);
            }
        }
    }

    /// Registers in the prefix cache the full blocks of a running sequence whose K/V is now
    /// written: call after the forward pass that computed them. Returns the blocks newly
    /// registered (0 with caching off, for a compacted sequence, or a waiting one).
    pub fn register_computed_blocks(&mut self, seq_id: SeqId) -> Result<usize, SchedulerError> {
        let seq = self
            .seqs
            .get(&seq_id)
            .ok_or(SchedulerError::UnknownSequence(seq_id))?;
        if seq.status != SeqStatus::Running || !self.kv.prefix_caching_enabled() {
            return Ok(0);
        }
        debug_assert!(self
            .kv
            .table(seq_id)
            .is_none_or(|t| t.logical_len_tokens() == seq.num_computed_tokens));
        // Its slots' chain once it reached or started from a compacted state, else its dense
        // chain.
        let hashes = self
            .slot_chains
            .get(&seq_id)
            .or_else(|| self.block_hashes.get(&seq_id))
            .map_or(&[][..], Vec::as_slice);
        // Every slot the table holds is written once its forward pass ran.
        let physical = self.kv.table(seq_id).map_or(0, |t| t.physical_len_tokens());
        let full_blocks = physical / self.kv.block_size_tokens();
        let written = &hashes[..hashes.len().min(full_blocks)];
        Ok(self.kv.register_full_blocks(seq_id, written)?)
    }

    /// Physical tokens of a running sequence up to the end of its last block shared with
    /// another sequence: a compaction may rewrite only slots from here on.
    pub fn shared_prefix_len_tokens(&self, seq_id: SeqId) -> Result<usize, SchedulerError> {
        Ok(self.kv.shared_prefix_len_tokens(seq_id)?)
    }

    /// Announces a compaction of a running sequence rewriting its slots from
    /// `first_rewritten_token` on (before any write): those blocks leave the prefix cache and
    /// the sequence registers nothing more. Refused, changing nothing, when one of them is
    /// shared ([`KvError::SharedBlockRewrite`]).
    pub fn prepare_rewrite(
        &mut self,
        seq_id: SeqId,
        first_rewritten_token: usize,
    ) -> Result<usize, SchedulerError> {
        match self.seqs.get(&seq_id) {
            None => Err(SchedulerError::UnknownSequence(seq_id)),
            Some(seq) if seq.status != SeqStatus::Running => {
                Err(SchedulerError::NotRunning(seq_id))
            }
            Some(_) => Ok(self.kv.prepare_rewrite(seq_id, first_rewritten_token)?),
        }
    }

    /// Blocks [`Self::fork_for_rewrite`] must take from the pool for a compaction of
    /// `seq_id` rewriting from `first_rewritten_token` on (its shared blocks there; cached
    /// blocks it alone holds are copied only into spare uncached blocks).
    pub fn blocks_to_fork(
        &self,
        seq_id: SeqId,
        first_rewritten_token: usize,
    ) -> Result<usize, SchedulerError> {
        Ok(self.kv.blocks_to_fork(seq_id, first_rewritten_token)?)
    }

    /// Free blocks an allocation could take now (uncached, then cached ones evicted LRU).
    pub fn num_free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    /// Copy-on-compact: announces a compaction of a running sequence rewriting its slots from
    /// `first_rewritten_token` on, giving it a private copy of each cached or shared block
    /// there (returned as `(original, copy)` pairs whose K/V the caller copies in every layer
    /// before the rewrite). The originals stay in the prefix cache for later requests and
    /// other holders; the sequence registers nothing more. All or nothing on
    /// [`KvError::OutOfBlocks`].
    pub fn fork_for_rewrite(
        &mut self,
        seq_id: SeqId,
        first_rewritten_token: usize,
    ) -> Result<Vec<(BlockId, BlockId)>, SchedulerError> {
        match self.seqs.get(&seq_id) {
            None => Err(SchedulerError::UnknownSequence(seq_id)),
            Some(seq) if seq.status != SeqStatus::Running => {
                Err(SchedulerError::NotRunning(seq_id))
            }
            Some(_) => Ok(self.kv.fork_for_rewrite(seq_id, first_rewritten_token)?),
        }
    }

    /// Progress of one sequence, if it is waiting or running.
    pub fn sequence(&self, seq_id: SeqId) -> Option<SeqProgress> {
        self.seqs.get(&seq_id).copied()
    }

    /// Sequences waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any sequence is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Waiting sequences, front of the queue first.
    pub fn waiting_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.waiting.iter().copied()
    }

    /// Running sequences, in admission order.
    pub fn running_ids(&self) -> &[SeqId] {
        &self.running
    }

    /// Preemptions since construction.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    /// Zeroes the counters a run moved (preemptions, prefix-cache queries and hits): the
    /// engine's warm-up leaves them as a fresh scheduler's.
    pub fn reset_counters(&mut self) {
        self.num_preemptions = 0;
        self.kv.reset_prefix_cache_stats();
    }

    /// Read-only KV-cache manager: block tables and slot mappings for the runner.
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Checks that queues, sequence states and the KV books agree (for
    /// tests): each sequence is in exactly the queue its status says;
    /// running ones hold a table whose logical length is their computed
    /// count; waiting ones hold no blocks; limits hold.
    pub fn check_invariants(&self) -> Result<(), SchedulerError> {
        self.kv.check_invariants()?;
        let fail = |msg: String| Err(SchedulerError::Kv(KvError::InvariantViolated(msg)));
        if self.running.len() > self.config.max_num_seqs {
            return fail(format!("{} running > max_num_seqs", self.running.len()));
        }
        if self.running.len() + self.waiting.len() != self.seqs.len() {
            return fail("queues and sequence map differ in size".into());
        }
        for (queue, status) in [
            (self.running.iter().collect::<Vec<_>>(), SeqStatus::Running),
            (self.waiting.iter().collect::<Vec<_>>(), SeqStatus::Waiting),
        ] {
            for id in queue {
                let Some(seq) = self.seqs.get(id) else {
                    return fail(format!("{id} queued but unknown"));
                };
                if seq.status != status {
                    return fail(format!("{id} is {:?} in the {status:?} queue", seq.status));
                }
                if seq.num_computed_tokens > seq.num_tokens {
                    return fail(format!("{id} computed more tokens than it has"));
                }
                let logical = self.kv.table(*id).map(|t| t.logical_len_tokens());
                let want = match status {
                    SeqStatus::Running => Some(seq.num_computed_tokens),
                    SeqStatus::Waiting => None,
                };
                if logical != want || (status == SeqStatus::Waiting && seq.num_computed_tokens != 0)
                {
                    return fail(format!("{id} ({status:?}): KV logical length {logical:?}"));
                }
            }
        }
        if self.kv.seq_ids().count() != self.running.len() {
            return fail("KV tables held by sequences that are not running".into());
        }
        if let Some(id) = self.held.iter().find(|id| !self.running.contains(id)) {
            return fail(format!("{id} is held but not running"));
        }
        Ok(())
    }

    fn remove(&mut self, seq_id: SeqId) -> Result<(), SchedulerError> {
        self.seqs.remove(&seq_id);
        self.held.remove(&seq_id);
        self.block_hashes.remove(&seq_id);
        self.uncached_tail_tokens.remove(&seq_id);
        self.chunk_stride_tokens.remove(&seq_id);
        self.compacted_prefixes.remove(&seq_id);
        self.slot_chains.remove(&seq_id);
        self.running.retain(|id| *id != seq_id);
        self.waiting.retain(|id| *id != seq_id);
        if self.kv.contains(seq_id) {
            self.kv.free(seq_id)?;
        }
        Ok(())
    }
}
