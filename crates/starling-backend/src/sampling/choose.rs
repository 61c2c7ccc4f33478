//! Temperature, min-p, top-k, top-p and the draw over one row of processed logits.

use super::draw::{draw_candidates, draw_dense};
use super::filters::{
    collect_at_least, collect_top_k, keep_top_p, min_p_floor, nucleus_bound, scale_by_temperature,
};
use super::ranking::{argmax, by_rank, Candidate};
use super::vector_math::{max_value, sum_exp_candidates};
use super::TokenFilter;

/// Above this many kept candidates, putting them in id order re-reads the logits (one linear
/// pass) instead of sorting them (n log n).
const ID_SORT_MAX_CANDIDATES: usize = 4096;

/// Buffers [`choose_token`] reuses between calls.
#[derive(Debug, Default)]
pub struct FilterScratch {
    candidates: Vec<Candidate>,
    block_weights: Vec<f64>,
}

/// The token `filter` picks from `processed` (logits after any penalties and masking), drawn with
/// `uniform` in `[0, 1)`: the argmax (lowest id on ties) when greedy, else temperature, min-p,
/// top-k, top-p and the draw. `processed` is overwritten (temperature scaling). `None` when every
/// logit is `-inf`.
///
/// Unfiltered draws walk the dense buffer; filtered ones narrow it to a candidate list first
/// (top-k by its own pass, top-p by a bound on the nucleus), then draw in token-id order.
pub fn choose_token(
    processed: &mut [f32],
    filter: &TokenFilter,
    uniform: f64,
    scratch: &mut FilterScratch,
) -> Option<u32> {
    if filter.is_greedy() {
        return argmax(processed);
    }
    scale_by_temperature(processed, filter.temperature);
    let max_logit = max_value(processed);
    if max_logit == f32::NEG_INFINITY {
        return None;
    }
    let floor = min_p_floor(max_logit, filter.min_p);
    let top_k = filter
        .top_k
        .filter(|&top_k| top_k > 0 && top_k < processed.len());
    let uses_top_p = filter.top_p < 1.0;
    let candidates = &mut scratch.candidates;
    match top_k {
        None if !uses_top_p => {
            return draw_dense(
                processed,
                max_logit,
                floor,
                uniform,
                &mut scratch.block_weights,
            )
        }
        None => {
            let bound = nucleus_bound(processed, max_logit, floor, filter.top_p);
            collect_at_least(processed, bound.floor, candidates);
            keep_top_p(candidates, max_logit, bound.total_weight, filter.top_p);
        }
        Some(top_k) => {
            collect_top_k(processed, floor, top_k, candidates);
            if uses_top_p {
                let total_weight = sum_exp_candidates(candidates, max_logit);
                keep_top_p(candidates, max_logit, total_weight, filter.top_p);
            }
        }
    }
    into_id_order(candidates, processed);
    draw_candidates(candidates, max_logit, uniform)
}

/// Puts the kept `candidates` in increasing id order, the one walk order a device can reproduce
/// (selection leaves them in an order that depends on the algorithm).
///
/// The kept set is a rank prefix of the allowed tokens, so it is exactly the tokens of `logits`
/// ranking at or above its worst member; a large set is rebuilt from that rule in one pass.
fn into_id_order(candidates: &mut Vec<Candidate>, logits: &[f32]) {
    if candidates.len() <= ID_SORT_MAX_CANDIDATES {
        candidates.sort_unstable_by_key(|candidate| candidate.token_id);
        return;
    }
    let Some(&worst) = candidates.iter().max_by(|a, b| by_rank(a, b)) else {
        return;
    };
    candidates.clear();
    candidates.extend(
        (0u32..)
            .zip(logits)
            .map(|(token_id, &logit)| Candidate { logit, token_id })
            .filter(|candidate| by_rank(candidate, &worst).is_le()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(top_k: Option<usize>, top_p: f32) -> TokenFilter {
        TokenFilter {
            temperature: 1.0,
            top_k,
            top_p,
            min_p: 0.0,
        }
    }

    #[test]
    fn kept_candidates_are_drawn_in_id_order() {
        // Weights 1, e, e, 1 on ids 0..4; top-k 2 keeps ids 1 and 2 (equal weight): a draw below
        // one half takes the lower id whatever order the selection left them in.
        let logits = [0.0f32, 1.0, 1.0, 0.0];
        let mut scratch = FilterScratch::default();
        let draw = |uniform, scratch: &mut FilterScratch| {
            choose_token(&mut logits.clone(), &filter(Some(2), 1.0), uniform, scratch)
        };
        assert_eq!(draw(0.49, &mut scratch), Some(1));
        assert_eq!(draw(0.51, &mut scratch), Some(2));
    }

    #[test]
    fn large_kept_sets_take_the_same_id_order_as_small_ones() {
        // 10_000 distinct logits: top-p keeps thousands (rebuilt by one pass), top-k a few
        // (sorted); both lists must be ascending ids of a rank prefix.
        let logits: Vec<f32> = (0..10_000u64)
            .map(|i| ((i * 2_654_435_761) % 10_007) as f32 / 10_007.0)
            .collect();
        for (top_k, top_p) in [(None, 0.9f32), (Some(50), 1.0), (Some(9_000), 0.99)] {
            let mut scratch = FilterScratch::default();
            choose_token(
                &mut logits.clone(),
                &filter(top_k, top_p),
                0.5,
                &mut scratch,
            );
            let kept = &scratch.candidates;
            assert!(kept.windows(2).all(|w| w[0].token_id < w[1].token_id));
            let worst = kept.iter().map(|c| c.logit).fold(f32::INFINITY, f32::min);
            let above = logits.iter().filter(|&&l| l >= worst).count();
            assert_eq!(kept.len(), above, "top_k {top_k:?} top_p {top_p}");
        }
    }

    #[test]
    fn greedy_ignores_filters_and_all_masked_is_none() {
        let greedy = TokenFilter {
            temperature: 0.0,
            ..filter(Some(1), 0.5)
        };
        let mut scratch = FilterScratch::default();
        assert_eq!(
            choose_token(&mut [0.5, 2.0, 2.0], &greedy, 0.9, &mut scratch),
            Some(1)
        );
        assert_eq!(
            choose_token(
                &mut [f32::NEG_INFINITY; 2],
                &filter(None, 1.0),
                0.5,
                &mut scratch
            ),
            None
        );
    }
}
