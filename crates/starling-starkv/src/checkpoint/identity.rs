//! The model identity a checkpoint is tied to: a hash of the weights' values, independent of
//! the file format they were read from.
//!
//! Scheme `tensor-sha256-v1`: for each tensor, `d = sha256(name ‖ 0x00 ‖ ndims ‖ dims ‖ data)`
//! with `ndims` and each dim as u64 little-endian and `data` the f32 values (as loaded, after
//! dequantisation) little-endian; the identity is the hex `sha256` of every `d` concatenated
//! in name order. Hashing the loaded values rather than files means an HF directory and a
//! safetensors re-export with the same values agree, while a GGUF `llama` file (whose Q/K rows
//! llama.cpp permuted, so a checkpoint's key up-projections would not fit it) does not.
//! Tensors hash in parallel; the result does not depend on the thread count.

use rayon::prelude::*;
use sha2::{Digest, Sha256};
use starling_models::WeightMap;

/// The name of the scheme [`weights_identity`] implements, recorded in manifests.
pub const IDENTITY_SCHEME: &str = "tensor-sha256-v1";

/// Elements converted to bytes per hasher update (bounds the scratch buffer to 256 KiB).
const CHUNK_ELEMENTS: usize = 1 << 16;

/// The identity of `weights` under [`IDENTITY_SCHEME`], as 64 hex digits.
pub fn weights_identity(weights: &WeightMap) -> String {
    let names = weights.names();
    let digests: Vec<[u8; 32]> = names
        .par_iter()
        .map(|name| {
            let mut hasher = Sha256::new();
            hasher.update(name.as_bytes());
            hasher.update([0u8]);
            if let Some(tensor) = weights.get(name) {
                hasher.update((tensor.shape().len() as u64).to_le_bytes());
                for &dim in tensor.shape() {
                    hasher.update((dim as u64).to_le_bytes());
                }
                let mut bytes = Vec::with_capacity(CHUNK_ELEMENTS * 4);
                for chunk in tensor.data().chunks(CHUNK_ELEMENTS) {
                    bytes.clear();
                    bytes.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    hasher.update(&bytes);
                }
            }
            hasher.finalize().into()
        })
        .collect();
    let mut total = Sha256::new();
    for digest in &digests {
        total.update(digest);
    }
    hex::encode(total.finalize())
}

#[cfg(test)]
mod tests {
    use starling_models::{synthetic_weights, ModelConfig};

    use super::*;

    #[test]
    fn identity_follows_values_and_names() {
        let config = ModelConfig::tiny_llama_for_tests();
        let weights = synthetic_weights(&config, 1);
        let id = weights_identity(&weights);
        assert_eq!(id.len(), 64);
        assert_eq!(id, weights_identity(&weights.clone()));
        assert_ne!(id, weights_identity(&synthetic_weights(&config, 2)));

        let mut tweaked = weights.clone();
        let name = "model.norm.weight";
        let mut norm = tweaked.take(name, &[64]).unwrap();
        norm.data_mut()[5] += 1e-3;
        tweaked.insert(name, norm);
        assert_ne!(id, weights_identity(&tweaked));
    }
}
