//! Repetition, presence and frequency penalties.
//!
//! Token occurrences are recounted from the sequence's ids on every call rather than kept in a
//! per-sequence state the engine would have to update: the cost is O(prompt + output) per step,
//! small next to the O(vocab) passes sampling needs anyway, and the sampler stays stateless with
//! respect to sequences (preemption, recompute and forking need no bookkeeping). The counting uses
//! vocabulary-sized scratch arrays that are reset through the list of touched ids, so no hashing
//! and no allocation happens after the first call.

use super::params::SamplingParams;

/// Reusable counting buffers; all counts are zero and all flags false between calls.
#[derive(Debug, Default)]
pub(super) struct PenaltyScratch {
    output_counts: Vec<u32>,
    seen_in_context: Vec<bool>,
    touched_ids: Vec<u32>,
}

impl PenaltyScratch {
    /// Applies the three penalties of `params` to `logits` in vLLM's order: repetition (prompt and
    /// output), then frequency and presence (output only). Ids outside `logits` are ignored.
    pub(super) fn apply(
        &mut self,
        logits: &mut [f32],
        prompt_ids: &[u32],
        output_ids: &[u32],
        params: &SamplingParams,
    ) {
        self.grow_to(logits.len());
        if params.repetition_penalty != 1.0 {
            self.apply_repetition(logits, prompt_ids, output_ids, params.repetition_penalty);
        }
        if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
            self.apply_presence_frequency(
                logits,
                output_ids,
                params.presence_penalty,
                params.frequency_penalty,
            );
        }
    }

    fn grow_to(&mut self, vocab_size: usize) {
        if self.output_counts.len() < vocab_size {
            self.output_counts.resize(vocab_size, 0);
            self.seen_in_context.resize(vocab_size, false);
        }
    }

    /// Hugging Face semantics: each distinct token of prompt and output is penalised once,
    /// positive logits divided and the others multiplied, so the penalty always lowers them.
    fn apply_repetition(
        &mut self,
        logits: &mut [f32],
        prompt_ids: &[u32],
        output_ids: &[u32],
        penalty: f32,
    ) {
        for &token_id in prompt_ids.iter().chain(output_ids) {
            let index = token_id as usize;
            if index >= logits.len() || self.seen_in_context[index] {
                continue;
            }
            self.seen_in_context[index] = true;
            self.touched_ids.push(token_id);
            let logit = &mut logits[index];
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
        for &token_id in &self.touched_ids {
            self.seen_in_context[token_id as usize] = false;
        }
        self.touched_ids.clear();
    }

    /// OpenAI semantics: `logit -= frequency * count + presence * (count > 0)` over output tokens.
    fn apply_presence_frequency(
        &mut self,
        logits: &mut [f32],
        output_ids: &[u32],
        presence: f32,
        frequency: f32,
    ) {
        for &token_id in output_ids {
            let index = token_id as usize;
            if index >= logits.len() {
                continue;
            }
            if self.output_counts[index] == 0 {
                self.touched_ids.push(token_id);
            }
            self.output_counts[index] = self.output_counts[index].saturating_add(1);
        }
        for &token_id in &self.touched_ids {
            let index = token_id as usize;
            let count = self.output_counts[index] as f32;
            logits[index] -= frequency * count + presence;
            self.output_counts[index] = 0;
        }
        self.touched_ids.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(repetition: f32, presence: f32, frequency: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: repetition,
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_once_per_token() {
        let mut scratch = PenaltyScratch::default();
        let mut logits = vec![2.0, -1.0, 3.0, 0.5];
        // Token 0 appears twice (prompt and output) but is penalised once; 3 is never seen.
        scratch.apply(&mut logits, &[0, 1], &[0, 2, 2], &params(2.0, 0.0, 0.0));
        assert_eq!(logits, vec![1.0, -2.0, 1.5, 0.5]);
        // Scratch was reset: a second call over no ids changes nothing.
        let mut again = vec![2.0, -1.0, 3.0, 0.5];
        scratch.apply(&mut again, &[], &[], &params(2.0, 0.0, 0.0));
        assert_eq!(again, vec![2.0, -1.0, 3.0, 0.5]);
    }

    #[test]
    fn presence_and_frequency_use_output_counts_only() {
        let mut scratch = PenaltyScratch::default();
        let mut logits = vec![1.0, 1.0, 1.0, 1.0];
        // Output: token 1 three times, token 2 once; token 0 only in the prompt.
        scratch.apply(&mut logits, &[0], &[1, 2, 1, 1], &params(1.0, 0.5, 0.25));
        // Token 1: 1 - (0.25 * 3 + 0.5) = -0.25; token 2: 1 - (0.25 + 0.5) = 0.25.
        assert_eq!(logits, vec![1.0, -0.25, 0.25, 1.0]);
        let mut again = vec![1.0; 4];
        scratch.apply(&mut again, &[], &[3], &params(1.0, 0.5, 0.25));
        assert_eq!(again, vec![1.0, 1.0, 1.0, 0.25]);
    }

    #[test]
    fn negative_presence_raises_logits_and_out_of_range_ids_are_ignored() {
        let mut scratch = PenaltyScratch::default();
        let mut logits = vec![0.0, 0.0];
        scratch.apply(&mut logits, &[7], &[1, 9], &params(1.5, -1.0, 0.0));
        // Token 1: repetition multiplies 0 (no change), presence -1 adds 1.
        assert_eq!(logits, vec![0.0, 1.0]);
    }
}
