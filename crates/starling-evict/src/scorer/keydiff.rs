//! KeyDiff: keys whose direction differs most from the mean key direction carry the most
//! information, so score = −cos(k_i, mean of L2-normalised keys).

use super::{dot, l2_norm, Scorer};
use crate::{EvictError, ScoreInput};

/// The KeyDiff scorer.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyDiff;

impl Scorer for KeyDiff {
    fn name(&self) -> &'static str {
        "keydiff"
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        let keys = input.keys;
        let n = keys.len_tokens();
        let mut mean = vec![0.0f32; keys.head_dim()];
        for k in keys.rows() {
            let norm = l2_norm(k);
            // A zero key has no direction; it contributes nothing to the mean.
            if norm > 0.0 {
                for (m, v) in mean.iter_mut().zip(k) {
                    *m += v / norm;
                }
            }
        }
        if n > 0 {
            mean.iter_mut().for_each(|m| *m /= n as f32);
        }
        let mean_norm = l2_norm(&mean);
        Ok(keys
            .rows()
            .map(|k| {
                let denom = l2_norm(k) * mean_norm;
                if denom > 0.0 {
                    -dot(k, &mean) / denom
                } else {
                    0.0
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadKeys;

    #[test]
    fn hand_computed() {
        // Keys (3, 0), (0, 2), (1, 1). Normalised: (1, 0), (0, 1), (1/√2, 1/√2).
        // Mean m = ((1 + 0.70711) / 3, (0 + 1 + 0.70711) / 3) = (0.56904, 0.56904), a (1, 1)
        // direction. cos with (3,0) = 1/√2, with (0,2) = 1/√2, with (1,1) = 1.
        // Scores: −0.70711, −0.70711, −1.
        let keys = [3.0, 0.0, 0.0, 2.0, 1.0, 1.0];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 2).unwrap(),
            queries: None,
            layer: 0,
            kv_head: 0,
        };
        let s = KeyDiff.score(&input).unwrap();
        let want = [
            -std::f32::consts::FRAC_1_SQRT_2,
            -std::f32::consts::FRAC_1_SQRT_2,
            -1.0,
        ];
        for (got, want) in s.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{s:?}");
        }
    }

    #[test]
    fn outlier_direction_scores_highest_and_zero_keys_are_neutral() {
        // Three keys along +x and one along −x: mean ≈ (0.5, 0), so the −x key has cos −1 →
        // score +1, the +x keys score −1; a zero key scores 0.
        let keys = [1.0, 0.0, 2.0, 0.0, 5.0, 0.0, -1.0, 0.0, 0.0, 0.0];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 2).unwrap(),
            queries: None,
            layer: 0,
            kv_head: 0,
        };
        let s = KeyDiff.score(&input).unwrap();
        for (got, want) in s.iter().zip([-1.0, -1.0, -1.0, 1.0, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{s:?}");
        }
    }
}
