//! Which tokens each KV head keeps: protected sinks and recent window always, the rest by score.

use rayon::prelude::*;

use crate::BackendError;

/// Scores (heads × tokens) from which [`select_keep`] selects the heads in parallel: below it a
/// thread hand-off costs more than it saves (a head of 2k tokens selects in ~25 µs; the engine's GQA layers hold 4–8 heads).
const PARALLEL_MIN_SCORES: usize = 8 * 1024;

/// Tokens protected in a sequence of `n_tokens`: the first `sink_tokens` and the last
/// `window_tokens` (counted once where they overlap).
pub fn protected_count(n_tokens: usize, sink_tokens: usize, window_tokens: usize) -> usize {
    sink_tokens.saturating_add(window_tokens).min(n_tokens)
}

/// Tokens kept at eviction ratio `ratio`: `n - floor(ratio * (n - protected))`, never below the
/// protected count (and never above `n`).
pub fn keep_count(n_tokens: usize, ratio: f64, sink_tokens: usize, window_tokens: usize) -> usize {
    let protected = protected_count(n_tokens, sink_tokens, window_tokens);
    let evictable = n_tokens - protected;
    let ratio = if ratio.is_finite() {
        ratio.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // `as` saturates; the clamp keeps the product within `evictable`.
    let evicted = ((ratio * evictable as f64).floor() as usize).min(evictable);
    n_tokens - evicted
}

fn is_protected(i: usize, n_tokens: usize, sink_tokens: usize, window_tokens: usize) -> bool {
    i < sink_tokens || i + window_tokens >= n_tokens
}

/// Per KV head, the ascending indices of the tokens kept: every protected token (first
/// `sink_tokens`, last `window_tokens`), then the highest-scoring others (ties go to the lower
/// index; NaN ranks lowest) until `keep_tokens` — raised to the protected count if below it,
/// capped at `n_tokens` — are kept. Every head keeps the same count. Linear in `n_tokens` per
/// head (a partial selection, then a sort of the kept indices).
pub fn select_keep(
    scores_per_head: &[Vec<f32>],
    n_tokens: usize,
    keep_tokens: usize,
    sink_tokens: usize,
    window_tokens: usize,
) -> Result<Vec<Vec<u32>>, BackendError> {
    let keep = checked_keep(n_tokens, keep_tokens, sink_tokens, window_tokens)?;
    for (head, scores) in scores_per_head.iter().enumerate() {
        check_len(head, scores, n_tokens)?;
    }
    let one = |scores: &Vec<f32>| select_one(scores, n_tokens, keep, sink_tokens, window_tokens);
    // Heads are independent: the same indices whichever thread selects them. The compaction
    // runs on the engine thread between steps, so a wide layer (MHA: 32 heads) is worth
    // spreading over the host's cores.
    let num_scores = n_tokens.saturating_mul(scores_per_head.len());
    Ok(
        if scores_per_head.len() > 1 && num_scores >= PARALLEL_MIN_SCORES {
            scores_per_head.par_iter().map(one).collect()
        } else {
            scores_per_head.iter().map(one).collect()
        },
    )
}

/// As [`select_keep`], but one choice for the whole layer: the tokens are ranked by the mean of
/// the heads' scores, and every head keeps the same indices. A layer whose heads share one
/// stored row per token (a value latent) can only drop a token from all heads at once.
pub fn select_keep_layer_wide(
    scores_per_head: &[Vec<f32>],
    n_tokens: usize,
    keep_tokens: usize,
    sink_tokens: usize,
    window_tokens: usize,
) -> Result<Vec<Vec<u32>>, BackendError> {
    let keep = checked_keep(n_tokens, keep_tokens, sink_tokens, window_tokens)?;
    let mut mean = vec![0.0f32; n_tokens];
    for (head, scores) in scores_per_head.iter().enumerate() {
        check_len(head, scores, n_tokens)?;
        for (m, s) in mean.iter_mut().zip(scores) {
            *m += s;
        }
    }
    let heads = scores_per_head.len().max(1) as f32;
    mean.iter_mut().for_each(|m| *m /= heads);
    let kept = select_one(&mean, n_tokens, keep, sink_tokens, window_tokens);
    Ok(vec![kept; scores_per_head.len()])
}

/// The kept count (see [`select_keep`]) after checking that indices fit `u32`.
fn checked_keep(
    n_tokens: usize,
    keep_tokens: usize,
    sink_tokens: usize,
    window_tokens: usize,
) -> Result<usize, BackendError> {
    if u32::try_from(n_tokens).is_err() {
        return Err(BackendError::Shape(format!(
            "{n_tokens} tokens exceed u32 indices"
        )));
    }
    Ok(keep_tokens
        .max(protected_count(n_tokens, sink_tokens, window_tokens))
        .min(n_tokens))
}

fn check_len(head: usize, scores: &[f32], n_tokens: usize) -> Result<(), BackendError> {
    if scores.len() == n_tokens {
        return Ok(());
    }
    Err(BackendError::Shape(format!(
        "head {head} has {} scores for {n_tokens} tokens",
        scores.len()
    )))
}

/// One head's kept indices, ascending; `keep` is at least the protected count.
fn select_one(
    scores: &[f32],
    n_tokens: usize,
    keep: usize,
    sink_tokens: usize,
    window_tokens: usize,
) -> Vec<u32> {
    let protected = |i: usize| is_protected(i, n_tokens, sink_tokens, window_tokens);
    let room = keep - protected_count(n_tokens, sink_tokens, window_tokens).min(keep);
    // Highest score first, equal scores in index order, NaN lowest, as one integer per token
    // (unique, so exactly `room` candidates rank at or above the room-th): the selection is
    // a partial selection over integers and a scan in index order, with no sort — compaction
    // runs it for every KV head of every layer, inside a serving step.
    let key = |i: usize| rank_key(scores[i], i);
    let threshold = if room == 0 {
        None
    } else {
        let mut keys: Vec<u64> = (0..n_tokens).filter(|&i| !protected(i)).map(key).collect();
        if room >= keys.len() {
            Some(0)
        } else {
            let (_, nth, _) = keys.select_nth_unstable_by(room - 1, |a, b| b.cmp(a));
            Some(*nth)
        }
    };
    (0..n_tokens)
        .filter(|&i| protected(i) || threshold.is_some_and(|t| key(i) >= t))
        .map(|i| i as u32)
        .collect()
}

/// A token's place in the eviction order as one integer: the score's bits made monotone
/// (`f32::total_cmp`'s order; NaN counted as −∞) above the index reversed, so a larger key is
/// a better token and equal scores favour the lower index.
fn rank_key(score: f32, index: usize) -> u64 {
    let score = if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score
    };
    let bits = score.to_bits();
    let monotone = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(monotone) << 32) | u64::from(u32::MAX - index as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wide_layers_select_in_parallel_what_each_head_selects_alone() {
        // 32 heads × 3000 tokens: above the parallel threshold; each head alone is below it.
        let n = 3000;
        let heads: Vec<Vec<f32>> = (0..32u32)
            .map(|h| {
                (0..n as u32)
                    .map(|i| {
                        ((i.wrapping_mul(2_654_435_761) ^ h.wrapping_mul(40_503)) % 1000) as f32
                    })
                    .collect()
            })
            .collect();
        assert!(n * heads.len() >= PARALLEL_MIN_SCORES && n < PARALLEL_MIN_SCORES);
        let together = select_keep(&heads, n, 1200, 4, 32).unwrap();
        for (h, scores) in heads.iter().enumerate() {
            let alone = select_keep(std::slice::from_ref(scores), n, 1200, 4, 32).unwrap();
            assert_eq!(together[h], alone[0], "head {h}");
        }
    }

    #[test]
    fn keep_count_follows_the_formula() {
        // n = 100, protected = 4 + 32 = 36, evictable 64: r = 0.5 evicts 32, r = 0.75 evicts 48.
        assert_eq!(keep_count(100, 0.5, 4, 32), 68);
        assert_eq!(keep_count(100, 0.75, 4, 32), 52);
        // floor: 0.3 * 64 = 19.2 → 19 evicted.
        assert_eq!(keep_count(100, 0.3, 4, 32), 81);
        assert_eq!(keep_count(100, 0.0, 4, 32), 100);
        // Fewer tokens than protected: nothing is evicted.
        assert_eq!(keep_count(20, 0.9, 4, 32), 20);
        assert_eq!(protected_count(20, 4, 32), 20);
    }

    #[test]
    fn selects_by_score_with_ties_to_lower_index() {
        // 8 tokens, sink 1, window 2: tokens 0, 6, 7 protected; 5 more kept out of 1..=5 → 2
        // of them with keep 5. Head 0 scores: 3 and 4 are best. Head 1: 1, 2, 5 tie at 1.0 →
        // lower indices 1 and 2 win.
        let scores = vec![
            vec![9.0, 0.1, 0.2, 0.9, 0.8, 0.3, -5.0, -5.0],
            vec![0.0, 1.0, 1.0, 0.5, f32::NAN, 1.0, 0.0, 0.0],
        ];
        let kept = select_keep(&scores, 8, 5, 1, 2).unwrap();
        assert_eq!(kept, vec![vec![0, 3, 4, 6, 7], vec![0, 1, 2, 6, 7]]);
    }

    #[test]
    fn wrong_score_count_is_an_error() {
        assert!(select_keep(&[vec![1.0; 3]], 4, 2, 0, 0).is_err());
        assert!(select_keep_layer_wide(&[vec![1.0; 4], vec![1.0; 3]], 4, 2, 0, 0).is_err());
    }

    #[test]
    fn layer_wide_selection_ranks_by_the_mean_and_shares_the_choice() {
        // 6 tokens, sink 1, window 1: tokens 0 and 5 protected, keep 4 → 2 of tokens 1..=4.
        // Head means: 1 → 0.5, 2 → 0.45, 3 → 0.6, 4 → 0.1: tokens 1 and 3, although head 1
        // alone would keep 2 and 4.
        let scores = vec![
            vec![0.0, 1.0, 0.0, 1.2, -0.6, 0.0],
            vec![0.0, 0.0, 0.9, 0.0, 0.8, 0.0],
        ];
        let kept = select_keep_layer_wide(&scores, 6, 4, 1, 1).unwrap();
        assert_eq!(kept, vec![vec![0, 1, 3, 5], vec![0, 1, 3, 5]]);
        assert_eq!(
            select_keep(&scores, 6, 4, 1, 1).unwrap()[1],
            vec![0, 2, 4, 5]
        );
    }

    proptest! {
        #[test]
        fn protected_tokens_kept_counts_equal_indices_ascending(
            n in 0usize..80,
            heads in 1usize..5,
            ratio in 0.0f64..1.0,
            sink in 0usize..10,
            window in 0usize..20,
            seed in any::<u64>(),
        ) {
            let mut state = seed;
            let scores: Vec<Vec<f32>> = (0..heads)
                .map(|_| (0..n).map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Few distinct values so ties are common.
                    ((state >> 60) as f32) - 8.0
                }).collect())
                .collect();
            let keep = keep_count(n, ratio, sink, window);
            let kept = select_keep(&scores, n, keep, sink, window).unwrap();
            prop_assert_eq!(kept.len(), heads);
            for head in &kept {
                prop_assert_eq!(head.len(), keep);
                prop_assert!(head.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(head.iter().all(|&i| (i as usize) < n));
                for i in 0..n {
                    if i < sink || i + window >= n {
                        prop_assert!(head.contains(&(i as u32)), "protected {} evicted", i);
                    }
                }
            }
        }

        #[test]
        fn partial_selection_keeps_what_a_full_sort_keeps(
            n in 0usize..120,
            keep in 0usize..120,
            seed in any::<u64>(),
        ) {
            let mut state = seed;
            let scores: Vec<f32> = (0..n).map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                match state >> 61 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    _ => ((state >> 58) as f32) - 16.0,
                }
            }).collect();
            let got = select_keep(std::slice::from_ref(&scores), n, keep, 2, 3).unwrap();
            // The definition: protected first, then a stable sort by descending rank.
            let keep = keep.max(protected_count(n, 2, 3)).min(n);
            let rank = |i: u32| if scores[i as usize].is_nan() { f32::NEG_INFINITY } else { scores[i as usize] };
            let (mut want, mut rest): (Vec<u32>, Vec<u32>) =
                (0..n as u32).partition(|&i| is_protected(i as usize, n, 2, 3));
            rest.sort_by(|&a, &b| rank(b).total_cmp(&rank(a)));
            let room = keep - want.len();
            want.extend_from_slice(&rest[..room]);
            want.sort_unstable();
            prop_assert_eq!(&got[0], &want);
        }

        #[test]
        fn ratio_zero_keeps_everything(n in 0usize..80, sink in 0usize..10, window in 0usize..20) {
            let scores = vec![(0..n).map(|i| -(i as f32)).collect::<Vec<_>>(); 2];
            let keep = keep_count(n, 0.0, sink, window);
            prop_assert_eq!(keep, n);
            let all: Vec<u32> = (0..n as u32).collect();
            let kept = select_keep(&scores, n, keep, sink, window).unwrap();
            prop_assert_eq!(kept, vec![all.clone(), all]);
        }
    }
}
