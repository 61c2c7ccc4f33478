//! The SVD factors of every compressed layer of a model: per KV head for keys (head-wise),
//! one for the whole value projection (joint), read from the model's f32 host weights.

use rayon::prelude::*;
use starling_models::{LayerTensor, ModelConfig, WeightMap};

use crate::{Factorization, KvShape, Matrix, StarKvError, UncompressedLayers, Whitener};

/// Which projection a factor belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FactorKind {
    /// The rows of `W_k` of one KV head, `[head_dim, hidden]`.
    Key {
        /// The KV head.
        head: usize,
    },
    /// The whole `W_v`, `[kv_heads · head_dim, hidden]`.
    Value,
}

/// A factor's place in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FactorId {
    /// Decoder layer.
    pub layer: usize,
    /// Key head or value.
    pub kind: FactorKind,
}

/// The factors of one compressed layer.
#[derive(Clone, Debug)]
pub struct LayerFactors {
    /// One per KV head.
    pub keys: Vec<Factorization>,
    /// The joint value factorisation.
    pub value: Factorization,
}

/// Every compressed layer's factors; uncompressed layers hold none.
#[derive(Clone, Debug)]
pub struct ModelFactors {
    shape: KvShape,
    uncompressed: UncompressedLayers,
    layers: Vec<Option<LayerFactors>>,
}

impl ModelFactors {
    /// Factors `W_k` (per head) and `W_v` (jointly) of every layer not in `uncompressed`.
    /// With `whiteners` (one per layer, indexed by layer), each layer's factors are whitened
    /// by its attention-input statistics. Biases are not factored: they are added after
    /// reconstruction, so the checkpoint never needs them. Layers run in parallel; each SVD
    /// is sequential, so the result does not depend on the thread count.
    pub fn compute(
        config: &ModelConfig,
        weights: &WeightMap,
        uncompressed: &UncompressedLayers,
        whiteners: Option<&[Whitener]>,
    ) -> Result<Self, StarKvError> {
        let shape = KvShape::of(config);
        if let Some(whiteners) = whiteners {
            if whiteners.len() != shape.num_layers {
                return Err(StarKvError::InvalidArgument(format!(
                    "{} whiteners for {} layers",
                    whiteners.len(),
                    shape.num_layers
                )));
            }
        }
        let layers = (0..shape.num_layers)
            .into_par_iter()
            .map(|layer| {
                if uncompressed.contains(layer) {
                    return Ok(None);
                }
                let whitener = whiteners.map(|w| &w[layer]);
                factor_layer(config, weights, layer, whitener).map(Some)
            })
            .collect::<Result<Vec<_>, StarKvError>>()?;
        Ok(Self {
            shape,
            uncompressed: uncompressed.clone(),
            layers,
        })
    }

    /// The model shape the factors were computed for.
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// The factors of `layer`, or `None` when it stays uncompressed.
    pub fn layer(&self, layer: usize) -> Option<&LayerFactors> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// The layers kept uncompressed.
    pub fn uncompressed(&self) -> &UncompressedLayers {
        &self.uncompressed
    }

    /// Every factor in canonical order (layer ascending; a layer's key heads, then its value).
    /// Allocations list their ranks in this order.
    pub fn factors(&self) -> Vec<(FactorId, &Factorization)> {
        let mut out = Vec::new();
        for (layer, factors) in self.layers.iter().enumerate() {
            if let Some(factors) = factors {
                for (head, key) in factors.keys.iter().enumerate() {
                    let kind = FactorKind::Key { head };
                    out.push((FactorId { layer, kind }, key));
                }
                let kind = FactorKind::Value;
                out.push((FactorId { layer, kind }, &factors.value));
            }
        }
        out
    }

    /// Whether the factors were whitened.
    pub fn is_whitened(&self) -> bool {
        self.factors().first().is_some_and(|(_, f)| f.is_whitened())
    }
}

fn factor_layer(
    config: &ModelConfig,
    weights: &WeightMap,
    layer: usize,
    whitener: Option<&Whitener>,
) -> Result<LayerFactors, StarKvError> {
    let w_k = weight_matrix(config, weights, LayerTensor::KProj, layer)?;
    let w_v = weight_matrix(config, weights, LayerTensor::VProj, layer)?;
    let head_dim = config.head_dim;
    let keys = (0..config.num_kv_heads)
        .map(|head| {
            let rows = w_k.row_block(head * head_dim, (head + 1) * head_dim)?;
            let what = format!("layer {layer} key head {head}");
            Factorization::new(&rows, whitener, &what)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let value = Factorization::new(&w_v, whitener, &format!("layer {layer} values"))?;
    Ok(LayerFactors { keys, value })
}

fn weight_matrix(
    config: &ModelConfig,
    weights: &WeightMap,
    tensor: LayerTensor,
    layer: usize,
) -> Result<Matrix, StarKvError> {
    let name = tensor.name(layer);
    let shape = tensor.shape(config);
    weights.check_shape(&name, &shape)?;
    let data = weights
        .get(&name)
        .map(|t| t.data().to_vec())
        .ok_or(starling_models::ModelError::MissingTensor { name })?;
    Matrix::new(shape[0], shape[1], data)
}

#[cfg(test)]
mod tests {
    use starling_models::synthetic_weights;

    use super::*;

    #[test]
    fn heads_factor_their_own_rows_and_values_factor_jointly() {
        let config = ModelConfig::tiny_llama_for_tests();
        let weights = synthetic_weights(&config, 3);
        let uncompressed = UncompressedLayers::from_list(&[0], 2).unwrap();
        let factors = ModelFactors::compute(&config, &weights, &uncompressed, None).unwrap();
        assert!(factors.layer(0).is_none());
        let layer = factors.layer(1).unwrap();
        assert_eq!(layer.keys.len(), 2);
        assert_eq!((layer.keys[1].rows(), layer.keys[1].cols()), (16, 64));
        assert_eq!((layer.value.rows(), layer.value.cols()), (32, 64));
        assert_eq!(factors.uncompressed().to_vec(), vec![0]);

        let w_k = weight_matrix(&config, &weights, LayerTensor::KProj, 1).unwrap();
        let head1 = layer.keys[1].reconstruct(16).unwrap();
        let rows = w_k.row_block(16, 32).unwrap();
        assert!(head1.distance_sq(&rows).unwrap() < 1e-10 * rows.frobenius_sq());

        let ids: Vec<FactorId> = factors.factors().iter().map(|(id, _)| *id).collect();
        let kinds = [
            FactorKind::Key { head: 0 },
            FactorKind::Key { head: 1 },
            FactorKind::Value,
        ];
        assert_eq!(ids, kinds.map(|kind| FactorId { layer: 1, kind }).to_vec());
    }

    #[test]
    fn whitened_layers_reconstruct_exactly_at_full_rank() {
        let config = ModelConfig::tiny_llama_for_tests();
        let weights = synthetic_weights(&config, 4);
        // Activations whose channels differ in scale (channel j scaled by j + 1).
        let rows: Vec<f32> = (0..128 * 64)
            .map(|i| ((i * 7919 % 101) as f32 / 101.0 - 0.5) * ((i % 64) + 1) as f32)
            .collect();
        let x = Matrix::new(128, 64, rows).unwrap();
        let whiteners: Vec<Whitener> = (0..2)
            .map(|_| {
                let mut moment = crate::SecondMoment::new(64);
                moment.add_rows(&x).unwrap();
                Whitener::new(&moment, crate::DEFAULT_RELATIVE_FLOOR).unwrap()
            })
            .collect();
        let none = UncompressedLayers::none();
        let factors = ModelFactors::compute(&config, &weights, &none, Some(&whiteners)).unwrap();
        assert!(factors.is_whitened());
        let w_v = weight_matrix(&config, &weights, LayerTensor::VProj, 0).unwrap();
        let value = &factors.layer(0).unwrap().value;
        let back = value.reconstruct(value.max_rank()).unwrap();
        assert!(back.distance_sq(&w_v).unwrap() < 1e-9 * w_v.frobenius_sq());
    }

    #[test]
    fn missing_weights_and_wrong_whitener_counts_are_errors() {
        let config = ModelConfig::tiny_llama_for_tests();
        let mut weights = synthetic_weights(&config, 3);
        let none = UncompressedLayers::none();
        assert!(ModelFactors::compute(&config, &weights, &none, Some(&[])).is_err());
        weights
            .take(&LayerTensor::VProj.name(1), &[32, 64])
            .unwrap();
        let err = ModelFactors::compute(&config, &weights, &none, None).unwrap_err();
        assert!(err.to_string().contains("v_proj"), "{err}");
    }
}
