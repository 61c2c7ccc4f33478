//! The boot-time warm-up: one synthetic request of a full step's prompt tokens and a decode
//! step, run through the real path (scheduler, chunked prefill, sampling, the batch-1 decode
//! graph where graphs are on) before the server takes its first request. A device backend pays
//! first-use costs on the first step of each shape: library kernels loaded and their algorithms
//! chosen, the memory pool grown to a full step's activations, a decode graph recorded. Without
//! the warm-up the first user request pays them: a fresh server's first 24.5k-token prompt took
//! 341 ms to its first token against 276 ms for the next two (H100, 2026-12-07, synthetic
//! Qwen2.5-Coder-1.5B; vLLM runs a dummy full step and records its graphs at boot alike).
//!
//! The warm-up leaves no trace a user can see: its blocks are not registered in the prefix
//! cache (the hasher is set aside while it runs), and the engine's and scheduler's counters are
//! zeroed after it.

use std::time::{Duration, Instant};

use super::{Engine, EngineCounters, EngineError};
use crate::sampling::SamplingParams;
use starling_backend::Backend;

/// What a warm-up ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmUp {
    /// Prompt tokens of the synthetic request.
    pub prompt_tokens: usize,
    /// Engine steps it took (prefill chunks, then decode).
    pub steps: u64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl<B: Backend> Engine<B> {
    /// The warm-up a server runs unless told otherwise: one step's token budget where the
    /// backend has device memory of its own (a GPU, with first-use costs to pay), none on the
    /// host.
    pub fn default_warm_up_tokens(&self) -> usize {
        if self.backend.memory_info().is_some() {
            self.scheduler.config().max_num_batched_tokens
        } else {
            0
        }
    }

    /// Runs one synthetic greedy request of `prompt_tokens` prompt tokens (at most one step's
    /// budget and `max_model_len - 2`) and two generated tokens, then forgets it: counters
    /// zeroed, nothing left in the prefix cache, every block free again. For an idle engine
    /// only (refused with requests in flight, whose counters it would erase). A request that
    /// fails on its own (NaN logits from the synthetic prompt) fails the warm-up with its reason.
    pub fn warm_up(&mut self, prompt_tokens: usize) -> Result<WarmUp, EngineError> {
        if self.has_unfinished() {
            return Err(EngineError::InvalidRequest(
                "the warm-up runs on an idle engine only".into(),
            ));
        }
        let sched = self.scheduler.config();
        let prompt_tokens = prompt_tokens
            .min(sched.max_num_batched_tokens)
            .min(sched.max_model_len_tokens.saturating_sub(2))
            .max(1);
        let vocab = self.model.config().vocab_size.max(1);
        // Any valid ids do: the costs paid are per shape, not per value.
        let prompt: Vec<u32> = (0..prompt_tokens).map(|i| (i % vocab) as u32).collect();
        let params = SamplingParams {
            temperature: 0.0,
            max_tokens: Some(2),
            ignore_eos: true,
            ..SamplingParams::default()
        };
        let started = Instant::now();
        let hasher = self.hasher.take();
        let run = self.run_to_completion(prompt, params);
        self.hasher = hasher;
        let steps = self.counters.steps;
        self.counters = EngineCounters::default();
        self.last_step = None;
        self.scheduler.reset_counters();
        run?;
        Ok(WarmUp {
            prompt_tokens,
            steps,
            elapsed: started.elapsed(),
        })
    }

    /// Adds the request and steps until the engine is idle again; the request's own failure
    /// is returned as an error.
    fn run_to_completion(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(), EngineError> {
        self.add_request(prompt, params)?;
        while self.has_unfinished() {
            for output in self.step()? {
                if let Some(failure) = output.error {
                    return Err(EngineError::InvalidRequest(format!(
                        "the warm-up request failed: {failure:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}
