//! Which layers an fp8 (e4m3) KV cache can hold: the rule `--kv-cache-dtype fp8` applies per
//! layer, on the device-resident model at load ([`super::LlamaModel::fp8_exempt_layers`]) and on
//! host weights before any load (`starling info`), so both count the same bytes.

use std::sync::OnceLock;

use crate::config::ModelConfig;
use crate::loader::WeightMap;

/// The largest key-projection bias (absolute) a layer may have for an fp8 (e4m3) cache to hold
/// its keys. A bias is a per-channel offset added to every token's key; e4m3 keeps 3 mantissa
/// bits, so an offset of magnitude m is stored with an error of up to m/16 that changes from
/// token to token with the small part that does vary — at Qwen2.5's first layers (key biases up
/// to 354 and 111; every later layer of Qwen2.5-Coder-1.5B at most 13) that error swamps what
/// attention reads: perplexity +156% with every layer in fp8, measured on the H200
/// (BENCHMARKS.md). Such layers keep the activation dtype; the others store fp8.
pub const FP8_MAX_KEY_BIAS: f32 = 32.0;

/// The largest absolute value of a key bias (0 for none).
pub fn key_bias_max_abs(key_bias: &[f32]) -> f32 {
    key_bias.iter().fold(0.0f32, |m, b| m.max(b.abs()))
}

/// The environment variable that replaces [`FP8_MAX_KEY_BIAS`] (a number; for measuring the
/// rule, e.g. `1e9` puts every layer in fp8).
pub const FP8_MAX_KEY_BIAS_ENV: &str = "STARLING_FP8_MAX_KEY_BIAS";

/// The limit in force: [`FP8_MAX_KEY_BIAS_ENV`] when it holds a number, else
/// [`FP8_MAX_KEY_BIAS`].
pub fn fp8_max_key_bias() -> f32 {
    static LIMIT: OnceLock<f32> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var(FP8_MAX_KEY_BIAS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<f32>().ok())
            .filter(|v| *v >= 0.0)
            .unwrap_or(FP8_MAX_KEY_BIAS)
    })
}

/// Whether an fp8 cache holds the keys of a layer whose key bias peaks at `max_abs`.
pub fn fp8_holds_key_bias(max_abs: f32) -> bool {
    max_abs <= fp8_max_key_bias()
}

/// The layers of `weights` (canonical HF names, as loaded) whose key bias an fp8 cache cannot
/// hold; none for a model without biases.
pub fn fp8_exempt_layers_of(config: &ModelConfig, weights: &WeightMap) -> Vec<usize> {
    (0..config.num_layers)
        .filter(|l| {
            weights
                .get(&format!("model.layers.{l}.self_attn.k_proj.bias"))
                .is_some_and(|bias| !fp8_holds_key_bias(key_bias_max_abs(bias.data())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_backend::HostTensor;

    #[test]
    fn only_layers_with_a_key_bias_past_the_limit_are_exempt() {
        let config = ModelConfig::tiny_llama_for_tests();
        let mut weights = WeightMap::new();
        let kv = config.num_kv_heads * config.head_dim;
        let mut big = vec![0.5f32; kv];
        big[1] = -(fp8_max_key_bias() + 1.0);
        weights.insert(
            "model.layers.1.self_attn.k_proj.bias",
            HostTensor::new(vec![kv], big).unwrap(),
        );
        weights.insert(
            "model.layers.0.self_attn.k_proj.bias",
            HostTensor::new(vec![kv], vec![fp8_max_key_bias(); kv]).unwrap(),
        );
        assert_eq!(fp8_exempt_layers_of(&config, &weights), vec![1]);
        assert!(fp8_exempt_layers_of(&config, &WeightMap::new()).is_empty());
    }
}
