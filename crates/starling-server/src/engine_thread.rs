//! The engine on its own OS thread.
//!
//! Handlers send [`Command`]s through a std channel (sending never blocks the async runtime);
//! each request carries a tokio unbounded sender for its [`RequestEvent`]s. The loop drains
//! commands, drops requests whose receiver is gone (the client disconnected: its blocks are
//! freed before the next step), steps while there is work and blocks on the channel when idle.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use starling_backend::Backend;
use starling_engine::sampling::{FinishReason, SamplingParams};
use starling_engine::{
    CacheReport, Engine, EngineError, FailureKind, RequestFailure, RequestOptions, RequestOutput,
};
use starling_kv::SeqId;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::api_error::ApiError;
use crate::metrics::{Metrics, MetricsState};

/// Requests in a row ended by non-finite logits, with no valid token sampled in between, after
/// which the model itself (not a prompt) is reported broken: `/health` answers 503.
pub const NON_FINITE_STREAK_BROKEN: u64 = 4;
/// Failed steps in a row that removed no request before every request is failed (a step error
/// the engine could not pin on its requests must not spin the loop).
const MAX_FRUITLESS_FAILED_STEPS: u32 = 3;

/// Failures starting or reaching the engine thread.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The engine could not be built on its thread.
    #[error("starting the engine: {0}")]
    EngineStart(#[from] EngineError),
    /// The engine thread could not be spawned or died before reporting.
    #[error("the engine thread failed to start: {0}")]
    ThreadStart(String),
    /// Binding or serving the socket failed.
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
    /// A second shutdown signal arrived while draining; in-flight requests were abandoned.
    #[error("forced shutdown: a second signal arrived while draining")]
    ForcedShutdown,
}

/// Limits of the engine that the HTTP layer validates requests against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineInfo {
    /// Longest prompt + output, tokens.
    pub max_model_len_tokens: usize,
    /// Logits per step; token ids must be below this.
    pub vocab_size: usize,
    /// Blocks in the KV pool.
    pub kv_blocks_total: usize,
    /// Token slots per block.
    pub block_size_tokens: usize,
}

/// What a request's handler hears from the engine.
#[derive(Debug)]
pub enum RequestEvent {
    /// The engine queued the request.
    Accepted,
    /// The engine refused the request (invalid parameters or prompt).
    Rejected(EngineError),
    /// A step produced a token (or the final output) for the request.
    Output(RequestOutput),
    /// The engine failed while running the request; the request is over and its blocks free.
    Failed(ApiError),
}

/// A request for the engine thread.
struct NewRequest {
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    options: RequestOptions,
    arrival: Instant,
    events: UnboundedSender<RequestEvent>,
}

enum Command {
    Add(Box<NewRequest>),
    /// Abort every request in flight (shutdown grace period over).
    AbortAll,
    /// Abort everything and leave the loop.
    Shutdown,
}

/// How one live request is doing, for its channel and its latency metrics.
struct LiveRequest {
    events: UnboundedSender<RequestEvent>,
    arrival: Instant,
    last_token_at: Option<Instant>,
}

/// The handlers' side of the engine thread. Cloning shares the same thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    info: EngineInfo,
    /// What the engine's KV cache is (layout, blocks, longest context), fixed at start.
    cache: Arc<CacheReport>,
    metrics: Arc<Metrics>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl EngineHandle {
    /// Builds the engine with `build` on a new thread (some backends bind device state to the
    /// thread that creates it) and starts its loop. Returns once the engine is ready.
    pub fn spawn<B, F>(build: F) -> Result<Self, ServerError>
    where
        B: Backend + 'static,
        F: FnOnce() -> Result<Engine<B>, EngineError> + Send + 'static,
    {
        let (commands, command_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let loop_metrics = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("starling-engine".into())
            .spawn(move || {
                let engine = match build() {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let sched = engine.scheduler_config();
                let info = EngineInfo {
                    max_model_len_tokens: sched.max_model_len_tokens,
                    vocab_size: engine.model().config().vocab_size,
                    kv_blocks_total: engine.stats().kv_blocks_total,
                    block_size_tokens: sched.block_size_tokens,
                };
                let cache = engine.cache_report();
                {
                    let mut state = loop_metrics.lock();
                    state.kv_compression = Some(engine.compression().to_json());
                    state.kv_cache = Some(cache.clone());
                }
                loop_metrics.record_step(engine.stats(), None);
                if ready_tx.send(Ok((info, cache))).is_err() {
                    return;
                }
                EngineLoop::new(engine, loop_metrics).run(command_rx);
            })
            .map_err(|e| ServerError::ThreadStart(e.to_string()))?;
        let (info, cache) = match ready_rx.recv() {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(ServerError::EngineStart(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ServerError::ThreadStart(
                    "the engine thread exited while building the engine".into(),
                ));
            }
        };
        Ok(EngineHandle {
            commands,
            info,
            cache: Arc::new(cache),
            metrics,
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// The engine's limits.
    pub fn info(&self) -> EngineInfo {
        self.info
    }

    /// What the engine's KV cache is: layout, bytes per token, blocks, longest context.
    pub fn cache_report(&self) -> &CacheReport {
        &self.cache
    }

    /// The metrics the engine thread keeps.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Queues a request; its events arrive on the returned receiver, starting with
    /// [`RequestEvent::Accepted`] or [`RequestEvent::Rejected`]. Dropping the receiver aborts
    /// the request. `None` when the engine thread has stopped.
    pub fn submit(
        &self,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
        options: RequestOptions,
    ) -> Option<UnboundedReceiver<RequestEvent>> {
        let (events, receiver) = unbounded_channel();
        let request = NewRequest {
            prompt_ids,
            params,
            options,
            arrival: Instant::now(),
            events,
        };
        self.commands.send(Command::Add(Box::new(request))).ok()?;
        Some(receiver)
    }

    /// Aborts every request in flight; their streams end with finish reason `abort`.
    pub fn abort_all(&self) {
        let _ = self.commands.send(Command::AbortAll);
    }

    /// Aborts what is left, stops the loop and waits for the thread (idempotent).
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("the engine thread panicked");
            }
        }
    }
}

/// Events for the clients, delivered in order by the dispatcher thread.
type Deliveries = Vec<(UnboundedSender<RequestEvent>, RequestEvent)>;

struct EngineLoop<B: Backend> {
    engine: Engine<B>,
    metrics: Arc<Metrics>,
    live: HashMap<SeqId, LiveRequest>,
    /// Events produced since the last flush.
    pending: Deliveries,
    /// To the dispatcher thread, which does the per-request sends (each one may wake an async
    /// task: at batch 64 that is 64 wake-ups per step, kept off the engine's critical path).
    dispatch: Sender<Deliveries>,
    /// Whether the model, rather than some prompts, produces non-finite logits.
    non_finite: NonFiniteWatch,
    /// Failed steps in a row that ended no request.
    fruitless_failed_steps: u32,
}

/// Starts the thread that hands events to the requests' channels, in the order produced.
fn spawn_dispatcher() -> Sender<Deliveries> {
    let (tx, rx) = mpsc::channel::<Deliveries>();
    let spawned = std::thread::Builder::new()
        .name("starling-dispatch".into())
        .spawn(move || {
            for batch in rx {
                for (events, event) in batch {
                    // A closed receiver is a disconnected client; the engine loop aborts it.
                    let _ = events.send(event);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the dispatcher thread: {e}");
    }
    tx
}

impl<B: Backend> EngineLoop<B> {
    fn new(engine: Engine<B>, metrics: Arc<Metrics>) -> Self {
        EngineLoop {
            engine,
            metrics,
            pending: Vec::new(),
            dispatch: spawn_dispatcher(),
            live: HashMap::new(),
            non_finite: NonFiniteWatch::default(),
            fruitless_failed_steps: 0,
        }
    }

    fn run(mut self, commands: Receiver<Command>) {
        self.run_loop(commands);
        self.flush();
    }

    /// Sends the events produced so far to the dispatcher (one message per loop turn).
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        if let Err(mpsc::SendError(batch)) = self.dispatch.send(batch) {
            // No dispatcher thread (it failed to start): deliver here instead.
            for (events, event) in batch {
                let _ = events.send(event);
            }
        }
    }

    fn deliver(&mut self, events: &UnboundedSender<RequestEvent>, event: RequestEvent) {
        self.pending.push((events.clone(), event));
    }

    fn run_loop(&mut self, commands: Receiver<Command>) {
        loop {
            self.flush();
            if self.live.is_empty() {
                // Idle: block until a command arrives (no busy spin).
                match commands.recv() {
                    Ok(command) => {
                        if !self.handle(command) {
                            return;
                        }
                    }
                    // Every handle is gone: nobody can send work any more.
                    Err(mpsc::RecvError) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(command) => {
                        if !self.handle(command) {
                            return;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.abort_all();
                        return;
                    }
                }
            }
            self.abort_disconnected();
            if self.engine.has_unfinished() {
                self.step();
            } else if !self.live.is_empty() {
                self.fail_orphans();
            }
        }
    }

    /// Applies one command; false means leave the loop.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Add(request) => self.add(*request),
            Command::AbortAll => self.abort_all(),
            Command::Shutdown => {
                self.abort_all();
                return false;
            }
        }
        true
    }

    fn add(&mut self, request: NewRequest) {
        let num_prompt_tokens = request.prompt_ids.len() as u64;
        match self
            .engine
            .add_request_with(request.prompt_ids, request.params, request.options)
        {
            Ok(seq_id) => {
                self.metrics.lock().prompt_tokens_total += num_prompt_tokens;
                self.deliver(&request.events, RequestEvent::Accepted);
                self.live.insert(
                    seq_id,
                    LiveRequest {
                        events: request.events,
                        arrival: request.arrival,
                        last_token_at: None,
                    },
                );
            }
            Err(e) => {
                self.metrics.lock().rejected_total += 1;
                self.deliver(&request.events, RequestEvent::Rejected(e));
            }
        }
    }

    /// Aborts requests whose client went away, so their blocks are free before the next step.
    fn abort_disconnected(&mut self) {
        let gone: Vec<SeqId> = self
            .live
            .iter()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for seq_id in gone {
            self.abort(seq_id);
        }
        // The loop may go idle now; /metrics must already show the freed blocks.
        self.metrics.record_step(self.engine.stats(), None);
    }

    /// Fails requests the engine no longer holds but that never got a last output, so a client
    /// is never left waiting and the loop never spins on them.
    fn fail_orphans(&mut self) {
        let orphans: Vec<SeqId> = self
            .live
            .keys()
            .copied()
            .filter(|&id| !self.engine.has_request(id))
            .collect();
        let mut metrics = self.metrics.lock();
        for seq_id in orphans {
            if let Some(live) = self.live.remove(&seq_id) {
                tracing::error!("{seq_id:?} ended without a last output");
                metrics.finished_error += 1;
                let error = ApiError::internal("the engine ended this request without an answer");
                self.pending
                    .push((live.events, RequestEvent::Failed(error)));
            }
        }
    }

    fn abort_all(&mut self) {
        let ids: Vec<SeqId> = self.live.keys().copied().collect();
        for seq_id in ids {
            self.abort(seq_id);
        }
        self.metrics.record_step(self.engine.stats(), None);
    }

    fn abort(&mut self, seq_id: SeqId) {
        let Some(live) = self.live.remove(&seq_id) else {
            return;
        };
        match self.engine.abort(seq_id) {
            Ok(output) => {
                self.metrics.lock().finished_abort += 1;
                self.deliver(&live.events, RequestEvent::Output(output));
            }
            Err(e) => tracing::warn!("aborting {seq_id:?}: {e}"),
        }
    }

    fn step(&mut self) {
        let started = Instant::now();
        let result = self.engine.step();
        let now = Instant::now();
        match result {
            Ok(outputs) => {
                self.fruitless_failed_steps = 0;
                let mut metrics = self.metrics.lock();
                if !outputs.is_empty() {
                    metrics
                        .step_s
                        .observe(now.duration_since(started).as_secs_f64());
                }
                for output in outputs {
                    let seq_id = output.seq_id;
                    let Some(live) = self.live.get_mut(&seq_id) else {
                        continue;
                    };
                    if let Some(failure) = &output.error {
                        // The engine ended this request alone (its blocks are already free).
                        let error = self.non_finite.failed(failure, &mut metrics);
                        metrics.finished_error += 1;
                        self.pending
                            .push((live.events.clone(), RequestEvent::Failed(error)));
                        self.live.remove(&seq_id);
                        continue;
                    }
                    if output.token_id.is_some() {
                        self.non_finite.sampled(&mut metrics);
                        match live.last_token_at {
                            None => metrics
                                .ttft_s
                                .observe(now.duration_since(live.arrival).as_secs_f64()),
                            Some(previous) => metrics
                                .itl_s
                                .observe(now.duration_since(previous).as_secs_f64()),
                        }
                        live.last_token_at = Some(now);
                    }
                    let finished = output.finished.as_ref().map(|f| f.reason);
                    self.pending
                        .push((live.events.clone(), RequestEvent::Output(output)));
                    if let Some(reason) = finished {
                        metrics
                            .e2e_s
                            .observe(now.duration_since(live.arrival).as_secs_f64());
                        match reason {
                            FinishReason::Stop => metrics.finished_stop += 1,
                            FinishReason::Length => metrics.finished_length += 1,
                            FinishReason::Abort => metrics.finished_abort += 1,
                            FinishReason::Error => metrics.finished_error += 1,
                        }
                        self.live.remove(&seq_id);
                    }
                }
            }
            Err(e) => self.step_failed(&e),
        }
        let stats = self.engine.stats();
        self.metrics.record_step(stats, stats.last_step);
        // Empty (and cheap: one uncontended lock) unless `--kernel-profile` started one.
        if let Ok(sites) = self.engine.kernel_profile() {
            if !sites.is_empty() {
                self.metrics.lock().kernel_profile = sites;
            }
        }
    }

    /// A step failed as a whole (the forward pass, say): the engine aborted that step's
    /// requests; tell their clients and keep serving. A failure that ended no request, repeated,
    /// fails every request rather than spinning.
    fn step_failed(&mut self, e: &EngineError) {
        tracing::error!("engine step failed: {e}");
        let error =
            ApiError::internal(format!("the engine failed while running this request: {e}"));
        let mut failed: Vec<SeqId> = self
            .live
            .keys()
            .copied()
            .filter(|&id| !self.engine.has_request(id))
            .collect();
        if failed.is_empty() {
            self.fruitless_failed_steps += 1;
            if self.fruitless_failed_steps < MAX_FRUITLESS_FAILED_STEPS {
                return;
            }
            tracing::error!(
                "{} failed steps in a row ended no request: failing all {} requests",
                self.fruitless_failed_steps,
                self.live.len()
            );
            failed = self.live.keys().copied().collect();
            for &seq_id in &failed {
                if let Err(e) = self.engine.abort(seq_id) {
                    tracing::warn!("aborting {seq_id:?}: {e}");
                }
            }
        }
        self.fruitless_failed_steps = 0;
        let mut metrics = self.metrics.lock();
        for seq_id in failed {
            if let Some(live) = self.live.remove(&seq_id) {
                metrics.finished_error += 1;
                self.pending
                    .push((live.events, RequestEvent::Failed(error.clone())));
            }
        }
    }
}

/// Tells a model that produces non-finite logits for every request from a prompt that trips it.
#[derive(Debug, Default)]
struct NonFiniteWatch {
    /// Requests in a row ended by non-finite logits, with no valid token since.
    streak: u64,
}

impl NonFiniteWatch {
    /// A request got a valid token: the model works.
    fn sampled(&mut self, metrics: &mut MetricsState) {
        self.streak = 0;
        if metrics.model_output_non_finite.take().is_some() {
            tracing::warn!("the model produced a valid token again; /health reports it healthy");
        }
    }

    /// The client's error for a request the engine ended with `failure`.
    fn failed(&mut self, failure: &RequestFailure, metrics: &mut MetricsState) -> ApiError {
        let code = match failure.kind {
            FailureKind::NonFiniteLogits => "non_finite_logits",
            FailureKind::Sampling => "sampling_failed",
            FailureKind::Compression => "kv_compression_failed",
            FailureKind::Internal => "engine_error",
        };
        if failure.kind != FailureKind::NonFiniteLogits {
            tracing::error!("request failed: {}", failure.message);
            return ApiError::internal(format!(
                "the engine stopped this request: {}",
                failure.message
            ))
            .with_code(code);
        }
        metrics.non_finite_requests_total += 1;
        self.streak += 1;
        if self.streak >= NON_FINITE_STREAK_BROKEN {
            if metrics.model_output_non_finite.is_none() {
                tracing::error!(
                    "the model produced non-finite logits for each of the last {} requests: its \
                     weights are probably corrupt; /health now answers 503",
                    self.streak
                );
            }
            metrics.model_output_non_finite = Some(self.streak);
        } else {
            tracing::warn!("request stopped: {}", failure.message);
        }
        let mut message = format!("{}; the request was stopped", failure.message);
        if let Some(streak) = metrics.model_output_non_finite {
            message.push_str(&format!(
                ". The model produces non-finite logits for every request (the last {streak} in \
                 a row): its weights are probably corrupt"
            ));
        }
        ApiError::internal(message).with_code(code)
    }
}
