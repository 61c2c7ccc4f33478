//! Scorers: one module each. A scorer ranks one KV head's tokens; higher = keep.

mod keydiff;
mod knorm;
mod random;
mod snapkv;
mod streaming_llm;
mod tova;

pub use keydiff::KeyDiff;
pub use knorm::KNorm;
pub use random::RandomScorer;
pub use snapkv::SnapKv;
pub use streaming_llm::StreamingLlm;
pub use tova::Tova;

use crate::{CompressionConfig, CompressionMethod, EvictError, ScoreInput};

/// Ranks the tokens of one KV head for eviction.
pub trait Scorer: Send + Sync {
    /// The method's name (as in [`CompressionMethod::name`]).
    fn name(&self) -> &'static str;

    /// Whether [`score`](Self::score) needs [`ScoreInput::queries`].
    fn needs_queries(&self) -> bool {
        false
    }

    /// Whether [`score`](Self::score) reads the key values (StreamingLLM and Random only need
    /// the token count, so a caller may pass zeros and skip copying keys off the device).
    fn needs_keys(&self) -> bool {
        true
    }

    /// How many of the newest queries [`score`](Self::score) reads, given the configuration's
    /// `window_tokens` (the observation window; unused unless [`needs_queries`](Self::needs_queries)).
    fn observation_window_tokens(&self, window_tokens: usize) -> usize {
        window_tokens
    }

    /// Whether every KV head of a layer keeps the same tokens, chosen by the heads' mean score
    /// ([`crate::select_keep_layer_wide`]), rather than each head its own.
    fn layer_wide(&self) -> bool {
        false
    }

    /// One score per token of `input.keys`, higher = keep.
    fn score(&self, input: &ScoreInput<'_>) -> Result<Vec<f32>, EvictError>;
}

/// The scorer of a configuration; `None` when it never evicts.
pub fn scorer_for(config: &CompressionConfig) -> Option<Box<dyn Scorer>> {
    if !config.evicts() {
        return None;
    }
    Some(match config.method {
        CompressionMethod::None => return None,
        CompressionMethod::KeyDiff => Box::new(KeyDiff),
        CompressionMethod::KNorm => Box::new(KNorm),
        CompressionMethod::StreamingLlm => Box::new(StreamingLlm),
        CompressionMethod::Random => Box::new(RandomScorer { seed: config.seed }),
        CompressionMethod::SnapKv => Box::new(SnapKv::default()),
        CompressionMethod::Tova => Box::new(Tova),
    })
}

/// L2 norm of a vector.
pub(crate) fn l2_norm(x: &[f32]) -> f32 {
    x.iter().map(|v| v * v).sum::<f32>().sqrt()
}

/// Dot product.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scorer_for_matches_the_method() {
        for m in CompressionMethod::ALL {
            let config = CompressionConfig {
                method: m,
                ratio: 0.5,
                ..CompressionConfig::default()
            };
            match scorer_for(&config) {
                None => assert_eq!(m, CompressionMethod::None),
                Some(s) => {
                    assert_eq!(s.name(), m.name());
                    let windowed = matches!(m, CompressionMethod::SnapKv | CompressionMethod::Tova);
                    assert_eq!(s.needs_queries(), windowed);
                    assert_eq!(s.layer_wide(), m == CompressionMethod::Tova);
                }
            }
        }
        let zero = CompressionConfig {
            method: CompressionMethod::KeyDiff,
            ..CompressionConfig::default()
        };
        assert!(scorer_for(&zero).is_none());
    }
}
