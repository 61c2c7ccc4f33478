//! One harness for every engine test: a seeded trace of requests ([`Trace`]) run through an
//! [`Engine`] on any backend ([`EngineTester`]), with the block books checked after every step,
//! and the outcome ([`TraceOutcome`]) compared across configurations — {CPU, CUDA} × {full K/V,
//! eviction, STAR-KV latents} — by [`first_divergence`].
//!
//! It is the one driver the CPU and GPU tests share (ripgrep's `SearcherTester` pattern), so a
//! path is never tested by a hand-written loop that skips what the engine really does
//! (chunking, batching, preemption, compaction).

use std::collections::HashMap;
use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::Backend;
use starling_kv::SeqId;

use crate::sampling::SamplingParams;
use crate::{Engine, EngineError, RequestOptions};

/// One request of a trace, added before the step numbered `arrival_step` (0: before the first).
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// When it arrives, in engine steps.
    pub arrival_step: usize,
    /// Its prompt.
    pub prompt_ids: Vec<u32>,
    /// Its sampling parameters.
    pub params: SamplingParams,
    /// Its per-request options (eviction policy, …).
    pub options: RequestOptions,
}

/// A reproducible sequence of requests.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The requests, in the order they are added.
    pub requests: Vec<TraceRequest>,
}

/// Greedy sampling of exactly `max_tokens` tokens (EOS ignored).
fn greedy_ignoring_eos(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

impl Trace {
    /// `count` greedy requests (EOS ignored, so each runs to its `max_tokens`) with prompt
    /// lengths in `prompt_tokens`, outputs in `output_tokens`, ids in `3..vocab_size` and
    /// arrivals spread over the first `arrival_steps` steps, all drawn from `seed`.
    pub fn seeded_greedy(
        seed: u64,
        count: usize,
        vocab_size: usize,
        prompt_tokens: Range<usize>,
        output_tokens: Range<usize>,
        arrival_steps: usize,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let requests = (0..count)
            .map(|_| {
                let len = rng.gen_range(prompt_tokens.clone());
                TraceRequest {
                    arrival_step: rng.gen_range(0..arrival_steps.max(1)),
                    prompt_ids: (0..len)
                        .map(|_| rng.gen_range(3..vocab_size.max(4) as u32))
                        .collect(),
                    params: greedy_ignoring_eos(rng.gen_range(output_tokens.clone())),
                    options: RequestOptions::default(),
                }
            })
            .collect();
        Self { requests }
    }

    /// vLLM's `prefix_repetition` shape, seeded: `prefixes` random prefixes of `prefix_tokens`
    /// tokens, each followed by `per_prefix` random suffixes (lengths drawn from
    /// `suffix_tokens`), greedy, EOS ignored; request `i` of a prefix arrives at step
    /// `i * step_gap` (the first one computes the prefix, the later ones may find it cached).
    #[allow(clippy::too_many_arguments)]
    pub fn seeded_shared_prefixes(
        seed: u64,
        prefixes: usize,
        per_prefix: usize,
        vocab_size: usize,
        prefix_tokens: usize,
        suffix_tokens: Range<usize>,
        output_tokens: Range<usize>,
        step_gap: usize,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let token = |rng: &mut ChaCha8Rng| rng.gen_range(3..vocab_size.max(4) as u32);
        let mut requests = Vec::new();
        for _ in 0..prefixes {
            let prefix: Vec<u32> = (0..prefix_tokens).map(|_| token(&mut rng)).collect();
            for i in 0..per_prefix {
                let mut prompt_ids = prefix.clone();
                let len = rng.gen_range(suffix_tokens.clone());
                prompt_ids.extend((0..len).map(|_| token(&mut rng)));
                requests.push(TraceRequest {
                    arrival_step: i * step_gap,
                    prompt_ids,
                    params: greedy_ignoring_eos(rng.gen_range(output_tokens.clone())),
                    options: RequestOptions::default(),
                });
            }
        }
        Self { requests }
    }

    /// The trace teacher-forced to `outcome`'s tokens (each request emits exactly what it
    /// generated there, with its full log-softmax rows): another backend then runs the same
    /// schedule, and its probabilities of the same tokens can be compared position by position.
    pub fn forced_to(&self, outcome: &TraceOutcome) -> Self {
        let mut forced = self.clone();
        for (r, result) in forced.requests.iter_mut().zip(&outcome.requests) {
            r.options.forced_output_ids = Some(result.token_ids.clone());
            r.options.return_full_logprobs = true;
        }
        forced
    }

    /// The trace with every request's options set by `f` (given its index).
    pub fn with_options(mut self, f: impl Fn(usize, &mut RequestOptions)) -> Self {
        for (i, r) in self.requests.iter_mut().enumerate() {
            f(i, &mut r.options);
        }
        self
    }
}

/// What one request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestResult {
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// `"stop"`, `"length"` or `"abort"`.
    pub finish_reason: String,
    /// The most cache slots it held after any step.
    pub max_physical_tokens: usize,
    /// Every generated token's full log-softmax row, when its options ask for them
    /// (`return_full_logprobs`); empty otherwise.
    pub logprob_rows: Vec<Vec<f32>>,
}

/// What a whole trace produced, and how the cache was used.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceOutcome {
    /// One result per trace request, in trace order.
    pub requests: Vec<RequestResult>,
    /// Steps run.
    pub steps: usize,
    /// Blocks in the pool.
    pub blocks_total: usize,
    /// The most blocks in use after any step.
    pub max_blocks_in_use: usize,
    /// Preemptions.
    pub preemptions: u64,
    /// Eviction compactions.
    pub compressions: u64,
    /// Blocks eviction returned.
    pub evicted_blocks: u64,
    /// Cached or shared blocks copied before a compaction (copy-on-compact).
    pub forked_blocks: u64,
    /// Prompt and recomputed tokens run through the model (prefix-cache hits are not).
    pub prefill_tokens: u64,
    /// Tokens found in the prefix cache at admission (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hit_tokens: u64,
    /// Tokens queried at admission (vLLM's `prefix_cache_queries`).
    pub prefix_cache_query_tokens: u64,
}

/// Why a trace failed.
#[derive(Debug, thiserror::Error)]
pub enum TesterError {
    /// The engine refused a request or a step failed.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// The trace did not finish within the step limit.
    #[error("the trace did not finish in {0} steps")]
    Stalled(usize),
    /// The block books were inconsistent.
    #[error("block accounting: {0}")]
    Accounting(String),
    /// A request ended as aborted although the trace does not abort any.
    #[error("request {0} was aborted")]
    Aborted(usize),
}

/// Runs traces through engines.
#[derive(Clone, Copy, Debug)]
pub struct EngineTester {
    /// Steps after which a trace counts as stalled.
    pub max_steps: usize,
}

impl Default for EngineTester {
    fn default() -> Self {
        Self { max_steps: 20_000 }
    }
}

impl EngineTester {
    /// Runs `trace` to completion on `engine` (which must be idle; its prefix cache may hold
    /// blocks of earlier traces). After every step the scheduler's and the KV manager's books
    /// must agree (`Engine::check_invariants`: ref counts, free + held = total, hashes only on
    /// full blocks); at the end every block must be free again (cached free blocks count as
    /// free) and no request may have been aborted.
    pub fn run<B: Backend>(
        &self,
        engine: &mut Engine<B>,
        trace: &Trace,
    ) -> Result<TraceOutcome, TesterError> {
        let start = engine.stats();
        let mut ids: Vec<Option<SeqId>> = vec![None; trace.requests.len()];
        let mut index_of: HashMap<SeqId, usize> = HashMap::new();
        let mut results: Vec<RequestResult> = trace
            .requests
            .iter()
            .map(|_| RequestResult {
                token_ids: Vec::new(),
                finish_reason: String::new(),
                max_physical_tokens: 0,
                logprob_rows: Vec::new(),
            })
            .collect();
        let mut max_blocks_in_use = 0;
        let mut steps = 0;
        loop {
            for (i, r) in trace.requests.iter().enumerate() {
                if ids[i].is_none() && r.arrival_step <= steps {
                    let id = engine.add_request_with(
                        r.prompt_ids.clone(),
                        r.params.clone(),
                        r.options.clone(),
                    )?;
                    ids[i] = Some(id);
                    index_of.insert(id, i);
                }
            }
            let all_added = ids.iter().all(Option::is_some);
            if all_added && !engine.has_unfinished() {
                break;
            }
            if steps >= self.max_steps {
                return Err(TesterError::Stalled(steps));
            }
            for out in engine.step()? {
                let Some(&i) = index_of.get(&out.seq_id) else {
                    continue;
                };
                let result = &mut results[i];
                result.token_ids.extend(out.token_id);
                result.logprob_rows.extend(out.full_logprobs);
                result.max_physical_tokens = result.max_physical_tokens.max(out.kv_physical_tokens);
                if let Some(f) = &out.finished {
                    result.finish_reason = f.reason.as_str().to_owned();
                }
            }
            steps += 1;
            engine
                .check_invariants()
                .map_err(|e| TesterError::Accounting(format!("after step {steps}: {e}")))?;
            let stats = engine.stats();
            if stats.kv_blocks_free > stats.kv_blocks_total {
                return Err(TesterError::Accounting(format!(
                    "{} free of {} blocks",
                    stats.kv_blocks_free, stats.kv_blocks_total
                )));
            }
            max_blocks_in_use = max_blocks_in_use.max(stats.kv_blocks_total - stats.kv_blocks_free);
        }
        let end = engine.stats();
        if end.kv_blocks_free != end.kv_blocks_total {
            return Err(TesterError::Accounting(format!(
                "{} of {} blocks still held after the trace",
                end.kv_blocks_total - end.kv_blocks_free,
                end.kv_blocks_total
            )));
        }
        if let Some(i) = results.iter().position(|r| r.finish_reason == "abort") {
            return Err(TesterError::Aborted(i));
        }
        Ok(TraceOutcome {
            requests: results,
            steps,
            blocks_total: end.kv_blocks_total,
            max_blocks_in_use,
            preemptions: end.num_preemptions - start.num_preemptions,
            compressions: end.counters.compressions - start.counters.compressions,
            evicted_blocks: end.counters.evicted_blocks - start.counters.evicted_blocks,
            forked_blocks: end.counters.forked_blocks - start.counters.forked_blocks,
            prefill_tokens: end.counters.prefill_tokens - start.counters.prefill_tokens,
            prefix_cache_hit_tokens: end.prefix_cache.hits_tokens - start.prefix_cache.hits_tokens,
            prefix_cache_query_tokens: end.prefix_cache.queries_tokens
                - start.prefix_cache.queries_tokens,
        })
    }
}

/// The first `(request, token)` where two outcomes' generated tokens differ (a length
/// difference counts at the shorter one's end); `None` when every request generated the same.
pub fn first_divergence(a: &TraceOutcome, b: &TraceOutcome) -> Option<(usize, usize)> {
    if a.requests.len() != b.requests.len() {
        return Some((a.requests.len().min(b.requests.len()), 0));
    }
    a.requests
        .iter()
        .zip(&b.requests)
        .enumerate()
        .find_map(|(i, (x, y))| {
            let same = x
                .token_ids
                .iter()
                .zip(&y.token_ids)
                .take_while(|(p, q)| p == q)
                .count();
            (same < x.token_ids.len().max(y.token_ids.len())).then_some((i, same))
        })
}
