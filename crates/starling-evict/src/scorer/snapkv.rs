//! SnapKV: the prompt's last queries (the observation window) reveal which earlier tokens
//! matter. Score = sum over window queries and the KV head's query group of causal
//! softmax(q·k/√d) weights, max-pooled along the sequence (kernel 7) so a kept token brings its
//! neighbours, as in the paper. Tokens inside the observation window score +∞ (they are the
//! queries themselves, and selection's recent window protects them anyway).

use super::{dot, Scorer};
use crate::{EvictError, ScoreInput};

/// The SnapKV scorer.
#[derive(Clone, Copy, Debug)]
pub struct SnapKv {
    /// Max-pool width in tokens (odd; the paper's 7 by default).
    pub pool_kernel_tokens: usize,
}

impl Default for SnapKv {
    fn default() -> Self {
        Self {
            pool_kernel_tokens: 7,
        }
    }
}

impl Scorer for SnapKv {
    fn name(&self) -> &'static str {
        "snapkv"
    }

    fn needs_queries(&self) -> bool {
        true
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError> {
        window_attention_scores(input, self.pool_kernel_tokens, "snapkv")
    }
}

/// The observation-window score shared by SnapKV and TOVA: per token, the sum over the window
/// queries and the KV head's query group of the causal softmax(q·k/√d) weights, max-pooled over
/// `pool_kernel_tokens` (1: no pooling) within the tokens before the window; window tokens score
/// +∞. Backends compute the same where the cache lives (`Backend::window_scores`, whose CPU
/// reference repeats these f32 operations in this order).
pub(crate) fn window_attention_scores(
    input: &ScoreInput<'_>,
    pool_kernel_tokens: usize,
    method: &str,
) -> Result<Vec<f32>, EvictError> {
    let queries = input.queries.ok_or_else(|| {
        EvictError::Shape(format!("{method} needs the window queries of the KV head"))
    })?;
    let keys = input.keys;
    let (n, hd) = (keys.len_tokens(), keys.head_dim());
    let window = queries.window_tokens();
    if window > n {
        return Err(EvictError::Shape(format!(
            "{method}: window of {window} queries over {n} tokens"
        )));
    }
    let key_rows: Vec<&[f32]> = keys.rows().collect();
    let scale = 1.0 / (hd as f32).sqrt();
    let mut attention = vec![0.0f32; n];
    let mut logits = Vec::with_capacity(n);
    for j in 0..window {
        // Window query j is token n - window + j; causally it sees tokens 0 ..= that.
        let visible = n - window + j + 1;
        for q in queries.token(j).chunks_exact(hd) {
            logits.clear();
            logits.extend(key_rows[..visible].iter().map(|k| dot(q, k) * scale));
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let denom: f32 = logits.iter().map(|l| (l - max).exp()).sum();
            for (a, l) in attention.iter_mut().zip(&logits) {
                *a += (l - max).exp() / denom;
            }
        }
    }
    let prefix = n - window;
    let half = pool_kernel_tokens / 2;
    let mut scores: Vec<f32> = (0..prefix)
        .map(|i| {
            let lo = i.saturating_sub(half);
            let hi = (i + half + 1).min(prefix);
            attention[lo..hi]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    scores.resize(n, f32::INFINITY);
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HeadKeys, WindowQueries};

    #[test]
    fn hand_computed() {
        // head_dim 1 (scale 1), keys [0, ln 3, 0, 0, 0, 0, 0, 0, 0, 0], 10 tokens; one window
        // query q = 1 (group 1) at token 9, seeing all 10 keys. Weights: e^{ln 3} = 3 for token
        // 1, 1 for the other nine: total 12 → token 1 gets 3/12 = 0.25, the others 1/12.
        // Pooling (kernel 7, half-width 3) over the 9-token prefix: tokens 0..=4 see token 1
        // → 0.25; tokens 5..=8 → 1/12. Token 9 (the window) → +∞.
        let mut keys = [0.0f32; 10];
        keys[1] = 3.0f32.ln();
        let q = [1.0f32];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: Some(WindowQueries::new(&q, 1, 1, 1).unwrap()),
            layer: 0,
            kv_head: 0,
        };
        let s = SnapKv::default().score(&input).unwrap();
        for (i, got) in s.iter().enumerate() {
            let want = match i {
                0..=4 => 0.25,
                5..=8 => 1.0 / 12.0,
                _ => f32::INFINITY,
            };
            assert!(
                got == &want || (got - want).abs() < 1e-6,
                "token {i}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn sums_over_group_heads_and_window_queries_causally() {
        // head_dim 1, 3 keys all 0 → uniform weights. Window 2 (tokens 1, 2), group 2.
        // Query at token 1 sees tokens 0, 1: 1/2 each, twice (group) → token 0: 1, token 1: 1.
        // Query at token 2 sees all three: 1/3 each, twice → +2/3 each.
        // Raw: token 0 = 1 + 2/3 = 5/3. Prefix is token 0 only → score 5/3; tokens 1, 2 → +∞.
        let keys = [0.0f32; 3];
        let q = [0.3f32, -2.0, 1.0, 4.0];
        let input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: Some(WindowQueries::new(&q, 2, 2, 1).unwrap()),
            layer: 0,
            kv_head: 0,
        };
        let s = SnapKv::default().score(&input).unwrap();
        assert!((s[0] - 5.0 / 3.0).abs() < 1e-6, "{s:?}");
        assert_eq!(&s[1..], &[f32::INFINITY, f32::INFINITY]);
    }

    #[test]
    fn missing_or_oversized_window_is_an_error() {
        let keys = [0.0f32; 2];
        let mut input = ScoreInput {
            keys: HeadKeys::new(&keys, 1).unwrap(),
            queries: None,
            layer: 0,
            kv_head: 0,
        };
        assert!(SnapKv::default().score(&input).is_err());
        let q = [1.0f32; 3];
        input.queries = Some(WindowQueries::new(&q, 3, 1, 1).unwrap());
        assert!(SnapKv::default().score(&input).is_err());
    }
}
