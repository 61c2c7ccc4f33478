//! The weighted draw of one token, from one uniform number.

use super::ranking::Candidate;
use super::vector_math::{
    block_sum_exp, exp_nonpositive, sum_exp_candidates, weight_at_least, BLOCK_LEN,
};

/// Draws a token from the whole vocabulary, with weight `exp(logit - max_logit)` for logits at
/// least `floor` and 0 for the rest.
///
/// Block totals are computed with vectorised sums; only the chosen block is walked token by
/// token, so the draw costs one fast pass instead of a scalar `exp` per token.
pub(super) fn draw_dense(
    logits: &[f32],
    max_logit: f32,
    floor: f32,
    uniform: f64,
    block_weights: &mut Vec<f64>,
) -> Option<u32> {
    block_weights.clear();
    block_weights.extend(
        logits
            .chunks(BLOCK_LEN)
            .map(|block| block_sum_exp(block, max_logit, floor)),
    );
    let total_weight: f64 = block_weights.iter().sum();
    let mut remaining = uniform * total_weight;
    let chosen_block = block_weights
        .iter()
        .position(|&block_weight| {
            let inside = remaining < block_weight;
            if !inside {
                remaining -= block_weight;
            }
            inside
        })
        // Rounding pushed the target past the end: use the last block that has any weight.
        .or_else(|| block_weights.iter().rposition(|&weight| weight > 0.0))?;
    let start = chosen_block * BLOCK_LEN;
    let end = (start + BLOCK_LEN).min(logits.len());
    let weights = (start..end).map(|index| {
        (
            index as u32,
            weight_at_least(logits[index], max_logit, floor),
        )
    });
    walk(weights, remaining)
}

/// Draws one of `candidates` with weight `exp(logit - max_logit)`.
pub(super) fn draw_candidates(
    candidates: &[Candidate],
    max_logit: f32,
    uniform: f64,
) -> Option<u32> {
    let total_weight = sum_exp_candidates(candidates, max_logit);
    let weights = candidates.iter().map(|candidate| {
        (
            candidate.token_id,
            exp_nonpositive(candidate.logit - max_logit),
        )
    });
    walk(weights, uniform * total_weight)
}

/// The first token whose cumulative weight exceeds `target`; when rounding leaves the target
/// unreached, the last token with a positive weight (never a zero-weight, filtered-out one).
fn walk(weights: impl Iterator<Item = (u32, f32)>, target: f64) -> Option<u32> {
    let mut remaining = target;
    let mut last_positive = None;
    for (token_id, weight) in weights {
        if weight > 0.0 {
            last_positive = Some(token_id);
            remaining -= f64::from(weight);
            if remaining < 0.0 {
                return Some(token_id);
            }
        }
    }
    last_positive
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits of the distribution [0.5, 0.3, 0.15, 0.05] (ln of each probability).
    fn hand_logits() -> Vec<f32> {
        [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn candidate_draw_follows_cumulative_weights() {
        let logits = hand_logits();
        let candidates: Vec<Candidate> = (0u32..)
            .zip(&logits)
            .map(|(token_id, &logit)| Candidate { logit, token_id })
            .collect();
        let max_logit = logits[0];
        let draw = |uniform| draw_candidates(&candidates, max_logit, uniform);
        assert_eq!(draw(0.0), Some(0));
        assert_eq!(draw(0.49), Some(0));
        assert_eq!(draw(0.51), Some(1));
        assert_eq!(draw(0.79), Some(1));
        assert_eq!(draw(0.9), Some(2));
        assert_eq!(draw(0.999_999), Some(3));
        assert_eq!(draw_candidates(&[], 0.0, 0.5), None);
    }

    #[test]
    fn dense_draw_crosses_blocks_and_skips_filtered_tokens() {
        // Three blocks; only tokens 5, 1500 and 2500 have weight (the rest are below the floor).
        let mut logits = vec![-10.0f32; 3 * BLOCK_LEN];
        logits[5] = 0.0;
        logits[1500] = 0.0;
        logits[2500] = 0.0;
        logits[2999] = f32::NEG_INFINITY;
        let mut blocks = Vec::new();
        let mut draw = |uniform| draw_dense(&logits, 0.0, -1.0, uniform, &mut blocks);
        assert_eq!(draw(0.1), Some(5));
        assert_eq!(draw(0.5), Some(1500));
        assert_eq!(draw(0.9), Some(2500));
        // A target at the very end still lands on a token with weight.
        assert_eq!(draw(1.0), Some(2500));
    }

    #[test]
    fn dense_draw_without_floor_matches_probabilities() {
        let logits = hand_logits();
        let mut blocks = Vec::new();
        let mut draw =
            |uniform| draw_dense(&logits, logits[0], f32::NEG_INFINITY, uniform, &mut blocks);
        assert_eq!(draw(0.49), Some(0));
        assert_eq!(draw(0.51), Some(1));
        assert_eq!(draw(0.9), Some(2));
        assert_eq!(draw(0.97), Some(3));
    }
}
