//! Compactions across engine steps, so that one long request's eviction never holds the others'
//! steps.
//!
//! A step that makes a request's compression due (see `compression.rs`) queues a [`Compaction`]
//! and *holds* the request in the scheduler: it keeps its blocks but is not scheduled until every
//! layer is compacted, so its block table and cache cannot change under the work. Each step then
//! runs queued layers ([`compression::compact_layer`]: score → select → compact), oldest request
//! first, until the step's budget of token-layers (`physical tokens × layers`) is spent — at
//! least one layer per step — and finishes a request's compaction by shrinking its block table
//! and releasing it. With no other request running, the whole queue runs at once.
//!
//! **Invariant:** a held request's cache is touched only by its own compaction; the cost that
//! compaction adds to any step is at most the budget plus one layer of the longest request, so
//! other requests' steps stay bounded however long the prompt (before, a 28k-token SnapKV prompt
//! held every step for seconds). Greedy outputs are unchanged: layers are scored on the same
//! state whether done in one step or in many.
//!
//! Observation-window queries (SnapKV, TOVA) are captured in the forward pass that computes the
//! tokens: the window of the compaction that follows a prefill is the prefill's last `window`
//! tokens, gathered from whichever chunks hold them ([`WindowTail`]), so a prefill split at an
//! arbitrary point still scores with the whole window (under the context/question split, the
//! whole question); other compactions use the newest rows of their own step.

use std::ops::Range;

use starling_backend::{Backend, HostTensor};
use starling_kv::SeqId;
use starling_models::llama::QueryCapture;

use super::batch_builder::BuiltBatch;
use super::compression::{self, DueTarget, HeadShape, LayerJob};
use super::{Engine, EngineError, RequestOutput};
use crate::scheduler::StepPlan;

/// Token-layers of compaction one step runs by default when other requests are running: about
/// nine layers of a 28k-token request (a few milliseconds on an H200).
pub const DEFAULT_COMPACTION_STEP_BUDGET_TOKENS: usize = 1 << 18;

/// Query rows of consecutive positions of one request, per layer (`[rows, q_size]` each).
pub(crate) struct WindowTail {
    /// Position of the first row.
    start_position: usize,
    rows: usize,
    per_layer: Vec<Vec<f32>>,
}

impl WindowTail {
    /// The rows as `[rows, q_size]` tensors, one per layer.
    fn into_tensors(self) -> Result<Vec<HostTensor>, EngineError> {
        let rows = self.rows;
        self.per_layer
            .into_iter()
            .map(|data| {
                let width = data.len() / rows.max(1);
                Ok(HostTensor::new(vec![rows, width], data)?)
            })
            .collect()
    }

    fn covers(&self, positions: &Range<usize>) -> bool {
        self.start_position == positions.start && self.ends_at(positions.end)
    }

    /// Whether the rows end at `position` (exclusive) and hold at least one.
    fn ends_at(&self, position: usize) -> bool {
        self.rows > 0 && self.start_position + self.rows == position
    }
}

/// What a step captures for one request.
struct CaptureEntry {
    seq_id: SeqId,
    /// Rows of the step's capture.
    rows: Range<usize>,
    /// Position of the first row.
    first_position: usize,
    kind: Capture,
}

/// Why rows are captured.
#[derive(Clone, Copy)]
enum Capture {
    /// Part of the prefill's last window (kept in the request's [`WindowTail`]); with
    /// `completes_prefill` the tail is not needed after this step.
    Tail { completes_prefill: bool },
    /// The window of this step's own compaction.
    Own,
}

/// A compaction made due by a step (decided before the forward pass, so the queries it needs
/// are captured in it).
pub(crate) struct DueCompression {
    seq_id: SeqId,
    physical_tokens: usize,
    due: DueTarget,
    /// Positions of the window the compaction scores with (SnapKV, TOVA).
    window: Option<Range<usize>>,
    /// Copy-on-compact: the shared blocks the compaction rewrites (and the cached private ones
    /// while spare blocks last) are first copied into private ones (the target then evicts over
    /// the whole context, as without the cache). False when the pool had no blocks for the
    /// shared copies: the target keeps the shared prefix whole and the cached private blocks
    /// leave the cache.
    fork: bool,
    /// The position a compaction during the prefill stands at (its chunk does not sample):
    /// the point whose compacted state the prefix cache may name (`compacted_prefix.rs`).
    prefill_point: Option<usize>,
}

/// The step's compactions and the capture they need.
pub(crate) struct CompactionPlan {
    due: Vec<DueCompression>,
    entries: Vec<CaptureEntry>,
    pub(crate) capture: Option<QueryCapture>,
}

/// One request's compaction in progress.
pub(crate) struct Compaction {
    seq_id: SeqId,
    block_table: Vec<u32>,
    physical_tokens: usize,
    due: DueTarget,
    /// Per layer, the observation-window queries `[window, q_size]` (empty when the scorer
    /// reads none).
    queries: Vec<HostTensor>,
    next_layer: usize,
    micros: u64,
    /// `micros` by phase.
    phases: compression::LayerMicros,
    steps: u32,
    /// See [`DueCompression`].
    fork: bool,
    prefill_point: Option<usize>,
}

impl<B: Backend> Engine<B> {
    /// Sets how much compaction work a step may run while other requests are running, in
    /// token-layers (each compacted layer of a request of `n` physical tokens costs `n`); a
    /// step always runs at least one layer. `None`: every due compaction completes in the step
    /// that made it due (the engine's behaviour before issue 17). The default is
    /// [`DEFAULT_COMPACTION_STEP_BUDGET_TOKENS`].
    pub fn set_compaction_step_budget(&mut self, token_layers: Option<usize>) {
        self.compaction_step_budget = token_layers;
    }

    /// What the scheduler must know of a new compressing request's compactions: the
    /// observation window it must compute even when cached, and the fixed positions it
    /// compacts at while its prompt is chunked (multiples of the step's token budget: the
    /// chunk its footprint counts), so its outputs do not depend on the batch or the prefix
    /// cache (see `Scheduler::align_chunks`).
    pub(crate) fn tell_scheduler_how_it_compacts(
        &mut self,
        seq_id: SeqId,
    ) -> Result<(), EngineError> {
        let Some(c) = self.seqs.get(&seq_id).and_then(|s| s.compression.as_ref()) else {
            return Ok(());
        };
        let window_tail = c.needs_queries().then(|| c.observation_window_tokens());
        let compacts_mid_prefill = c.compacts_during_prefill();
        if let Some(tokens) = window_tail.filter(|_| self.hasher.is_some()) {
            // The observation window's queries are captured as its rows are computed.
            self.scheduler.keep_tail_uncached(seq_id, tokens)?;
        }
        if compacts_mid_prefill {
            let stride = self.scheduler.config().max_num_batched_tokens;
            self.scheduler.align_chunks(seq_id, stride)?;
        }
        Ok(())
    }

    /// The compressions this step's plan makes due, and the query rows the forward pass must
    /// capture for them and for the prefill windows it computes.
    pub(crate) fn plan_compactions(&self, plan: &StepPlan, built: &BuiltBatch) -> CompactionPlan {
        let mut due = Vec::new();
        // Blocks this step's forks may still take (nothing is allocated between this plan and
        // the queueing after the forward pass).
        let mut fork_budget_blocks = self.scheduler.num_free_blocks();
        let mut entries = Vec::new();
        let mut rows: Vec<u32> = Vec::new();
        // (request, positions, first position of its chunk, its first batch row, kind)
        let mut push = |seq_id, positions: Range<usize>, start_position, query_start, kind| {
            let first = rows.len();
            rows.extend(
                positions
                    .clone()
                    .map(|p| (query_start + p - start_position) as u32),
            );
            entries.push(CaptureEntry {
                seq_id,
                rows: first..rows.len(),
                first_position: positions.start,
                kind,
            });
        };
        for (s, seq_meta) in plan.scheduled.iter().zip(&built.meta.seqs) {
            let Some(seq) = self.seqs.get(&s.seq_id) else {
                continue;
            };
            let Some(policy) = &seq.compression else {
                continue;
            };
            let end = s.start_position + s.num_tokens;
            let physical = s.physical_start_index + s.num_tokens;
            let prompt_completed = s.samples_next_token && s.start_position < seq.num_prompt_tokens;
            let window_tokens = policy.observation_window_tokens();
            // The prefill's last `window` positions, wherever the chunks split them.
            let total = seq.token_ids.len();
            let tail = total.saturating_sub(window_tokens.min(total))..total;
            if policy.needs_queries() && s.start_position < seq.num_prompt_tokens {
                let chunk_tail = tail.start.max(s.start_position)..end.min(tail.end);
                if !chunk_tail.is_empty() {
                    push(
                        s.seq_id,
                        chunk_tail,
                        s.start_position,
                        seq_meta.query_start,
                        Capture::Tail {
                            completes_prefill: end == total,
                        },
                    );
                }
            }
            // A chunk that does not sample compacts only where its chunks are cut
            // (`Scheduler::align_chunks`): positions independent of the batch and the cache.
            let stride = self.scheduler.config().max_num_batched_tokens;
            if !s.samples_next_token && policy.compacts_during_prefill() && end % stride != 0 {
                continue;
            }
            // Evict over the whole context, as without the cache, when the pool has blocks to
            // copy the shared blocks about to be rewritten (blocks only this request holds need
            // none: `fork_for_rewrite` copies the registered ones only into spare uncached
            // blocks); otherwise blocks another request holds (it reads them) are kept whole.
            // (Sharing changes only at admission, in the next schedule, so this holds until
            // the compaction is queued and announced after the forward pass.)
            let target_for = |shared| {
                policy.due_target(
                    end,
                    physical,
                    prompt_completed,
                    seq.num_prompt_tokens,
                    shared,
                )
            };
            let forked = target_for(0).and_then(|t| {
                let blocks = self
                    .scheduler
                    .blocks_to_fork(s.seq_id, t.first_rewritten_tokens)
                    .ok()?;
                (blocks <= fork_budget_blocks).then(|| {
                    fork_budget_blocks -= blocks;
                    t
                })
            });
            let (target, fork) = match forked {
                Some(t) => (t, true),
                None => {
                    let shared = self
                        .scheduler
                        .shared_prefix_len_tokens(s.seq_id)
                        .unwrap_or(physical);
                    match target_for(shared) {
                        Some(t) => (t, false),
                        None => continue,
                    }
                }
            };
            let window = policy.needs_queries().then(|| {
                if prompt_completed && end == total {
                    tail.clone()
                } else {
                    // Mid-prefill or decoding: the newest rows of this step.
                    let window = window_tokens.clamp(1, s.num_tokens);
                    let positions = end - window..end;
                    push(
                        s.seq_id,
                        positions.clone(),
                        s.start_position,
                        seq_meta.query_start,
                        Capture::Own,
                    );
                    positions
                }
            });
            due.push(DueCompression {
                seq_id: s.seq_id,
                physical_tokens: physical,
                due: target,
                window,
                fork,
                prefill_point: (!s.samples_next_token).then_some(end),
            });
        }
        let capture = (!rows.is_empty()).then(|| QueryCapture::new(rows));
        CompactionPlan {
            due,
            entries,
            capture,
        }
    }

    /// After the step's forward pass and sampling: keeps the captured prefill windows, queues
    /// the due compactions of requests still alive (holding them) and runs compaction work
    /// under the step's budget. A failure aborts only that request (reported as an abort
    /// output) and is logged; the engine keeps serving.
    pub(crate) fn run_compactions(
        &mut self,
        plan: CompactionPlan,
        outputs: &mut Vec<RequestOutput>,
    ) {
        let num_layers = self.caches.len();
        let mut own_windows: Vec<(SeqId, Range<usize>, Range<usize>)> = Vec::new();
        if let Some(capture) = &plan.capture {
            for entry in &plan.entries {
                if matches!(entry.kind, Capture::Own) {
                    own_windows.push((
                        entry.seq_id,
                        entry.first_position..entry.first_position + entry.rows.len(),
                        entry.rows.clone(),
                    ));
                    continue;
                }
                let Some(seq) = self.seqs.get_mut(&entry.seq_id) else {
                    continue;
                };
                let contiguous = seq
                    .window_tail
                    .as_ref()
                    .is_some_and(|t| t.start_position + t.rows == entry.first_position);
                if !contiguous {
                    seq.window_tail = Some(WindowTail {
                        start_position: entry.first_position,
                        rows: 0,
                        per_layer: vec![Vec::new(); num_layers],
                    });
                }
                if let Some(t) = seq.window_tail.as_mut() {
                    for (layer, data) in t.per_layer.iter_mut().enumerate() {
                        data.extend_from_slice(capture_rows(capture, layer, &entry.rows));
                    }
                    t.rows += entry.rows.len();
                }
            }
        }
        for d in plan.due {
            if !self.seqs.contains_key(&d.seq_id) {
                continue;
            }
            if let Err(e) = self.queue_compaction(d, plan.capture.as_ref(), &own_windows) {
                self.abort_for_compaction(e.0, &e.1, outputs);
            }
        }
        // A tail no compaction took (the prompt was short enough to keep whole) is not needed
        // once the prefill is done.
        let done = |e: &&CaptureEntry| {
            matches!(
                e.kind,
                Capture::Tail {
                    completes_prefill: true
                }
            )
        };
        for entry in plan.entries.iter().filter(done) {
            if let Some(seq) = self.seqs.get_mut(&entry.seq_id) {
                seq.window_tail = None;
            }
        }
        let others_running = self.scheduler.num_running() > self.scheduler.num_held();
        let budget = if others_running {
            self.compaction_step_budget
        } else {
            None
        };
        self.advance_compactions(budget, outputs);
    }

    /// Holds the request and queues its compaction with the queries it scores with.
    fn queue_compaction(
        &mut self,
        d: DueCompression,
        capture: Option<&QueryCapture>,
        own_windows: &[(SeqId, Range<usize>, Range<usize>)],
    ) -> Result<(), (SeqId, EngineError)> {
        let fail = |e: EngineError| (d.seq_id, e);
        let queries = match &d.window {
            None => Vec::new(),
            Some(window) => {
                let own = own_windows
                    .iter()
                    .find(|(id, positions, _)| *id == d.seq_id && positions == window);
                match (own, capture) {
                    (Some((_, _, rows)), Some(capture)) => (0..self.caches.len())
                        .map(|layer| {
                            let data = capture_rows(capture, layer, rows).to_vec();
                            HostTensor::new(vec![rows.len(), data.len() / rows.len()], data)
                        })
                        .collect::<Result<_, _>>()
                        .map_err(|e| fail(e.into()))?,
                    _ => {
                        // The newest rows must be this step's; a tail that starts late (some
                        // earlier chunk's rows were not captured) still scores, with a shorter
                        // window of the newest tokens.
                        let tail = self
                            .seqs
                            .get_mut(&d.seq_id)
                            .and_then(|s| s.window_tail.take())
                            .filter(|t| t.ends_at(window.end))
                            .ok_or_else(|| {
                                fail(EngineError::InvalidRequest(format!(
                                    "the observation window {window:?} was not captured"
                                )))
                            })?;
                        if !tail.covers(window) {
                            tracing::debug!(
                                "{:?}: observation window {window:?} shortened to {} rows",
                                d.seq_id,
                                tail.rows
                            );
                        }
                        tail.into_tensors().map_err(fail)?
                    }
                }
            }
        };
        // Before any layer is touched, either the cached and shared blocks about to be
        // rewritten are swapped for private copies (the originals stay cached, intact, for
        // their other holders and later requests), or they leave the prefix cache (nobody
        // admitted meanwhile may reuse them); either way the request registers nothing more.
        // Without a fork, a shared block among them refuses the whole compaction, which then
        // fails the request alone, its cache untouched.
        if d.fork {
            let pairs: Vec<(u32, u32)> = self
                .scheduler
                .fork_for_rewrite(d.seq_id, d.due.first_rewritten_tokens)
                .map_err(|e| fail(e.into()))?
                .into_iter()
                .map(|(original, copy)| (original.0, copy.0))
                .collect();
            if !pairs.is_empty() {
                for cache in self.caches.iter_mut() {
                    self.backend
                        .copy_kv_blocks(cache, &pairs)
                        .map_err(|e| fail(e.into()))?;
                }
                self.counters.forked_blocks += pairs.len() as u64;
            }
        } else {
            self.scheduler
                .prepare_rewrite(d.seq_id, d.due.first_rewritten_tokens)
                .map_err(|e| fail(e.into()))?;
        }
        let block_table: Vec<u32> = self
            .scheduler
            .kv()
            .table(d.seq_id)
            .ok_or_else(|| fail(EngineError::UnknownRequest(d.seq_id)))?
            .block_ids()
            .iter()
            .map(|b| b.0)
            .collect();
        self.scheduler.hold(d.seq_id).map_err(|e| fail(e.into()))?;
        self.compactions.push_back(Compaction {
            seq_id: d.seq_id,
            block_table,
            physical_tokens: d.physical_tokens,
            due: d.due,
            queries,
            next_layer: 0,
            micros: 0,
            phases: compression::LayerMicros::default(),
            steps: 0,
            fork: d.fork,
            prefill_point: d.prefill_point,
        });
        Ok(())
    }

    /// Runs queued layers, oldest request first, until `budget` token-layers are spent (`None`:
    /// all of them); at least one layer when any is queued.
    pub(crate) fn advance_compactions(
        &mut self,
        budget: Option<usize>,
        outputs: &mut Vec<RequestOutput>,
    ) {
        let mut spent = 0usize;
        let mut touched: Vec<SeqId> = Vec::new();
        while let Some(front) = self.compactions.front() {
            if budget.is_some_and(|b| spent > 0 && spent >= b) {
                break;
            }
            let seq_id = front.seq_id;
            if !touched.contains(&seq_id) {
                touched.push(seq_id);
            }
            spent += front.physical_tokens;
            match self.compact_next_layer() {
                Ok(false) => {}
                Ok(true) => match self.finish_compaction() {
                    Ok(physical) => {
                        let held_bytes = self.held_bytes(seq_id);
                        if let Some(o) = outputs.iter_mut().find(|o| o.seq_id == seq_id) {
                            o.kv_physical_tokens = physical;
                            o.kv_held_bytes = held_bytes;
                        }
                    }
                    Err(e) => self.abort_for_compaction(seq_id, &e, outputs),
                },
                Err(e) => {
                    self.compactions.pop_front();
                    self.abort_for_compaction(seq_id, &e, outputs);
                }
            }
        }
        for c in self.compactions.iter_mut() {
            if touched.contains(&c.seq_id) {
                c.steps += 1;
            }
        }
    }

    /// Compacts the next layer of the front compaction; true when that was its last layer.
    fn compact_next_layer(&mut self) -> Result<bool, EngineError> {
        let cfg = self.model.config();
        let shape = HeadShape {
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            group: cfg.num_attention_heads / cfg.num_kv_heads.max(1),
        };
        let block_size_tokens = self.scheduler.kv().block_size_tokens();
        let Some(c) = self.compactions.front_mut() else {
            return Ok(true);
        };
        let policy = self
            .seqs
            .get(&c.seq_id)
            .and_then(|s| s.compression.as_ref())
            .ok_or(EngineError::UnknownRequest(c.seq_id))?;
        let layer = c.next_layer;
        let cache = self
            .caches
            .get_mut(layer)
            .ok_or_else(|| EngineError::InvalidRequest(format!("no cache for layer {layer}")))?;
        let job = LayerJob {
            block_table: &c.block_table,
            block_size_tokens,
            physical_tokens: c.physical_tokens,
            due: c.due,
            queries: c.queries.get(layer),
        };
        let latent = self
            .model
            .latent_factors(layer)
            .map(|factors| compression::LatentScoring {
                factors,
                dims: self.model.attention_dims(),
                rope: self.model.rope(),
            });
        let started = std::time::Instant::now();
        c.phases +=
            compression::compact_layer(&self.backend, cache, policy, shape, &job, layer, latent)?;
        let micros = started.elapsed().as_micros() as u64;
        c.micros += micros;
        c.next_layer += 1;
        self.counters.compression_micros += micros;
        self.counters.compaction_layers += 1;
        Ok(c.next_layer == self.caches.len())
    }

    /// Ends the front compaction: returns the freed tail blocks, releases the request and
    /// returns its physical length.
    fn finish_compaction(&mut self) -> Result<usize, EngineError> {
        let c = self
            .compactions
            .pop_front()
            .ok_or_else(|| EngineError::InvalidRequest("no compaction to finish".into()))?;
        self.scheduler.release(c.seq_id);
        let freed = self
            .scheduler
            .shrink_physical(c.seq_id, c.due.target_tokens)?;
        if let Some(point) = c.prefill_point {
            // A failure only loses the reuse of the state (its blocks stay private).
            let registered = self.register_compacted_state(
                c.seq_id,
                point,
                c.fork,
                c.due.target_tokens,
                c.due.first_rewritten_tokens,
            );
            if let Err(e) = registered {
                tracing::warn!("{:?}: compacted state not registered: {e}", c.seq_id);
            }
        }
        self.counters.compressions += 1;
        self.counters.evicted_tokens += (c.physical_tokens - c.due.target_tokens) as u64;
        self.counters.evicted_blocks += freed as u64;
        tracing::debug!(
            "compaction of {:?}: {} layers, {} -> {} tokens, {:.2} ms over {} steps \
             (issuing: score {:.2}, select + compact {:.2})",
            c.seq_id,
            c.next_layer,
            c.physical_tokens,
            c.due.target_tokens,
            c.micros as f64 / 1000.0,
            c.steps + 1,
            c.phases.score as f64 / 1000.0,
            c.phases.compact as f64 / 1000.0,
        );
        Ok(c.due.target_tokens)
    }

    /// Ends a request whose compaction failed (an error output replacing its outputs of this
    /// step, blocks freed at once); the others carry on.
    fn abort_for_compaction(
        &mut self,
        seq_id: SeqId,
        error: &EngineError,
        outputs: &mut Vec<RequestOutput>,
    ) {
        outputs.retain(|o| o.seq_id != seq_id);
        let failure = super::RequestFailure {
            kind: super::FailureKind::Compression,
            message: format!("kv compression failed: {error}"),
        };
        outputs.extend(self.fail_request(seq_id, failure));
    }

    /// Drops the compactions and captured windows of requests the scheduler preempted (their
    /// blocks are gone; they compact again after their recompute) or that were aborted.
    pub(crate) fn forget_compactions(&mut self, seq_ids: &[SeqId]) {
        if seq_ids.is_empty() {
            return;
        }
        self.compactions.retain(|c| !seq_ids.contains(&c.seq_id));
        for id in seq_ids {
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.window_tail = None;
                // Recomputed from scratch: its prefill compacts as a fresh one again.
                seq.compacted_off_plan = false;
            }
        }
    }

    /// Requests whose cache is being compacted (held out of the steps until it is done).
    pub fn num_compacting(&self) -> usize {
        self.compactions.len()
    }
}

/// Rows `rows` of layer `layer`'s captured queries (empty when the layer was not captured).
fn capture_rows<'a>(capture: &'a QueryCapture, layer: usize, rows: &Range<usize>) -> &'a [f32] {
    let Some(q) = capture.layer(layer) else {
        return &[];
    };
    let width = q.shape().last().copied().unwrap_or(0);
    q.data()
        .get(rows.start * width..rows.end * width)
        .unwrap_or(&[])
}
