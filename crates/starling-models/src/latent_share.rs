//! Synthetic STAR-KV latent shapes: the stored ranks of a layer that keeps a given share of its
//! K/V elements, for performance and capacity runs of a latent cache at real shapes without a
//! checkpoint (`--load-format synthetic --synthetic-latent-share`).

use starling_kv::stored_rank;

use crate::llama::LatentRanks;
use crate::{ModelConfig, ModelError};

impl LatentRanks {
    /// The ranks of a latent layer of `config` keeping `share` (in `(0, 1]`) of its K/V
    /// elements: each KV head's key latent `stored_rank(round(head_dim · share))`, the value
    /// latent `stored_rank(round(num_kv_heads · head_dim · share))`, each at least one
    /// component before the padding to [`starling_kv::LATENT_RANK_MULTIPLE`] (so the stored
    /// share is at or slightly above `share`). At 0.5 on Llama 2 7B: 64 per head and 2048, the
    /// prior work's 50% shape.
    pub fn at_share(config: &ModelConfig, share: f64) -> Result<Self, ModelError> {
        if !(share.is_finite() && share > 0.0 && share <= 1.0) {
            return Err(ModelError::InvalidConfig(format!(
                "latent share {share} is outside (0, 1] (the share of each layer's K/V elements \
                 its latents keep)"
            )));
        }
        // `round` of a finite product of a width and a share in (0, 1]: within 0..=width.
        let rank_of = |width: usize| stored_rank(((width as f64 * share).round() as usize).max(1));
        Ok(Self {
            key_ranks: vec![rank_of(config.head_dim); config.num_kv_heads],
            value_rank: rank_of(config.kv_size()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_of_llama2_7b_is_the_prior_works_shape() {
        let config = crate::preset("llama2-7b").unwrap();
        let ranks = LatentRanks::at_share(&config, 0.5).unwrap();
        assert_eq!(ranks.key_ranks, vec![64; 32]);
        assert_eq!(ranks.value_rank, 2048);
    }

    #[test]
    fn small_shares_keep_one_padded_component_and_bad_shares_are_refused() {
        let config = ModelConfig::tiny_llama_for_tests();
        // 16 × 0.01 rounds to 0: one component, stored as 8.
        let ranks = LatentRanks::at_share(&config, 0.01).unwrap();
        assert_eq!(ranks.key_ranks, vec![8, 8]);
        assert_eq!(ranks.value_rank, 8);
        // SmolLM2: 64 × 0.3 = 19.2 → 19 → 24; 192 × 0.3 = 57.6 → 58 → 64.
        let smol = ModelConfig::smollm2_135m();
        let ranks = LatentRanks::at_share(&smol, 0.3).unwrap();
        assert_eq!(ranks.key_ranks, vec![24; 3]);
        assert_eq!(ranks.value_rank, 64);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(LatentRanks::at_share(&config, bad).is_err(), "{bad}");
        }
    }
}
