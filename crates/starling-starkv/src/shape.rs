//! The part of a model's shape STAR-KV depends on, and which layers stay uncompressed.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use starling_models::ModelConfig;

use crate::StarKvError;

/// The attention shapes a STAR-KV checkpoint is tied to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvShape {
    /// Residual width: the input width of `W_k` and `W_v`.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvShape {
    /// The shape of `config`.
    pub fn of(config: &ModelConfig) -> Self {
        Self {
            hidden_size: config.hidden_size,
            num_layers: config.num_layers,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        }
    }

    /// Width of the concatenated K (or V) heads.
    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// K and V elements one token stores in one uncompressed layer, `2 · kv_heads · head_dim`.
    pub fn full_layer_elements(&self) -> u64 {
        2 * self.kv_size() as u64
    }

    /// The largest useful rank of one key head's factor, `min(head_dim, hidden)`.
    pub fn max_key_rank(&self) -> usize {
        self.head_dim.min(self.hidden_size)
    }

    /// The largest useful rank of a layer's value factor, `min(kv_size, hidden)`.
    pub fn max_value_rank(&self) -> usize {
        self.kv_size().min(self.hidden_size)
    }
}

/// The layers kept at full K/V (never factored); they count at full size in every budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncompressedLayers {
    layers: BTreeSet<usize>,
}

impl UncompressedLayers {
    /// The reference implementation's choice: the first two layers and the last.
    pub fn reference(num_layers: usize) -> Self {
        let mut layers = BTreeSet::new();
        for layer in [0, 1, num_layers.saturating_sub(1)] {
            if layer < num_layers {
                layers.insert(layer);
            }
        }
        Self { layers }
    }

    /// Every layer compressed.
    pub fn none() -> Self {
        Self {
            layers: BTreeSet::new(),
        }
    }

    /// An explicit list; every index must be below `num_layers`.
    pub fn from_list(layers: &[usize], num_layers: usize) -> Result<Self, StarKvError> {
        if let Some(&bad) = layers.iter().find(|&&l| l >= num_layers) {
            return Err(StarKvError::InvalidArgument(format!(
                "uncompressed layer {bad} does not exist (the model has {num_layers} layers)"
            )));
        }
        Ok(Self {
            layers: layers.iter().copied().collect(),
        })
    }

    /// Whether `layer` stays uncompressed.
    pub fn contains(&self, layer: usize) -> bool {
        self.layers.contains(&layer)
    }

    /// The uncompressed layers, ascending.
    pub fn to_vec(&self) -> Vec<usize> {
        self.layers.iter().copied().collect()
    }

    /// How many layers stay uncompressed.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether every layer is compressed.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_layers_and_bounds() {
        assert_eq!(UncompressedLayers::reference(30).to_vec(), vec![0, 1, 29]);
        assert_eq!(UncompressedLayers::reference(2).to_vec(), vec![0, 1]);
        assert!(UncompressedLayers::reference(0).is_empty());
        assert!(UncompressedLayers::from_list(&[3], 3).is_err());
        let list = UncompressedLayers::from_list(&[2, 0, 2], 3).unwrap();
        assert_eq!(list.to_vec(), vec![0, 2]);
        assert!(list.contains(2) && !list.contains(1));

        let shape = KvShape::of(&ModelConfig::qwen2_5_coder_1_5b());
        assert_eq!(shape.kv_size(), 256);
        assert_eq!(shape.full_layer_elements(), 512);
        assert_eq!((shape.max_key_rank(), shape.max_value_rank()), (128, 256));
    }
}
