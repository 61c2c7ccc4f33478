//! StreamingLLM: keep the attention sinks and the most recent tokens. Sinks and the window are
//! protected by selection; scoring by recency makes selection keep the newest of the rest, so at
//! a ratio that evicts every unprotected token only sinks + window remain.

use super::Scorer;
use crate::{EvictError, ScoreInput};

/// The StreamingLLM scorer.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamingLlm;

impl Scorer for StreamingLlm {
    fn name(&self) -> &'static str {
        "streaming_llm"
    }

    fn needs_keys(&self) -> bool {
        false
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        // Physical index order is chronological; f32 represents indices exactly below 2^24.
        Ok((0..input.keys.len_tokens()).map(|i| i as f32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{select_keep, HeadKeys};

    #[test]
    fn keeps_sinks_and_the_newest() {
        let keys = [0.5; 10];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: None,
            layer: 0,
            kv_head: 0,
        };
        let s = StreamingLlm.score(&input).unwrap();
        assert_eq!(s, (0..10).map(|i| i as f32).collect::<Vec<_>>());
        // Sink 2, window 3, keep 6: sinks 0, 1; window 7, 8, 9; the newest other is 6.
        assert_eq!(
            select_keep(&[s], 10, 6, 2, 3).unwrap(),
            vec![vec![0, 1, 6, 7, 8, 9]]
        );
    }
}
