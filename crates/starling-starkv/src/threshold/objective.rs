//! What the thresholds are trained to minimise, behind a trait so the knowledge-distillation
//! loss can replace the weight-reconstruction loss without touching the optimiser.

use crate::{ModelSpectra, StarKvError};

/// A loss of the student model as a function of every factor's kept singular values.
///
/// The student's factor `f` is `U_f diag(v_f) R_f`, with `v_f[i] = σ_max · f(σ̂_i)` the
/// soft-thresholded singular values (zero for dropped components). The optimiser chains the
/// returned `∂L/∂v` through the soft threshold to get `∂L/∂α`. A distillation objective gets
/// `∂L/∂v_f[i]` from its backward pass as `Σ_j (∂L/∂A_f)[i, j] · R_f[i, j]`, since the
/// down-projection is `A_f = diag(v_f) R_f`.
pub trait ThresholdObjective {
    /// Returns the loss at `values` (one vector per factor, canonical order) and writes
    /// `∂L/∂values` into `grad` (same shape, zeroed by the caller).
    fn evaluate(&mut self, values: &[Vec<f64>], grad: &mut [Vec<f64>]) -> Result<f64, StarKvError>;
}

/// The weight-reconstruction error `Σ_f w_f Σ_i (σ_i − v_i)²`, which equals
/// `Σ_f w_f ‖W_f − Ŵ_f‖²_F` (in the whitened metric for whitened factors) because `U` and `V`
/// are orthonormal. `w_f` is the factor's energy weight (see
/// [`ModelSpectra::energy_weight`]), so the loss counts "average output rows lost" and key
/// heads and value maps compete as in the greedy strategy.
#[derive(Clone, Debug)]
pub struct ReconstructionObjective {
    singular_values: Vec<Vec<f64>>,
    weights: Vec<f64>,
}

impl ReconstructionObjective {
    /// The objective for `spectra`'s factors.
    pub fn new(spectra: &ModelSpectra) -> Self {
        Self {
            singular_values: spectra
                .factors()
                .iter()
                .map(|f| f.singular_values.clone())
                .collect(),
            weights: (0..spectra.factors().len())
                .map(|i| spectra.energy_weight(i))
                .collect(),
        }
    }
}

impl ThresholdObjective for ReconstructionObjective {
    fn evaluate(&mut self, values: &[Vec<f64>], grad: &mut [Vec<f64>]) -> Result<f64, StarKvError> {
        if values.len() != self.singular_values.len() || grad.len() != values.len() {
            return Err(StarKvError::SizeMismatch {
                what: "factors given to the reconstruction objective".to_owned(),
                expected: self.singular_values.len(),
                found: values.len(),
            });
        }
        let mut loss = 0.0;
        for (((sigma, value), grad), &weight) in self
            .singular_values
            .iter()
            .zip(values)
            .zip(grad.iter_mut())
            .zip(&self.weights)
        {
            if sigma.len() != value.len() || grad.len() != value.len() {
                return Err(StarKvError::SizeMismatch {
                    what: "singular values of a factor".to_owned(),
                    expected: sigma.len(),
                    found: value.len(),
                });
            }
            for ((&s, &v), g) in sigma.iter().zip(value).zip(grad.iter_mut()) {
                loss += weight * (s - v) * (s - v);
                *g = -2.0 * weight * (s - v);
            }
        }
        Ok(loss)
    }
}
