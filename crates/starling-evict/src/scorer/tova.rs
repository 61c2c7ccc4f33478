//! TOVA (Oren et al., 2024; kvpress's `TOVAPress`): the newest query's attention decides. Per KV
//! head the score is the summed softmax(q·k/√d) of the group's query heads for the last token
//! (SnapKV's window score with a one-token window and no pooling); the layer keeps one set of
//! tokens for all its heads, chosen by the heads' mean ([`Scorer::layer_wide`]), which ranks as
//! the mean over every query head does in TOVA and kvpress.

use super::snapkv::window_attention_scores;
use super::Scorer;
use crate::{EvictError, ScoreInput};

/// The TOVA scorer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tova;

impl Scorer for Tova {
    fn name(&self) -> &'static str {
        "tova"
    }

    fn needs_queries(&self) -> bool {
        true
    }

    fn observation_window_tokens(&self, _window_tokens: usize) -> usize {
        1
    }

    fn layer_wide(&self) -> bool {
        true
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        let window = input.queries.map(|q| q.window_tokens());
        if window.is_some_and(|w| w != 1) {
            return Err(EvictError::Shape(format!(
                "tova reads the newest query only, got a window of {window:?}"
            )));
        }
        window_attention_scores(input, 1, "tova")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HeadKeys, WindowQueries};

    #[test]
    fn hand_computed() {
        // head_dim 1 (scale 1), keys [0, ln 3, 0, 0], group 2 with queries 1 and 0 at the last
        // token (it sees all four keys). Query 1: weights 1, 3, 1, 1 over 6 → token 1 gets 1/2,
        // the others 1/6. Query 0: uniform 1/4. Sum: 5/12, 3/4, 5/12, and the last token +∞. No
        // pooling, so token 0 and 2 keep their own weight.
        let keys = [0.0, 3.0f32.ln(), 0.0, 0.0];
        let q = [1.0f32, 0.0];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: Some(WindowQueries::new(&q, 1, 2, 1).unwrap()),
            layer: 0,
            kv_head: 0,
        };
        let s = Tova.score(&input).unwrap();
        for (got, want) in s[..3].iter().zip([5.0 / 12.0, 0.75, 5.0 / 12.0]) {
            assert!((got - want).abs() < 1e-6, "{s:?}");
        }
        assert_eq!(s[3], f32::INFINITY);
        assert_eq!(Tova.observation_window_tokens(32), 1);
    }

    #[test]
    fn a_longer_window_is_refused() {
        let keys = [0.0f32; 4];
        let q = [1.0f32; 2];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: Some(WindowQueries::new(&q, 2, 1, 1).unwrap()),
            layer: 0,
            kv_head: 0,
        };
        assert!(Tova.score(&input).is_err());
    }
}
