//! KNorm: low-norm keys attract the most attention (as kvpress's KnormPress), so
//! score = −‖k_i‖.

use super::{l2_norm, Scorer};
use crate::{EvictError, ScoreInput};

/// The KNorm scorer.
#[derive(Clone, Copy, Debug, Default)]
pub struct KNorm;

impl Scorer for KNorm {
    fn name(&self) -> &'static str {
        "knorm"
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        Ok(input.keys.rows().map(|k| -l2_norm(k)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadKeys;

    #[test]
    fn hand_computed() {
        // ‖(3, 4)‖ = 5, ‖(0, 1)‖ = 1, ‖(−6, 8)‖ = 10.
        let keys = [3.0, 4.0, 0.0, 1.0, -6.0, 8.0];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 2).unwrap(),
            queries: None,
            layer: 0,
            kv_head: 0,
        };
        assert_eq!(KNorm.score(&input).unwrap(), vec![-5.0, -1.0, -10.0]);
    }
}
