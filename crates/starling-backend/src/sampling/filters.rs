//! Temperature, min-p, top-k and top-p.
//!
//! They work on the processed logits buffer and, once the field is narrowed, on a list of
//! [`Candidate`]s. None sorts the whole vocabulary: min-p is a threshold, top-k a single pass that
//! keeps a small buffer of the best tokens, and top-p first bounds the nucleus with one vectorised
//! pass, then runs a selection-based halving search over the tokens inside the bound.

use super::ranking::{by_rank, Candidate};
use super::vector_math::{exp_nonpositive, sum_exp_candidates, BLOCK_LEN, LANES};

/// Below this many undecided candidates top-p sorts them instead of halving further.
const TOP_P_SORT_BELOW: usize = 64;
/// Depths below the largest logit (in nats) at which [`nucleus_bound`] measures the mass above;
/// the nucleus of a peaked distribution usually lies within the first one or two.
const NUCLEUS_PROBE_DEPTHS: [f32; 5] = [1.0, 2.0, 4.0, 8.0, 16.0];
/// Number of mass accumulators in [`nucleus_bound`]: one per probe, plus the whole field.
const NUCLEUS_LEVELS: usize = NUCLEUS_PROBE_DEPTHS.len() + 1;

/// Divides every logit by `temperature`, saturating at `f32::MAX` so that later `exp(l - max)`
/// arithmetic never meets `inf - inf`.
pub(super) fn scale_by_temperature(logits: &mut [f32], temperature: f32) {
    if temperature == 1.0 {
        return;
    }
    for logit in logits.iter_mut() {
        *logit = (*logit / temperature).min(f32::MAX);
    }
}

/// The smallest logit min-p keeps: `p_i >= min_p * p_max` is `l_i >= l_max + ln(min_p)` in log
/// space, which needs no softmax. `-inf` when min-p is off.
pub(super) fn min_p_floor(max_logit: f32, min_p: f32) -> f32 {
    if min_p > 0.0 {
        // Clamping to 1 keeps the most likely token even for an unvalidated min_p above 1.
        max_logit + min_p.min(1.0).ln()
    } else {
        f32::NEG_INFINITY
    }
}

/// Fills `candidates` with the `top_k` highest-ranked tokens (lower id first on ties) among those
/// with a logit of at least `floor`; `-inf` logits are never candidates.
///
/// One pass with a buffer of up to twice `top_k`: a token enters only if it beats the worst kept
/// one, and a full buffer is cut back to `top_k` by a linear-time selection. Ids arrive in increasing
/// order, so a later token equal to the worst kept one ranks below it and is rejected.
pub(super) fn collect_top_k(
    logits: &[f32],
    floor: f32,
    top_k: usize,
    candidates: &mut Vec<Candidate>,
) {
    candidates.clear();
    if top_k == 0 {
        return;
    }
    let buffer_len = top_k.saturating_mul(2).max(top_k + LANES * 8);
    let mut worst_kept = f32::NEG_INFINITY;
    for (token_id, &logit) in (0u32..).zip(logits) {
        if logit > worst_kept && logit >= floor {
            candidates.push(Candidate { logit, token_id });
            if candidates.len() >= buffer_len {
                keep_best(candidates, top_k);
                worst_kept = candidates[top_k - 1].logit;
            }
        }
    }
    keep_best(candidates, top_k);
}

/// Cuts `candidates` to its `count` highest-ranked, leaving the worst of them last.
fn keep_best(candidates: &mut Vec<Candidate>, count: usize) {
    if count > 0 && candidates.len() > count {
        candidates.select_nth_unstable_by(count - 1, by_rank);
        candidates.truncate(count);
    }
}

/// What one pass over the vocabulary tells top-p before any candidate is listed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct NucleusBound {
    /// Total weight `sum(exp(l - max_logit))` of the tokens at or above the min-p floor.
    pub(super) total_weight: f64,
    /// A logit such that the tokens at or above it already hold `top_p` of the total weight, so
    /// the nucleus lies among them.
    pub(super) floor: f32,
}

/// Measures, in one vectorised pass, the weight above a few depths below `max_logit`, and returns
/// the shallowest depth whose tokens already reach `top_p` of the weight above `floor`.
pub(super) fn nucleus_bound(
    logits: &[f32],
    max_logit: f32,
    floor: f32,
    top_p: f32,
) -> NucleusBound {
    let mut levels = [floor; NUCLEUS_LEVELS];
    for (level, depth) in levels.iter_mut().zip(NUCLEUS_PROBE_DEPTHS) {
        *level = (max_logit - depth).max(floor);
    }
    let mut masses = [0f64; NUCLEUS_LEVELS];
    for block in logits.chunks(BLOCK_LEN) {
        let mut lanes = [[0f32; LANES]; NUCLEUS_LEVELS];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            // Weights first, then one masked add per level: both loops are lane-wise and vectorise.
            let mut weights = [0f32; LANES];
            for (weight, &logit) in weights.iter_mut().zip(chunk) {
                *weight = exp_nonpositive(logit - max_logit);
            }
            for (level_lanes, &level) in lanes.iter_mut().zip(&levels) {
                for ((lane, &weight), &logit) in level_lanes.iter_mut().zip(&weights).zip(chunk) {
                    *lane += if logit >= level { weight } else { 0.0 };
                }
            }
        }
        for (mass, level_lanes) in masses.iter_mut().zip(&lanes) {
            *mass += level_lanes.iter().map(|&lane| f64::from(lane)).sum::<f64>();
        }
        for &logit in tail {
            let weight = f64::from(exp_nonpositive(logit - max_logit));
            for (mass, &level) in masses.iter_mut().zip(&levels) {
                if logit >= level {
                    *mass += weight;
                }
            }
        }
    }
    let total_weight = masses[NUCLEUS_LEVELS - 1];
    let target_weight = f64::from(top_p) * total_weight;
    let floor = masses
        .iter()
        .zip(levels)
        .find(|&(&mass, _)| mass >= target_weight)
        .map_or(floor, |(_, level)| level);
    NucleusBound {
        total_weight,
        floor,
    }
}

/// Fills `candidates` with every token whose logit is at least `floor` (and not `-inf`).
pub(super) fn collect_at_least(logits: &[f32], floor: f32, candidates: &mut Vec<Candidate>) {
    candidates.clear();
    candidates.extend(
        (0u32..)
            .zip(logits)
            .filter(|&(_, &logit)| logit >= floor && logit > f32::NEG_INFINITY)
            .map(|(token_id, &logit)| Candidate { logit, token_id }),
    );
}

/// Keeps the smallest set of highest-ranked candidates whose weight reaches `top_p` of
/// `total_weight` (the weight of every token still allowed, which may include tokens not listed
/// in `candidates` because [`nucleus_bound`] already excluded them); `top_p >= 1` keeps all.
///
/// Halving search: select the more likely half of the undecided range; either the nucleus ends
/// inside it (drop the rest) or all of it belongs to the nucleus (keep it and look in the other
/// half for the remaining weight). O(n) on average; only the last few dozen are sorted.
pub(super) fn keep_top_p(
    candidates: &mut Vec<Candidate>,
    max_logit: f32,
    total_weight: f64,
    top_p: f32,
) {
    if top_p.is_nan() || top_p >= 1.0 || candidates.len() <= 1 {
        return;
    }
    let mut missing_weight = f64::from(top_p) * total_weight;
    // Invariant: candidates[..kept] are in the nucleus and rank above candidates[kept..undecided],
    // which rank above candidates[undecided..], none of which are in it.
    let mut kept = 0;
    let mut undecided = candidates.len();
    while undecided - kept > TOP_P_SORT_BELOW {
        let half = (undecided - kept) / 2;
        candidates[kept..undecided].select_nth_unstable_by(half - 1, by_rank);
        let upper_weight = sum_exp_candidates(&candidates[kept..kept + half], max_logit);
        if upper_weight >= missing_weight {
            undecided = kept + half;
        } else {
            missing_weight -= upper_weight;
            kept += half;
        }
    }
    candidates[kept..undecided].sort_unstable_by(by_rank);
    for position in kept..undecided {
        missing_weight -= f64::from(exp_nonpositive(candidates[position].logit - max_logit));
        if missing_weight <= 0.0 {
            candidates.truncate(position + 1);
            return;
        }
    }
    // Rounding left the weight just short of the target: everything still undecided is kept.
    candidates.truncate(undecided);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(candidates: &[Candidate]) -> Vec<u32> {
        let mut ids: Vec<u32> = candidates.iter().map(|c| c.token_id).collect();
        ids.sort_unstable();
        ids
    }

    fn all(logits: &[f32]) -> Vec<Candidate> {
        let mut candidates = Vec::new();
        collect_at_least(logits, f32::NEG_INFINITY, &mut candidates);
        candidates
    }

    /// Logits of the distribution [0.5, 0.3, 0.15, 0.05] (ln of each probability).
    fn hand_distribution() -> Vec<f32> {
        [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect()
    }

    /// The nucleus by full sort, for comparison.
    fn reference_nucleus(logits: &[f32], top_p: f32) -> Vec<u32> {
        let mut ranked = all(logits);
        ranked.sort_by(by_rank);
        let max_logit = ranked[0].logit;
        let weights: Vec<f64> = ranked
            .iter()
            .map(|c| f64::from(c.logit - max_logit).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let len = 1 + weights
            .iter()
            .position(|w| {
                cumulative += w;
                cumulative >= f64::from(top_p) * total
            })
            .unwrap_or(weights.len() - 1);
        ids(&ranked[..len])
    }

    fn nucleus(logits: &[f32], top_p: f32) -> Vec<u32> {
        let max_logit = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let bound = nucleus_bound(logits, max_logit, f32::NEG_INFINITY, top_p);
        let mut candidates = Vec::new();
        collect_at_least(logits, bound.floor, &mut candidates);
        keep_top_p(&mut candidates, max_logit, bound.total_weight, top_p);
        ids(&candidates)
    }

    #[test]
    fn top_p_keeps_minimal_nucleus() {
        let logits = hand_distribution();
        let cases = [
            (0.4, vec![0]),
            (0.75, vec![0, 1]),
            (0.85, vec![0, 1, 2]),
            (0.99, vec![0, 1, 2, 3]),
        ];
        for (top_p, expected) in cases {
            assert_eq!(nucleus(&logits, top_p), expected, "top_p {top_p}");
        }
    }

    #[test]
    fn top_p_over_many_equal_candidates_keeps_lowest_ids() {
        // 300 equal tokens: top_p 0.5 needs 150 of them, found by halving past the sort threshold;
        // ties resolve to the lowest ids.
        assert_eq!(nucleus(&[0.0f32; 300], 0.5), (0..150).collect::<Vec<u32>>());
    }

    #[test]
    fn top_p_halving_and_bound_match_a_full_sort() {
        // A flat spread (nucleus far below every probe depth) and a peaked one (nucleus within the
        // first probe), each at several top_p.
        let spreads = [9_000.0f32, 500.0];
        for spread in spreads {
            let logits: Vec<f32> = (0..5_000u64)
                .map(|i| ((i * 2_654_435_761) % 100_003) as f32 / spread)
                .collect();
            for top_p in [0.1f32, 0.5, 0.9, 0.97] {
                let expected = reference_nucleus(&logits, top_p);
                assert_eq!(
                    nucleus(&logits, top_p),
                    expected,
                    "spread {spread} top_p {top_p}"
                );
            }
        }
    }

    #[test]
    fn nucleus_bound_picks_shallowest_sufficient_depth() {
        // Token 0 holds e^0 / (e^0 + 3 e^-3) = 0.87 of the weight; the rest sit 3 nats lower.
        let logits = [0.0f32, -3.0, -3.0, -3.0];
        let bound = nucleus_bound(&logits, 0.0, f32::NEG_INFINITY, 0.8);
        assert_eq!(bound.floor, -1.0);
        assert!((bound.total_weight - (1.0 + 3.0 * (-3f64).exp())).abs() < 1e-6);
        let wide = nucleus_bound(&logits, 0.0, f32::NEG_INFINITY, 0.9);
        assert_eq!(wide.floor, -4.0);
        // The min-p floor caps how deep the bound goes and what the total counts.
        let capped = nucleus_bound(&logits, 0.0, -0.5, 0.9);
        assert_eq!(capped.floor, -0.5);
        assert!((capped.total_weight - 1.0).abs() < 1e-6);
    }

    #[test]
    fn min_p_floor_in_log_space() {
        let logits = hand_distribution();
        let mut candidates = Vec::new();
        // 0.2 * 0.5 = 0.1: keeps 0.5, 0.3 and 0.15, drops 0.05.
        collect_at_least(&logits, min_p_floor(logits[0], 0.2), &mut candidates);
        assert_eq!(ids(&candidates), vec![0, 1, 2]);
        // 0.7 * 0.5 = 0.35: only the top token.
        collect_at_least(&logits, min_p_floor(logits[0], 0.7), &mut candidates);
        assert_eq!(ids(&candidates), vec![0]);
        assert_eq!(min_p_floor(1.0, 0.0), f32::NEG_INFINITY);
        collect_at_least(
            &[1.0, f32::NEG_INFINITY, 0.0],
            f32::NEG_INFINITY,
            &mut candidates,
        );
        assert_eq!(ids(&candidates), vec![0, 2]);
    }

    #[test]
    fn top_k_keeps_highest_with_low_id_ties() {
        let logits = [1.0f32, 4.0, 4.0, 2.0, 4.0];
        let mut candidates = Vec::new();
        collect_top_k(&logits, f32::NEG_INFINITY, 2, &mut candidates);
        assert_eq!(ids(&candidates), vec![1, 2]);
        collect_top_k(&logits, 1.5, 50, &mut candidates);
        assert_eq!(ids(&candidates), vec![1, 2, 3, 4]);
    }

    #[test]
    fn top_k_buffer_cuts_match_a_full_sort() {
        // Ascending logits are the worst case for the buffer: every token enters it.
        for logits in [
            (0..5_000).map(|i| i as f32 / 7.0).collect::<Vec<f32>>(),
            (0..5_000u64)
                .map(|i| ((i * 2_654_435_761) % 97) as f32)
                .collect(),
        ] {
            for top_k in [1usize, 7, 100, 4_999] {
                let mut expected = all(&logits);
                expected.sort_by(by_rank);
                expected.truncate(top_k);
                let mut candidates = Vec::new();
                collect_top_k(&logits, f32::NEG_INFINITY, top_k, &mut candidates);
                assert_eq!(ids(&candidates), ids(&expected), "top_k {top_k}");
            }
        }
    }

    #[test]
    fn temperature_saturates_instead_of_overflowing() {
        let mut logits = vec![3.0e38f32, 1.0, f32::NEG_INFINITY];
        scale_by_temperature(&mut logits, 0.5);
        assert_eq!(logits, vec![f32::MAX, 2.0, f32::NEG_INFINITY]);
    }
}
