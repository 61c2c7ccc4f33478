//! One arm of the demo: the prompts through one engine together (continuous batching), with
//! the answers, the engine's cache report and what the requests held at their peak.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::Result;
use starling_backend::Backend;
use starling_engine::sampling::SamplingParams;
use starling_engine::{CacheReport, Engine};

/// What an arm produced and held.
pub struct ArmOutcome {
    /// The answers, in prompt order.
    pub answers: Vec<String>,
    /// The engine's cache (layout, blocks, longest context).
    pub report: CacheReport,
    /// Most blocks the requests held at once (at a step's start, before any compaction in it).
    pub peak_blocks: usize,
    /// Token slots each request held when it finished, summed: what eviction keeps of a
    /// request (all of it without eviction).
    pub final_tokens: usize,
    /// Tokens of the requests when they finished (prompt and output, less the last one
    /// sampled), summed: what they would hold without eviction.
    pub final_logical_tokens: usize,
    /// Tokens generated, all requests.
    pub generated_tokens: usize,
    /// Wall time from the first request queued to the last token.
    pub elapsed_s: f64,
    /// Preemptions (the pool ran out and a request was recomputed).
    pub preemptions: u64,
    /// Tokens evicted per layer, summed over compactions.
    pub evicted_tokens: u64,
}

impl ArmOutcome {
    /// Bytes the requests' blocks held at the peak (whole blocks, all layers).
    pub fn peak_bytes(&self) -> u64 {
        (self.peak_blocks as u64)
            .saturating_mul(self.report.block_size_tokens as u64)
            .saturating_mul(self.report.bytes_per_token)
    }

    /// Bytes the requests held when they finished, summed (token slots, all layers).
    pub fn final_bytes(&self) -> u64 {
        (self.final_tokens as u64).saturating_mul(self.report.bytes_per_token)
    }

    /// Blocks still free at the peak.
    pub fn free_blocks_at_peak(&self) -> usize {
        self.report.num_blocks.saturating_sub(self.peak_blocks)
    }
}

/// Runs `prompts` (token ids) through `engine` together, greedy, at most `max_tokens` each.
pub fn run_arm<B: Backend>(
    engine: &mut Engine<B>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Result<ArmOutcome> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ..SamplingParams::default()
    };
    let started = Instant::now();
    let mut order = Vec::with_capacity(prompts.len());
    let mut answers = HashMap::new();
    for ids in prompts {
        let id = engine.add_request(ids.clone(), params.clone())?;
        order.push(id);
        answers.insert(id, String::new());
    }
    let (mut peak_blocks, mut generated_tokens) = (0usize, 0usize);
    let (mut final_tokens, mut final_logical_tokens) = (0usize, 0usize);
    while engine.has_unfinished() {
        for out in engine.step()? {
            if let Some(failure) = &out.error {
                anyhow::bail!("{}", failure.message);
            }
            generated_tokens += usize::from(out.token_id.is_some());
            if out.finished.is_some() {
                final_tokens += out.kv_physical_tokens;
                // The last token sampled is never written to the cache.
                final_logical_tokens +=
                    (out.num_prompt_tokens + out.num_output_tokens).saturating_sub(1);
            }
            if let Some(text) = answers.get_mut(&out.seq_id) {
                text.push_str(&out.text_delta);
            }
        }
        if let Some(step) = engine.stats().last_step {
            peak_blocks = peak_blocks.max(step.num_blocks_in_use);
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let stats = engine.stats();
    Ok(ArmOutcome {
        answers: order
            .iter()
            .map(|id| answers.remove(id).unwrap_or_default().trim().to_owned())
            .collect(),
        report: engine.cache_report(),
        peak_blocks,
        final_tokens,
        final_logical_tokens,
        generated_tokens,
        elapsed_s,
        preemptions: stats.num_preemptions,
        evicted_tokens: stats.counters.evicted_tokens,
    })
}
