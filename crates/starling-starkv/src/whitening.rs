//! Activation-aware ("whitened") factorisation: with `C = E[x xᵀ]` the second moment of a
//! layer's attention input, the expected output error of a low-rank `Ŵ` is
//! `E‖(W − Ŵ)x‖² = ‖(W − Ŵ) C^{1/2}‖²_F`, so the best rank-r `Ŵ` is the truncated SVD of
//! `W C^{1/2}` multiplied back by `C^{-1/2}`. The singular values of a whitened factorisation
//! are therefore output-error energies, and rank allocation uses them unchanged.

use faer::{Mat, Side};

use crate::{Matrix, StarKvError};

/// Eigenvalues of `C` below this share of the largest are raised to it, so `C^{-1/2}` exists
/// for rank-deficient statistics (few calibration tokens, dead channels) without amplifying
/// noise by more than 1000× (`1/√1e-6`).
pub const DEFAULT_RELATIVE_FLOOR: f64 = 1e-6;

/// The running second moment `Σ x xᵀ / n` of a layer's attention input (`d_model × d_model`).
#[derive(Clone, Debug, PartialEq)]
pub struct SecondMoment {
    dim: usize,
    /// Row-major sum of `x xᵀ` over all rows seen.
    sum: Vec<f64>,
    rows_seen: u64,
}

impl SecondMoment {
    /// An empty accumulator for vectors of width `dim`.
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            sum: vec![0.0; dim * dim],
            rows_seen: 0,
        }
    }

    /// A finished second moment given directly (row-major `dim × dim`, symmetric), counted as
    /// one observation.
    pub fn from_matrix(dim: usize, moment: Vec<f64>) -> Result<Self, StarKvError> {
        if moment.len() != dim * dim {
            return Err(StarKvError::SizeMismatch {
                what: format!("second moment {dim} × {dim}"),
                expected: dim * dim,
                found: moment.len(),
            });
        }
        Ok(Self {
            dim,
            sum: moment,
            rows_seen: 1,
        })
    }

    /// Adds every row of `activations` (`[tokens, dim]`) to the sum.
    pub fn add_rows(&mut self, activations: &Matrix) -> Result<(), StarKvError> {
        if activations.cols() != self.dim {
            return Err(StarKvError::InvalidArgument(format!(
                "activations of width {} for a second moment of width {}",
                activations.cols(),
                self.dim
            )));
        }
        let x = activations.to_faer();
        let gram: Mat<f64> = x.transpose() * &x;
        for i in 0..self.dim {
            for j in 0..self.dim {
                self.sum[i * self.dim + j] += gram[(i, j)];
            }
        }
        self.rows_seen += activations.rows() as u64;
        Ok(())
    }

    /// Width of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How many rows have been accumulated.
    pub fn rows_seen(&self) -> u64 {
        self.rows_seen
    }

    /// The mean `Σ x xᵀ / n`, row-major.
    pub fn mean(&self) -> Result<Vec<f64>, StarKvError> {
        if self.rows_seen == 0 {
            return Err(StarKvError::InvalidArgument(
                "second moment of zero rows".to_owned(),
            ));
        }
        let n = self.rows_seen as f64;
        Ok(self.sum.iter().map(|&x| x / n).collect())
    }
}

/// `C^{1/2}` and its inverse for one layer, from the symmetric eigendecomposition
/// `C = Q Λ Qᵀ` with `Λ` floored (see [`DEFAULT_RELATIVE_FLOOR`]). Both use the same floored
/// `Λ`, so `C^{1/2} C^{-1/2} = I` and a full-rank whitened factorisation is still exact.
#[derive(Clone, Debug)]
pub struct Whitener {
    sqrt: Mat<f64>,
    inv_sqrt: Mat<f64>,
}

impl Whitener {
    /// Builds the whitening pair from a layer's second moment; eigenvalues below
    /// `relative_floor × λ_max` are raised to it.
    pub fn new(moment: &SecondMoment, relative_floor: f64) -> Result<Self, StarKvError> {
        if !(relative_floor > 0.0 && relative_floor < 1.0) {
            return Err(StarKvError::InvalidArgument(format!(
                "relative eigenvalue floor {relative_floor} must be in (0, 1)"
            )));
        }
        let dim = moment.dim();
        let mean = moment.mean()?;
        if mean.iter().any(|x| !x.is_finite()) {
            return Err(StarKvError::InvalidArgument(
                "second moment has non-finite entries".to_owned(),
            ));
        }
        // Symmetrise: accumulated sums are symmetric only up to rounding.
        let c = Mat::from_fn(dim, dim, |i, j| {
            0.5 * (mean[i * dim + j] + mean[j * dim + i])
        });
        let eigen = c
            .self_adjoint_eigen(Side::Lower)
            .map_err(|e| StarKvError::Decomposition {
                what: format!("second moment {dim} × {dim}"),
                reason: format!("{e:?}"),
            })?;
        let values = eigen.S().column_vector();
        let largest = (0..dim).map(|i| values[i]).fold(0.0_f64, f64::max);
        if largest <= 0.0 {
            return Err(StarKvError::InvalidArgument(
                "second moment is zero: no activation energy to whiten with".to_owned(),
            ));
        }
        let floor = largest * relative_floor;
        let q = eigen.U();
        let scaled = |power: f64| {
            let diag: Vec<f64> = (0..dim).map(|i| values[i].max(floor).powf(power)).collect();
            let q_scaled = Mat::from_fn(dim, dim, |i, j| q[(i, j)] * diag[j]);
            &q_scaled * q.transpose()
        };
        Ok(Self {
            sqrt: scaled(0.5),
            inv_sqrt: scaled(-0.5),
        })
    }

    /// Width of the vectors this whitens.
    pub fn dim(&self) -> usize {
        self.sqrt.nrows()
    }

    /// `C^{1/2}`.
    pub(crate) fn sqrt(&self) -> &Mat<f64> {
        &self.sqrt
    }

    /// `C^{-1/2}`.
    pub(crate) fn inv_sqrt(&self) -> &Mat<f64> {
        &self.inv_sqrt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_square_root_squares_back_and_inverts() {
        // Rows of a fixed, well-conditioned but non-diagonal activation sample.
        let x = Matrix::new(
            4,
            3,
            vec![
                1.0, 0.5, -0.2, 0.3, 2.0, 0.1, -1.0, 0.4, 1.5, 0.2, -0.3, 0.7,
            ],
        )
        .unwrap();
        let mut moment = SecondMoment::new(3);
        moment.add_rows(&x).unwrap();
        assert_eq!(moment.rows_seen(), 4);
        let whitener = Whitener::new(&moment, DEFAULT_RELATIVE_FLOOR).unwrap();
        let squared = whitener.sqrt() * whitener.sqrt();
        let identity = whitener.sqrt() * whitener.inv_sqrt();
        let mean = moment.mean().unwrap();
        for i in 0..3 {
            for j in 0..3 {
                assert!((squared[(i, j)] - mean[i * 3 + j]).abs() < 1e-12);
                let expected = if i == j { 1.0 } else { 0.0 };
                assert!((identity[(i, j)] - expected).abs() < 1e-10);
            }
        }
    }

    #[test]
    fn rank_deficient_moments_are_floored_and_zero_is_refused() {
        // One direction only: rank 1, yet the whitener is invertible.
        let x = Matrix::new(2, 2, vec![1.0, 1.0, 2.0, 2.0]).unwrap();
        let mut moment = SecondMoment::new(2);
        moment.add_rows(&x).unwrap();
        let whitener = Whitener::new(&moment, 1e-4).unwrap();
        let identity = whitener.sqrt() * whitener.inv_sqrt();
        assert!((identity[(0, 0)] - 1.0).abs() < 1e-9);
        assert!(identity[(0, 1)].abs() < 1e-9);

        assert!(Whitener::new(&SecondMoment::new(2), 1e-4).is_err());
        let zero = SecondMoment::from_matrix(2, vec![0.0; 4]).unwrap();
        assert!(Whitener::new(&zero, 1e-4).is_err());
        assert!(Whitener::new(&moment, 0.0).is_err());
        assert!(moment.add_rows(&Matrix::zeros(1, 3)).is_err());
    }
}
