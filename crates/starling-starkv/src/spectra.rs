//! The singular values of every factor of a model: all that rank allocation looks at, so
//! allocation can be tested on synthetic spectra without building matrices.

use crate::{FactorId, FactorKind, KvShape, ModelFactors, StarKvError, UncompressedLayers};

/// One factor's singular values, non-increasing.
#[derive(Clone, Debug, PartialEq)]
pub struct FactorSpectrum {
    /// Which factor.
    pub id: FactorId,
    /// `σ`, non-increasing, length = the factor's maximum rank.
    pub singular_values: Vec<f64>,
}

/// The spectra of every factor of the compressed layers, in canonical order (layer ascending;
/// a layer's key heads, then its value), with the shape they belong to.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpectra {
    shape: KvShape,
    uncompressed: UncompressedLayers,
    factors: Vec<FactorSpectrum>,
    /// Per factor: `rows / Σσ²` (0 for an all-zero factor); see [`ModelSpectra::energy_weight`].
    energy_weights: Vec<f64>,
}

impl ModelSpectra {
    /// Checks that `factors` lists exactly the factors of the compressed layers in canonical
    /// order, each with `max rank` finite, non-negative, non-increasing values.
    pub fn new(
        shape: KvShape,
        uncompressed: UncompressedLayers,
        factors: Vec<FactorSpectrum>,
    ) -> Result<Self, StarKvError> {
        let expected = canonical_ids(&shape, &uncompressed);
        if factors.len() != expected.len() {
            return Err(StarKvError::SizeMismatch {
                what: "factor spectra".to_owned(),
                expected: expected.len(),
                found: factors.len(),
            });
        }
        for (factor, id) in factors.iter().zip(&expected) {
            if factor.id != *id {
                return Err(StarKvError::InvalidArgument(format!(
                    "spectrum for {:?} found where {id:?} belongs",
                    factor.id
                )));
            }
            let max_rank = max_rank(&shape, id.kind);
            let values = &factor.singular_values;
            if values.len() != max_rank {
                return Err(StarKvError::SizeMismatch {
                    what: format!("singular values of {id:?}"),
                    expected: max_rank,
                    found: values.len(),
                });
            }
            let sorted = values.windows(2).all(|p| p[0] >= p[1]);
            if !sorted || values.iter().any(|s| !s.is_finite() || *s < 0.0) {
                return Err(StarKvError::InvalidArgument(format!(
                    "singular values of {id:?} must be finite, non-negative and non-increasing"
                )));
            }
        }
        let energy_weights = factors
            .iter()
            .map(|f| {
                let energy: f64 = f.singular_values.iter().map(|s| s * s).sum();
                let rows = rows(&shape, f.id.kind) as f64;
                if energy > 0.0 {
                    rows / energy
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Self {
            shape,
            uncompressed,
            factors,
            energy_weights,
        })
    }

    /// The spectra of computed factors.
    pub fn of(factors: &ModelFactors) -> Result<Self, StarKvError> {
        let spectra = factors
            .factors()
            .into_iter()
            .map(|(id, f)| FactorSpectrum {
                id,
                singular_values: f.singular_values().to_vec(),
            })
            .collect();
        Self::new(factors.shape(), factors.uncompressed().clone(), spectra)
    }

    /// The model shape.
    pub fn shape(&self) -> &KvShape {
        &self.shape
    }

    /// The layers kept whole.
    pub fn uncompressed(&self) -> &UncompressedLayers {
        &self.uncompressed
    }

    /// Every factor's spectrum, canonical order.
    pub fn factors(&self) -> &[FactorSpectrum] {
        &self.factors
    }

    /// The largest rank of factor `index`.
    pub fn max_rank(&self, index: usize) -> usize {
        self.factors[index].singular_values.len()
    }

    /// `rows / Σσ²` of factor `index`. Multiplying a component's energy `σ_i²` by it gives the
    /// number of average output rows that component explains, a unit in which a key head
    /// (`head_dim` rows) and the joint value map (`kv_heads · head_dim` rows) compete fairly
    /// for cache elements, whatever the scale of their weights.
    pub fn energy_weight(&self, index: usize) -> f64 {
        self.energy_weights[index]
    }

    /// The value of keeping component `component` of factor `index`:
    /// `σ_component² · energy_weight` (see [`ModelSpectra::energy_weight`]).
    pub fn component_value(&self, index: usize, component: usize) -> f64 {
        let sigma = self.factors[index].singular_values[component];
        sigma * sigma * self.energy_weights[index]
    }
}

/// The factor ids of the compressed layers, canonical order.
pub(crate) fn canonical_ids(shape: &KvShape, uncompressed: &UncompressedLayers) -> Vec<FactorId> {
    let mut ids = Vec::new();
    for layer in (0..shape.num_layers).filter(|&l| !uncompressed.contains(l)) {
        for head in 0..shape.num_kv_heads {
            let kind = FactorKind::Key { head };
            ids.push(FactorId { layer, kind });
        }
        let kind = FactorKind::Value;
        ids.push(FactorId { layer, kind });
    }
    ids
}

/// Output rows of a factor of `kind`.
pub(crate) fn rows(shape: &KvShape, kind: FactorKind) -> usize {
    match kind {
        FactorKind::Key { .. } => shape.head_dim,
        FactorKind::Value => shape.kv_size(),
    }
}

/// The largest rank of a factor of `kind`.
pub(crate) fn max_rank(shape: &KvShape, kind: FactorKind) -> usize {
    match kind {
        FactorKind::Key { .. } => shape.max_key_rank(),
        FactorKind::Value => shape.max_value_rank(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape {
            hidden_size: 8,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 2,
        }
    }

    fn spectrum(kind: FactorKind, values: Vec<f64>) -> FactorSpectrum {
        FactorSpectrum {
            id: FactorId { layer: 0, kind },
            singular_values: values,
        }
    }

    #[test]
    fn validation_and_energy_weights() {
        let key = FactorKind::Key { head: 0 };
        let good = vec![
            spectrum(key, vec![2.0, 0.0]),
            spectrum(FactorKind::Value, vec![1.0, 1.0]),
        ];
        let spectra = ModelSpectra::new(shape(), UncompressedLayers::none(), good).unwrap();
        // Key: 2 rows / 4 energy; its top component explains 2 rows (all of them).
        assert_eq!(spectra.component_value(0, 0), 2.0);
        assert_eq!(spectra.component_value(0, 1), 0.0);
        // Value: kv_size 2 rows / 2 energy.
        assert_eq!(spectra.component_value(1, 1), 1.0);

        let unsorted = vec![
            spectrum(key, vec![1.0, 2.0]),
            spectrum(FactorKind::Value, vec![1.0, 1.0]),
        ];
        assert!(ModelSpectra::new(shape(), UncompressedLayers::none(), unsorted).is_err());
        let swapped = vec![
            spectrum(FactorKind::Value, vec![1.0, 1.0]),
            spectrum(key, vec![1.0, 0.0]),
        ];
        assert!(ModelSpectra::new(shape(), UncompressedLayers::none(), swapped).is_err());
        let short = vec![spectrum(key, vec![1.0])];
        assert!(ModelSpectra::new(shape(), UncompressedLayers::none(), short).is_err());
    }
}
