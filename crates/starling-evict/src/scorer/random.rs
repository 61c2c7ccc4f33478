//! Random: seeded uniform scores, the control every real scorer must beat.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Scorer;
use crate::{EvictError, ScoreInput};

/// The random scorer; the same seed, layer, head and length always give the same scores.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomScorer {
    /// Base seed (from the configuration).
    pub seed: u64,
}

impl Scorer for RandomScorer {
    fn name(&self) -> &'static str {
        "random"
    }

    fn needs_keys(&self) -> bool {
        false
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        let n = input.keys.len_tokens();
        // Distinct streams per layer, head and length, so heads do not evict the same tokens and
        // repeated compressions do not replay one pattern.
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(((input.layer as u64) << 40) ^ ((input.kv_head as u64) << 24) ^ n as u64);
        Ok((0..n).map(|_| rng.gen::<f32>()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadKeys;

    fn input(keys: &[f32], kv_head: usize) -> ScoreInput<'_> {
        ScoreInput {
            keys: HeadKeys::new(keys, 1).unwrap(),
            queries: None,
            layer: 0,
            kv_head,
        }
    }

    #[test]
    fn seeded_uniform_and_per_head() {
        let keys = [0.0; 64];
        let a = RandomScorer { seed: 1 }.score(&input(&keys, 0)).unwrap();
        assert_eq!(a, RandomScorer { seed: 1 }.score(&input(&keys, 0)).unwrap());
        assert_ne!(a, RandomScorer { seed: 2 }.score(&input(&keys, 0)).unwrap());
        assert_ne!(a, RandomScorer { seed: 1 }.score(&input(&keys, 1)).unwrap());
        assert!(a.iter().all(|s| (0.0..1.0).contains(s)));
        // Not constant: a uniform draw of 64 values spans most of [0, 1).
        let (lo, hi) = a
            .iter()
            .fold((1.0f32, 0.0f32), |(l, h), &s| (l.min(s), h.max(s)));
        assert!(hi - lo > 0.5, "{lo}..{hi}");
    }
}
