//! The engine: owns the model, the paged KV cache and the scheduler, and turns scheduler plans into
//! model steps and sampled tokens.
//!
//! One [`Engine::step`] = schedule → build the batch metadata (positions, slot mapping, block
//! tables) → one forward pass → sample for every sequence whose chunk reached its end → stop checks
//! → free finished sequences' blocks at once.

mod batch_builder;
mod cache_report;
mod compacted_prefix;
mod compaction;
mod compression;
mod config;
mod device_sampling;
mod error;
mod kernel_profile;
mod output;
mod prefix_cache;
mod row_sampling;
mod sequence;
mod sizing;
mod star_kv;
mod stats;
mod text;
mod warm_up;
mod window;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use starling_backend::{Backend, DecodeGraphConfig, DecodeGraphs, DecodeStep};
use starling_evict::KvCacheDtype;
use starling_kv::{BlockHasher, CacheLayout, KvCacheConfig, KvCacheManager, Preflight, SeqId};
use starling_models::llama::{ForwardOptions, LlamaModel, QueryCapture};

use crate::sampling::{FinishReason, Finished, SamplingParams, SequenceRng, StopChecker};
use crate::scheduler::{Footprint, Scheduler, SchedulerError, StepStats};

pub use cache_report::{CacheKind, CacheReport, LatentRankSummary};
pub use compaction::DEFAULT_COMPACTION_STEP_BUDGET_TOKENS;
use config::cache_dtype;
pub use config::EngineConfig;
pub use error::EngineError;
pub use output::{FailureKind, RequestFailure, RequestOptions, RequestOutput, TokenLogprob};
pub use prefix_cache::PrefixCacheCounters;
pub use star_kv::{load_model, StarKvInfo};
pub use stats::{EngineCounters, EngineStats};

pub use compression::{eviction_peak_tokens, longest_evicting_context};
pub use text::{TextDecoder, TextStream, TokenizerText};
pub use warm_up::WarmUp;
pub use window::{protect_window, window_peak_tokens};

use compaction::Compaction;
use compression::SeqCompression;
use row_sampling::{RowSample, SamplerPool};
use sequence::Sequence;

/// The serving engine on backend `B`.
pub struct Engine<B: Backend> {
    backend: B,
    model: LlamaModel<B>,
    caches: Vec<B::KvCache>,
    scheduler: Scheduler,
    samplers: SamplerPool,
    text: Option<Arc<dyn TextDecoder>>,
    eos_token_ids: Vec<u32>,
    seqs: HashMap<SeqId, Sequence>,
    next_seq_id: u64,
    preflight: Preflight,
    /// What every layer caches per token (the description the cache was sized from).
    layout: CacheLayout,
    /// The STAR-KV checkpoint the model was built with, if any.
    star_kv: Option<StarKvInfo>,
    compression: starling_evict::CompressionConfig,
    counters: EngineCounters,
    last_step: Option<StepStats>,
    /// Recorded decode steps (CUDA graphs), when enabled and the backend has them.
    graphs: Option<Box<dyn DecodeGraphs<B>>>,
    /// Compactions in progress, oldest first (see `compaction.rs`).
    compactions: VecDeque<Compaction>,
    /// Token-layers of compaction a step runs while other requests run; `None`: no limit.
    compaction_step_budget: Option<usize>,
    /// Hashes full blocks under the cache's identity; `None` with prefix caching off.
    hasher: Option<BlockHasher>,
    /// The window every layer attends over, when all do: blocks behind it are released after
    /// each step (`window.rs`).
    release_window_tokens: Option<usize>,
    /// Whether some cache group attends over a window: its blocks behind the window are given
    /// back after each step.
    windowed_groups: bool,
}

impl<B: Backend> Engine<B> {
    /// Sizes the KV cache from the memory budget (refusing when one `max_model_len` sequence does
    /// not fit at its peak: all its tokens, or under an evicting engine-wide policy the kept
    /// tokens plus one chunk in flight), allocates it and starts an empty scheduler. The cache
    /// holds what the model's layers cache ([`LlamaModel::cache_layout`]: full K/V, or STAR-KV
    /// latents), so a latent model gets more blocks from the same budget. `text` enables
    /// detokenised output and stop strings; without it outputs carry token ids only.
    pub fn new(
        backend: B,
        model: LlamaModel<B>,
        text: Option<Arc<dyn TextDecoder>>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        if config.kv_compression.star_kv.is_some() {
            return Err(EngineError::InvalidRequest(
                "a STAR-KV checkpoint changes how the model is built: start the engine with \
                 Engine::from_weights"
                    .into(),
            ));
        }
        Self::with_loaded_model(backend, model, None, text, config)
    }

    /// Builds the model from `weights` as `config` asks (with its STAR-KV checkpoint: latent
    /// layers, or the reference path; see [`load_model`]) and starts the engine on it
    /// ([`Engine::new`]).
    pub fn from_weights(
        backend: B,
        model_config: &starling_models::ModelConfig,
        weights: starling_models::WeightMap,
        text: Option<Arc<dyn TextDecoder>>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let selection = config.kv_compression.star_kv.as_ref();
        let (model, star_kv) = load_model(&backend, model_config, weights, selection)?;
        Self::with_loaded_model(backend, model, star_kv, text, config)
    }

    /// [`Engine::new`] on a model [`load_model`] built for `config.kv_compression.star_kv` (with the
    /// [`StarKvInfo`] it returned), for callers that must size the cache after the weights
    /// are resident (a GPU's free memory).
    pub fn with_loaded_model(
        backend: B,
        model: LlamaModel<B>,
        star_kv: Option<StarKvInfo>,
        text: Option<Arc<dyn TextDecoder>>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let kv_compression = config.kv_compression;
        kv_compression.validate()?;
        if kv_compression.star_kv.is_some() != star_kv.is_some() {
            return Err(EngineError::InvalidRequest(
                "the engine's STAR-KV selection and the model it was given disagree (build the \
                 model with load_model for the same selection)"
                    .into(),
            ));
        }
        let mut model = model;
        let eviction = window::prepare_for_eviction(&mut model, &kv_compression.eviction);
        let evicting = eviction.evicts();
        let dtype = cache_dtype(kv_compression.kv_dtype, &backend);
        let layout = model.cache_layout(dtype);
        let sched = &config.scheduler;
        let release_window_tokens = if evicting {
            None
        } else {
            window::release_window_tokens(model.config())
        };
        let chunk = sched.max_num_batched_tokens;
        let group_windows = model.cache_groups().windows();
        let preflight = sizing::preflight(
            &model,
            config.kv_cache_memory_bytes,
            sched,
            &layout,
            dtype,
            &eviction,
        )?;
        let num_blocks = preflight.sizing.num_blocks;
        let caches = model
            .kv_cache_specs(num_blocks, sched.block_size_tokens, dtype)
            .iter()
            .map(|spec| backend.alloc_kv_cache(spec))
            .collect::<Result<Vec<_>, _>>()?;
        let enable_prefix_caching = config.enable_prefix_caching && group_windows.len() == 1;
        if enable_prefix_caching != config.enable_prefix_caching {
            tracing::warn!(
                "automatic prefix caching is not built for a model mixing sliding-window and \
                 full attention layers ({} block-table groups): turned off",
                group_windows.len()
            );
        }
        let mut kv = KvCacheManager::with_config(KvCacheConfig {
            num_blocks,
            block_size_tokens: sched.block_size_tokens,
            enable_prefix_caching,
        })?;
        let windowed_groups = group_windows.iter().any(Option::is_some);
        kv.set_cache_groups(group_windows, chunk)?;
        let scheduler = Scheduler::new(config.scheduler, kv)?;
        tracing::info!(
            "automatic prefix caching: {}",
            if enable_prefix_caching { "on" } else { "off" }
        );
        let hasher = if enable_prefix_caching {
            let model_identity = config
                .model_identity
                .clone()
                .unwrap_or_else(|| format!("unnamed-model:{:?}", model.config()));
            let identity = prefix_cache::cache_identity(&model_identity, &layout, star_kv.as_ref());
            Some(prefix_cache::hasher(identity, sched.block_size_tokens)?)
        } else {
            None
        };
        let eos_token_ids = model.config().eos_token_ids.clone();
        Ok(Self {
            backend,
            caches,
            scheduler,
            samplers: SamplerPool::new(&eos_token_ids, rayon::current_num_threads()),
            text,
            eos_token_ids,
            seqs: HashMap::new(),
            next_seq_id: 0,
            preflight,
            layout,
            star_kv,
            compression: eviction,
            counters: EngineCounters::default(),
            last_step: None,
            graphs: None,
            compactions: VecDeque::new(),
            compaction_step_budget: Some(DEFAULT_COMPACTION_STEP_BUDGET_TOKENS),
            hasher,
            release_window_tokens,
            windowed_groups,
            model,
        })
    }

    /// Turns on recorded decode steps (CUDA graphs: one per batch-size bucket, replayed on later
    /// decode-only steps; prefill and mixed steps stay eager) where the backend has them. Returns
    /// whether it does; `false` leaves every step eager.
    pub fn enable_decode_graphs(&mut self) -> Result<bool, EngineError> {
        let sched = self.scheduler.config();
        let config = DecodeGraphConfig {
            max_num_seqs: sched.max_num_seqs,
            max_model_len_tokens: sched.max_model_len_tokens,
            block_size_tokens: sched.block_size_tokens,
            num_cache_blocks: self.scheduler.kv().num_total_blocks(),
            query_heads_per_kv_head: {
                let cfg = self.model.config();
                cfg.num_attention_heads / cfg.num_kv_heads.max(1)
            },
            num_kv_heads: self.model.config().num_kv_heads,
            head_dim: self.model.config().head_dim,
        };
        self.graphs = self.backend.decode_graphs(&config)?;
        Ok(self.graphs.is_some())
    }

    /// Ends the engine and hands its backend back, the recorded graphs, cache and model freed
    /// first: a caller can then start another engine on the same device (the demo runs its
    /// arms one after another on one backend and one memory budget).
    pub fn into_backend(self) -> B {
        let Self {
            backend,
            model,
            caches,
            graphs,
            ..
        } = self;
        // Graphs replay into the caches and read the model's weights: they go first.
        drop(graphs);
        drop(caches);
        drop(model);
        backend
    }

    /// Whether decode steps are replayed from recorded graphs.
    pub fn decode_graphs_enabled(&self) -> bool {
        self.graphs.is_some()
    }

    /// What one block of `model`'s cache holds per token slot on `backend` (full K/V or latents
    /// per cache tensor, in the backend's cache dtype; [`LlamaModel::block_layout`]): what
    /// [`Engine::new`] sizes the cache from, so `bytes_per_block` of it times a block count is
    /// the budget of that many blocks.
    pub fn cache_layout_of(backend: &B, model: &LlamaModel<B>) -> CacheLayout {
        model.block_layout(cache_dtype(KvCacheDtype::Auto, backend))
    }

    /// What every layer of this engine's cache stores per token.
    pub fn cache_layout(&self) -> &CacheLayout {
        &self.layout
    }

    /// The STAR-KV checkpoint the model runs with, if any.
    pub fn star_kv(&self) -> Option<&StarKvInfo> {
        self.star_kv.as_ref()
    }

    /// The cache sizing chosen at start-up (block count, bytes per token, max concurrency).
    pub fn preflight(&self) -> &Preflight {
        &self.preflight
    }

    /// The backend's name ("cpu", "cuda:0 (…)").
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    /// The model being served.
    pub fn model(&self) -> &LlamaModel<B> {
        &self.model
    }

    /// The batching limits and context window this engine enforces.
    pub fn scheduler_config(&self) -> &crate::scheduler::SchedulerConfig {
        self.scheduler.config()
    }

    /// The eviction policy applied to requests that do not choose their own.
    pub fn compression(&self) -> &starling_evict::CompressionConfig {
        &self.compression
    }

    /// Whether `seq_id` is still waiting or running (false once finished or aborted), so a
    /// caller can tell which requests a failed step aborted.
    pub fn has_request(&self, seq_id: SeqId) -> bool {
        self.seqs.contains_key(&seq_id)
    }

    /// Queues a request; returns its id. Invalid parameters or prompts are refused here, before
    /// they reach the scheduler.
    pub fn add_request(
        &mut self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
    ) -> Result<SeqId, EngineError> {
        self.add_request_with(prompt_ids, params, RequestOptions::default())
    }

    /// [`Engine::add_request`] with per-request options (eviction policy, teacher forcing,
    /// full log-probabilities).
    pub fn add_request_with(
        &mut self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
        options: RequestOptions,
    ) -> Result<SeqId, EngineError> {
        let vocab = self.model.config().vocab_size;
        params.validate(vocab)?;
        if let Some(bad) = prompt_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "prompt token id {bad} outside the vocabulary of {vocab}"
            )));
        }
        if !params.stop.is_empty() && self.text.is_none() {
            return Err(EngineError::InvalidRequest(
                "stop strings need a tokenizer; this engine has none".into(),
            ));
        }
        let max_len = self.scheduler.config().max_model_len_tokens;
        if prompt_ids.len() >= max_len {
            return Err(EngineError::InvalidRequest(format!(
                "prompt of {} tokens leaves no room to generate within max_model_len {max_len}",
                prompt_ids.len()
            )));
        }
        let room = max_len - prompt_ids.len();
        let max_output = match &options.forced_output_ids {
            None => params.resolve_max_tokens(room),
            Some(forced) => {
                if forced.is_empty() || forced.len() > room {
                    return Err(EngineError::InvalidRequest(format!(
                        "{} forced output tokens; between 1 and {room} fit after the prompt",
                        forced.len()
                    )));
                }
                if let Some(bad) = forced.iter().find(|&&t| t as usize >= vocab) {
                    return Err(EngineError::InvalidRequest(format!(
                        "forced token id {bad} outside the vocabulary of {vocab}"
                    )));
                }
                forced.len()
            }
        };
        let compression_config = options.compression.as_ref().unwrap_or(&self.compression);
        compression_config.validate()?;
        let releases_windows = self.windowed_groups;
        window::check_request_eviction(self.model.config(), releases_windows, compression_config)?;
        let compression_config = &window::protect_window(self.model.config(), compression_config);
        if let Some(q) = options.question_tokens {
            if q == 0 || q >= prompt_ids.len() {
                return Err(EngineError::InvalidRequest(format!(
                    "question_tokens {q}: between 1 and {} (the prompt less one context token)",
                    prompt_ids.len() - 1
                )));
            }
        }
        let compression = SeqCompression::new(compression_config, options.question_tokens);
        let seq_id = SeqId(self.next_seq_id);
        let total_tokens = prompt_ids.len() + max_output;
        let chunk_tokens = self.scheduler.config().max_num_batched_tokens;
        let footprint = match (&compression, self.release_window_tokens) {
            (None, Some(w)) => window::window_footprint(
                w,
                self.scheduler.config().block_size_tokens,
                total_tokens,
                chunk_tokens,
            ),
            (None, None) => Footprint::uncompressed(total_tokens),
            (Some(c), _) => {
                Footprint::compressed(c.peak_tokens(total_tokens), total_tokens, chunk_tokens)
            }
        };
        self.scheduler
            .add_request_with_footprint(seq_id, prompt_ids.len(), footprint)?;
        self.next_seq_id += 1;
        let rng = params
            .seed
            .map_or_else(SequenceRng::from_entropy, SequenceRng::from_seed);
        // A forced request ends after its last forced token, not at EOS or a stop string.
        let stop = match &options.forced_output_ids {
            None => StopChecker::new(&params, &self.eos_token_ids, max_output),
            Some(_) => {
                let plain = SamplingParams {
                    stop: Vec::new(),
                    stop_token_ids: Vec::new(),
                    ignore_eos: true,
                    ..params.clone()
                };
                StopChecker::new(&plain, &self.eos_token_ids, max_output)
            }
        };
        let text = self
            .text
            .as_ref()
            .map(|t| t.stream(params.skip_special_tokens));
        self.seqs.insert(
            seq_id,
            Sequence {
                num_prompt_tokens: prompt_ids.len(),
                token_ids: prompt_ids,
                params,
                rng,
                stop,
                text,
                compression,
                window_tail: None,
                compacted_off_plan: false,
                forced_output_ids: options.forced_output_ids,
                return_full_logprobs: options.return_full_logprobs,
            },
        );
        let queued = self
            .tell_scheduler_how_it_compacts(seq_id)
            .and_then(|()| self.extend_block_hashes(seq_id))
            .and_then(|()| self.plan_compacted_prefixes(seq_id));
        if let Err(e) = queued {
            // Not reachable (the request was just queued), but never leave it half-added.
            self.seqs.remove(&seq_id);
            let _ = self.scheduler.abort(seq_id);
            return Err(e);
        }
        Ok(seq_id)
    }

    /// Aborts a request (waiting or running); its blocks are free when this returns.
    pub fn abort(&mut self, seq_id: SeqId) -> Result<RequestOutput, EngineError> {
        self.finish_early(seq_id, FinishReason::Abort)
    }

    /// Removes a request before it finished (its blocks are free when this returns) and makes
    /// its last output, finished with `reason`.
    fn finish_early(
        &mut self,
        seq_id: SeqId,
        reason: FinishReason,
    ) -> Result<RequestOutput, EngineError> {
        let seq = self
            .seqs
            .remove(&seq_id)
            .ok_or(EngineError::UnknownRequest(seq_id))?;
        self.forget_compactions(&[seq_id]);
        self.scheduler.abort(seq_id)?;
        self.counters.finished_requests += 1;
        Ok(RequestOutput {
            seq_id,
            token_id: None,
            text_delta: String::new(),
            logprob: None,
            finished: Some(Finished {
                reason,
                stop_match: None,
            }),
            num_prompt_tokens: seq.num_prompt_tokens,
            num_output_tokens: seq.output_ids().len(),
            full_logprobs: None,
            kv_physical_tokens: 0,
            kv_held_bytes: 0,
            error: None,
        })
    }

    /// Ends one request because of `failure` while the rest of its step carries on; its blocks
    /// are free when this returns and its last output, finished with [`FinishReason::Error`],
    /// carries the failure. `None` when the engine no longer holds the request.
    fn fail_request(&mut self, seq_id: SeqId, failure: RequestFailure) -> Option<RequestOutput> {
        tracing::warn!("request {seq_id:?} failed: {}", failure.message);
        match self.finish_early(seq_id, FinishReason::Error) {
            Ok(output) => {
                self.counters.failed_requests += 1;
                Some(RequestOutput {
                    error: Some(failure),
                    ..output
                })
            }
            Err(e) => {
                tracing::error!("ending failed request {seq_id:?}: {e}");
                None
            }
        }
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// A snapshot of queue lengths, cache occupancy and counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            num_running: self.scheduler.num_running(),
            num_waiting: self.scheduler.num_waiting(),
            kv_blocks_total: self.scheduler.kv().num_total_blocks(),
            kv_blocks_free: self.scheduler.kv().num_free_blocks(),
            num_preemptions: self.scheduler.num_preemptions(),
            counters: self.counters,
            last_step: self.last_step,
            prefix_cache: self.prefix_cache_counters(),
        }
    }

    /// Checks that the scheduler's queues and the KV books agree (ref counts, free + held =
    /// total, prefix-cache registrations on full blocks only); for tests, after any step.
    pub fn check_invariants(&self) -> Result<(), EngineError> {
        Ok(self.scheduler.check_invariants()?)
    }

    /// Runs one step. Returns an output for every request that generated a token or finished.
    ///
    /// A failure confined to one request (NaN logits, a failed sample or compaction) ends that
    /// request with [`FinishReason::Error`] and a [`RequestFailure`] in its output, its blocks
    /// freed at once; the others in the step carry on. If the step fails as a whole (batch
    /// building, the forward pass), every request scheduled in it is aborted (blocks freed, no
    /// output) and the error is returned; the engine keeps serving the rest.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let plan = self.scheduler.schedule();
        self.last_step = Some(plan.stats);
        self.forget_compactions(&plan.preempted);
        if plan.is_empty() {
            // Only compactions are left to run (every running request is held): no one waits.
            let mut outputs = Vec::new();
            self.advance_compactions(None, &mut outputs);
            return Ok(outputs);
        }
        self.counters.steps += 1;
        let built = match batch_builder::build(&plan, &self.seqs, self.scheduler.kv()) {
            Ok(built) => built,
            Err(e) => return Err(self.abort_scheduled(&plan, e)),
        };
        let mut compactions = self.plan_compactions(&plan, &built);
        let logits = match self.run_model(&built, compactions.capture.as_mut()) {
            Ok(l) => l,
            Err(e) => return Err(self.abort_scheduled(&plan, e)),
        };
        self.counters.prefill_tokens += plan.stats.num_prefill_tokens as u64;
        self.register_computed_blocks(&plan);
        if self.windowed_groups {
            self.scheduler.release_behind_windows(&plan);
        }
        let mut outputs = self.sample_and_advance(&built.sampling_seqs, logits.as_ref());
        self.run_compactions(compactions, &mut outputs);
        Ok(outputs)
    }

    /// Aborts every request `plan` scheduled, for a failure of the whole step; returns `error`.
    fn abort_scheduled(
        &mut self,
        plan: &crate::scheduler::StepPlan,
        error: EngineError,
    ) -> EngineError {
        for s in &plan.scheduled {
            if self.seqs.remove(&s.seq_id).is_some() {
                // Already removed sequences cannot fail to abort; ignore the echo.
                let _ = self.scheduler.abort(s.seq_id);
            }
        }
        error
    }

    /// Samples the step's rows and appends the tokens. A row that cannot be sampled (NaN
    /// logits) or advanced fails its request alone; if sampling fails as a whole, every request
    /// that was to sample fails.
    fn sample_and_advance(
        &mut self,
        seq_ids: &[SeqId],
        logits: Option<&B::Tensor>,
    ) -> Vec<RequestOutput> {
        let samples = match self.sample_rows(seq_ids, logits) {
            Ok(samples) => samples,
            Err(e) => {
                let failure = RequestFailure::from_error(&e);
                return seq_ids
                    .iter()
                    .filter_map(|&id| self.fail_request(id, failure.clone()))
                    .collect();
            }
        };
        let mut outputs = Vec::with_capacity(seq_ids.len());
        for (&seq_id, sample) in seq_ids.iter().zip(samples) {
            match sample.and_then(|sample| self.advance(seq_id, sample)) {
                Ok(output) => outputs.push(output),
                Err(e) => outputs.extend(self.fail_request(seq_id, RequestFailure::from_error(&e))),
            }
        }
        outputs
    }

    fn run_model(
        &mut self,
        built: &batch_builder::BuiltBatch,
        capture: Option<&mut QueryCapture>,
    ) -> Result<Option<B::Tensor>, EngineError> {
        if capture.is_none() {
            if let Some(logits) = self.replay_decode(built) {
                return Ok(Some(logits));
            }
        }
        let num_blocks = self.scheduler.kv().num_total_blocks();
        let batch = self.backend.prepare_batch(&built.meta, num_blocks)?;
        let options = ForwardOptions {
            queries: capture,
            activations: None,
        };
        let logits = self.model.forward(
            &self.backend,
            &built.token_ids,
            &built.meta,
            &batch,
            &mut self.caches,
            options,
        )?;
        Ok(logits.into_device())
    }

    /// The step's logits (in backend memory) from a recorded decode graph, or `None` to run it eagerly (graphs off,
    /// not a decode-only step). A replay error turns graphs off for good (logged) and the step
    /// runs eagerly: it rewrites the same cache slots with the same values.
    fn replay_decode(&mut self, built: &batch_builder::BuiltBatch) -> Option<B::Tensor> {
        let graphs = self.graphs.as_mut()?;
        let mut forward = self.model.device_forward();
        let step = DecodeStep {
            token_ids: &built.token_ids,
            meta: &built.meta,
        };
        match graphs.run(&self.backend, step, &mut self.caches, forward.as_mut()) {
            Ok(logits) => {
                self.counters.replayed_steps += u64::from(logits.is_some());
                logits
            }
            Err(e) => {
                tracing::error!("decode graph replay failed, running eagerly from now on: {e}");
                self.graphs = None;
                None
            }
        }
    }

    /// Samples every sampling row of the step, returning the results in `seq_ids`' order.
    /// `logits` (in backend memory) holds one row per id; rows that qualify are sampled there
    /// (see `device_sampling`), the rest on the host, in parallel across requests when there are
    /// many.
    fn sample_rows(
        &mut self,
        seq_ids: &[SeqId],
        logits: Option<&B::Tensor>,
    ) -> Result<Vec<Result<RowSample, EngineError>>, EngineError> {
        if seq_ids.is_empty() {
            return Ok(Vec::new());
        }
        let logits = logits.ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "no logits computed for {} sampling rows",
                seq_ids.len()
            ))
        })?;
        let row_of: HashMap<SeqId, u32> = seq_ids
            .iter()
            .zip(0u32..)
            .map(|(&id, row)| (id, row))
            .collect();
        let mut rows: Vec<(u32, &mut Sequence)> = self
            .seqs
            .iter_mut()
            .filter_map(|(id, seq)| row_of.get(id).map(|&row| (row, seq)))
            .collect();
        if rows.len() != seq_ids.len() {
            let missing = seq_ids
                .iter()
                .find(|id| !self.seqs.contains_key(id))
                .copied()
                .unwrap_or(SeqId(u64::MAX));
            return Err(EngineError::UnknownRequest(missing));
        }
        rows.sort_unstable_by_key(|(row, _)| *row);
        device_sampling::sample_step(&self.backend, &mut self.samplers, logits, &mut rows)
    }

    /// Appends a sampled token to its request: text, stop conditions, the scheduler, and the
    /// request's output for this step.
    fn advance(&mut self, seq_id: SeqId, sample: RowSample) -> Result<RequestOutput, EngineError> {
        let RowSample {
            sampled,
            full_logprobs,
        } = sample;
        let seq = self
            .seqs
            .get_mut(&seq_id)
            .ok_or(EngineError::UnknownRequest(seq_id))?;
        let token = sampled.token_id;
        seq.token_ids.push(token);
        self.counters.generation_tokens += 1;
        let new_text = seq.text.as_mut().map(|t| t.push(token)).unwrap_or_default();
        let mut update = seq.stop.push(token, &new_text);
        let logprob = seq.params.logprobs.map(|_| TokenLogprob {
            token_id: token,
            logprob: sampled.logprob,
            top: sampled.top_logprobs.clone(),
        });
        let mut finished = update.finished.take();
        if finished.is_none() {
            match self.scheduler.append_token(seq_id) {
                Ok(()) => {}
                Err(SchedulerError::LengthLimit { .. }) => {
                    finished = Some(Finished {
                        reason: FinishReason::Length,
                        stop_match: None,
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut text_delta = update.text;
        let num_prompt_tokens = seq.num_prompt_tokens;
        let num_output_tokens = seq.output_ids().len();
        let kv_physical_tokens = self
            .scheduler
            .kv()
            .table(seq_id)
            .map_or(0, |t| t.physical_len_tokens());
        let kv_held_bytes =
            self.scheduler.kv().held_blocks(seq_id) as u64 * self.preflight.sizing.bytes_per_block;
        if let Some(f) = &finished {
            if f.stop_match.is_none() {
                // Length-limited: release text held back for a possible stop string, and any
                // bytes of an unfinished UTF-8 character.
                text_delta.push_str(&seq.stop.flush());
                if let Some(t) = seq.text.as_mut() {
                    text_delta.push_str(&t.finish());
                }
            }
            self.scheduler.finish(seq_id)?;
            self.seqs.remove(&seq_id);
            self.counters.finished_requests += 1;
        } else {
            // A block that just filled gets its hash (a recompute after preemption may reuse
            // it, and the registration after its forward pass needs it).
            self.extend_block_hashes(seq_id)?;
        }
        Ok(RequestOutput {
            seq_id,
            token_id: Some(token),
            text_delta,
            logprob,
            finished,
            num_prompt_tokens,
            num_output_tokens,
            full_logprobs,
            kv_physical_tokens,
            kv_held_bytes,
            error: None,
        })
    }

    /// Bytes of the blocks `seq_id` holds over every cache group.
    fn held_bytes(&self, seq_id: SeqId) -> u64 {
        self.scheduler.kv().held_blocks(seq_id) as u64 * self.preflight.sizing.bytes_per_block
    }
}
