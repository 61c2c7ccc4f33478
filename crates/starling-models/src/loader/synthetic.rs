//! Random weights of the shapes a config implies: tiny models for tests, and real shapes for
//! performance runs where weight values do not matter (`--load-format synthetic`).

use rayon::prelude::*;
use starling_backend::HostTensor;

use super::weight_names::{expected_weight_shapes, is_norm_weight};
use super::WeightMap;
use crate::ModelConfig;

/// Standard deviation of the synthetic matrices and biases (the usual HF `initializer_range`).
const INIT_STD: f32 = 0.02;

/// Every tensor `config` implies, filled with N(0, 0.02) noise (RMSNorm weights are ones, so
/// activations keep their scale). The same `(config, seed)` always gives the same weights,
/// whatever the thread count. Holds all weights as f32 in host memory: a 7B model needs ~28 GB.
pub fn synthetic_weights(config: &ModelConfig, seed: u64) -> WeightMap {
    expected_weight_shapes(config)
        .into_par_iter()
        .enumerate()
        .map(|(index, (name, shape))| {
            let mut tensor = HostTensor::zeros(shape);
            if is_norm_weight(&name) {
                tensor.data_mut().fill(1.0);
            } else {
                // One independent stream per tensor keeps the result independent of scheduling.
                let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(GOLDEN_GAMMA));
                fill_normal(tensor.data_mut(), INIT_STD, &mut rng);
            }
            (name, tensor)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .collect()
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast, and statistically fine for filler weights.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    fn next_open_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Box–Muller: each pair of uniforms gives two independent normals.
fn fill_normal(out: &mut [f32], std: f32, rng: &mut SplitMix64) {
    for pair in out.chunks_mut(2) {
        let radius = (-2.0 * rng.next_open_unit().ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * rng.next_open_unit();
        let normals = [radius * angle.cos(), radius * angle.sin()];
        for (slot, normal) in pair.iter_mut().zip(normals) {
            *slot = normal as f32 * std;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_expected_tensor_and_is_deterministic() {
        let config = ModelConfig::tiny_llama_for_tests();
        let weights = synthetic_weights(&config, 7);
        weights.check_complete(&config).unwrap();
        assert_eq!(weights.len(), expected_weight_shapes(&config).len());
        assert_eq!(weights.num_params(), config.num_params());
        assert_eq!(weights, synthetic_weights(&config, 7));
        assert_ne!(weights, synthetic_weights(&config, 8));
    }

    #[test]
    fn matrices_are_small_noise_and_norms_are_ones() {
        let config = ModelConfig::tiny_llama_for_tests();
        let weights = synthetic_weights(&config, 1);
        let norm = weights.get("model.norm.weight").unwrap();
        assert!(norm.data().iter().all(|&x| x == 1.0));

        let embed = weights.get("model.embed_tokens.weight").unwrap().data();
        let n = embed.len() as f64;
        let mean = embed.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = embed
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.002, "std {}", var.sqrt());
    }
}
