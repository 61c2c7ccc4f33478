//! One projection matrix factored by SVD, `W = U diag(σ) R`, truncatable to any rank: the
//! down-projection `diag(σ_r) R_r` produces the cached latent, the up-projection `U_r`
//! reconstructs the projection's output from it.

use faer::Mat;

use crate::{Matrix, StarKvError, Whitener};

/// `W [m, n] = U [m, k] · diag(σ) · R [k, n]` with `k = min(m, n)`, `U` orthonormal columns and
/// `σ` non-increasing. Plain: `R = Vᵀ`. Whitened with `C`: `W C^{1/2} = U diag(σ) Vᵀ` and
/// `R = Vᵀ C^{-1/2}`, so `σ` measures output error under the calibration activations.
#[derive(Clone, Debug, PartialEq)]
pub struct Factorization {
    /// `U`, `[rows, k]`.
    u: Matrix,
    /// `σ`, length `k`, non-increasing, in f64 so energies sum without loss.
    singular_values: Vec<f64>,
    /// `R`, `[k, cols]`.
    right: Matrix,
    whitened: bool,
}

impl Factorization {
    /// Factors `w` (`[out, in]`); with a whitener, the whitened factorisation (the whitener's
    /// width must equal `w.cols()`). `what` names the matrix in errors.
    pub fn new(w: &Matrix, whitener: Option<&Whitener>, what: &str) -> Result<Self, StarKvError> {
        if w.rows() == 0 || w.cols() == 0 {
            return Err(StarKvError::InvalidArgument(format!("{what} is empty")));
        }
        if w.data().iter().any(|x| !x.is_finite()) {
            return Err(StarKvError::InvalidArgument(format!(
                "{what} has non-finite entries"
            )));
        }
        let mut target = w.to_faer();
        if let Some(whitener) = whitener {
            if whitener.dim() != w.cols() {
                return Err(StarKvError::InvalidArgument(format!(
                    "{what} has {} inputs but the whitener is {} wide",
                    w.cols(),
                    whitener.dim()
                )));
            }
            target = &target * whitener.sqrt();
        }
        let svd = target.thin_svd().map_err(|e| StarKvError::Decomposition {
            what: what.to_owned(),
            reason: format!("SVD did not converge: {e:?}"),
        })?;
        let k = w.rows().min(w.cols());
        let sigma = svd.S().column_vector();
        // faer sorts non-increasing; clamp the (tiny) negative rounding a solver may leave.
        let singular_values: Vec<f64> = (0..k).map(|i| sigma[i].max(0.0)).collect();
        let vt: Mat<f64> = svd.V().transpose().to_owned();
        let right = match whitener {
            Some(whitener) => &vt * whitener.inv_sqrt(),
            None => vt,
        };
        Ok(Self {
            u: Matrix::from_faer(&svd.U().to_owned()),
            singular_values,
            right: Matrix::from_faer(&right),
            whitened: whitener.is_some(),
        })
    }

    /// Rows of the factored matrix (outputs).
    pub fn rows(&self) -> usize {
        self.u.rows()
    }

    /// Columns of the factored matrix (inputs).
    pub fn cols(&self) -> usize {
        self.right.cols()
    }

    /// The largest rank a truncation can keep, `min(rows, cols)`.
    pub fn max_rank(&self) -> usize {
        self.singular_values.len()
    }

    /// `σ`, non-increasing.
    pub fn singular_values(&self) -> &[f64] {
        &self.singular_values
    }

    /// Whether `σ` comes from the whitened matrix `W C^{1/2}`.
    pub fn is_whitened(&self) -> bool {
        self.whitened
    }

    /// `Σ σ²`: `‖W‖²_F` (plain) or `‖W C^{1/2}‖²_F` (whitened).
    pub fn total_energy(&self) -> f64 {
        self.singular_values.iter().map(|s| s * s).sum()
    }

    /// `Σ_{i ≥ rank} σ_i²`: the squared Frobenius error of the rank-`rank` truncation (in the
    /// whitened metric when whitened), by Eckart–Young the smallest any rank-`rank` map has.
    pub fn tail_energy(&self, rank: usize) -> f64 {
        self.singular_values.iter().skip(rank).map(|s| s * s).sum()
    }

    /// The up-projection `U_r`, `[rows, rank]`.
    pub fn up_projection(&self, rank: usize) -> Result<Matrix, StarKvError> {
        self.check_rank(rank)?;
        let data = (0..self.rows())
            .flat_map(|i| self.u.row(i)[..rank].iter().copied())
            .collect();
        Matrix::new(self.rows(), rank, data)
    }

    /// The down-projection `diag(σ_r) R_r`, `[rank, cols]`.
    pub fn down_projection(&self, rank: usize) -> Result<Matrix, StarKvError> {
        self.check_rank(rank)?;
        self.down_projection_with(&self.singular_values[..rank])
    }

    /// `diag(values) R_r` with `r = values.len()`: the down-projection of a student whose kept
    /// singular values were changed (soft-thresholded, or trained).
    pub fn down_projection_with(&self, values: &[f64]) -> Result<Matrix, StarKvError> {
        self.check_rank(values.len())?;
        let cols = self.cols();
        let data = values
            .iter()
            .enumerate()
            .flat_map(|(i, &value)| {
                self.right
                    .row(i)
                    .iter()
                    .map(move |&x| (value * f64::from(x)) as f32)
            })
            .collect();
        Matrix::new(values.len(), cols, data)
    }

    /// `U_r diag(σ_r) R_r`, the rank-`rank` approximation of `W`.
    pub fn reconstruct(&self, rank: usize) -> Result<Matrix, StarKvError> {
        self.up_projection(rank)?
            .matmul(&self.down_projection(rank)?)
    }

    fn check_rank(&self, rank: usize) -> Result<(), StarKvError> {
        if rank > self.max_rank() {
            return Err(StarKvError::InvalidArgument(format!(
                "rank {rank} exceeds the maximum {} of a {} × {} matrix",
                self.max_rank(),
                self.rows(),
                self.cols()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::{SecondMoment, DEFAULT_RELATIVE_FLOOR};

    fn random_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let data = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        Matrix::new(rows, cols, data).unwrap()
    }

    /// `Σ_i s_i a_i b_iᵀ` with orthogonal-ish random directions and a geometric spectrum: a
    /// structured (fast-decaying, low effective rank) matrix like real K/V projections.
    fn decaying_matrix(rows: usize, cols: usize, decay: f32, seed: u64) -> Matrix {
        let a = random_matrix(rows, rows.min(cols), seed);
        let b = random_matrix(rows.min(cols), cols, seed + 1);
        let k = rows.min(cols);
        let scaled: Vec<f32> = (0..k)
            .flat_map(|i| b.row(i).iter().map(move |&x| x * decay.powi(i as i32)))
            .collect();
        a.matmul(&Matrix::new(k, cols, scaled).unwrap()).unwrap()
    }

    fn relative_error(approx: &Matrix, exact: &Matrix) -> f64 {
        (approx.distance_sq(exact).unwrap() / exact.frobenius_sq()).sqrt()
    }

    #[test]
    fn full_rank_reconstructs_random_and_structured_matrices() {
        let cases = [
            ("random wide", random_matrix(16, 48, 1)),
            ("random tall", random_matrix(40, 12, 2)),
            ("decaying", decaying_matrix(24, 64, 0.7, 3)),
            ("rank two", {
                let a = random_matrix(20, 2, 4);
                a.matmul(&random_matrix(2, 30, 5)).unwrap()
            }),
        ];
        for (name, w) in cases {
            let f = Factorization::new(&w, None, name).unwrap();
            assert_eq!(f.max_rank(), w.rows().min(w.cols()), "{name}");
            let err = relative_error(&f.reconstruct(f.max_rank()).unwrap(), &w);
            assert!(err < 1e-6, "{name}: relative error {err}");
            assert!((f.total_energy() / w.frobenius_sq() - 1.0).abs() < 1e-6);
            assert!(f.singular_values().windows(2).all(|p| p[0] >= p[1]));
        }
    }

    #[test]
    fn truncation_error_equals_the_tail_energy() {
        for (seed, w) in [
            (0, random_matrix(32, 96, 10)),
            (1, decaying_matrix(32, 96, 0.85, 11)),
        ] {
            let f = Factorization::new(&w, None, "w").unwrap();
            for rank in [0, 1, 5, 16, 31, 32] {
                let err = f.reconstruct(rank).unwrap().distance_sq(&w).unwrap();
                let tail = f.tail_energy(rank);
                let scale = f.total_energy();
                assert!(
                    (err - tail).abs() <= 1e-5 * scale,
                    "case {seed} rank {rank}: error {err} vs tail {tail}"
                );
            }
        }
    }

    #[test]
    fn whitened_factors_are_exact_at_full_rank_and_optimal_in_the_whitened_metric() {
        let w = random_matrix(8, 20, 20);
        // Anisotropic activations: column j scaled by (j + 1), so inputs differ in energy.
        let mut x = random_matrix(200, 20, 21).into_data();
        for (index, value) in x.iter_mut().enumerate() {
            *value *= (index % 20 + 1) as f32;
        }
        let x = Matrix::new(200, 20, x).unwrap();
        let mut moment = SecondMoment::new(20);
        moment.add_rows(&x).unwrap();
        let whitener = Whitener::new(&moment, DEFAULT_RELATIVE_FLOOR).unwrap();
        let white = Factorization::new(&w, Some(&whitener), "w").unwrap();
        assert!(white.is_whitened());
        let full = white.reconstruct(8).unwrap();
        assert!(relative_error(&full, &w) < 1e-5);

        // Output error on the calibration rows: whitened tail energy × rows, and no worse
        // than the plain truncation of the same rank.
        let plain = Factorization::new(&w, None, "w").unwrap();
        let output_error = |approx: &Matrix| {
            let diff: Vec<f32> = approx
                .data()
                .iter()
                .zip(w.data())
                .map(|(a, b)| a - b)
                .collect();
            let diff = Matrix::new(8, 20, diff).unwrap();
            let xt: Vec<f32> = (0..20)
                .flat_map(|j| (0..200).map(move |i| (i, j)))
                .map(|(i, j)| x.row(i)[j])
                .collect();
            diff.matmul(&Matrix::new(20, 200, xt).unwrap())
                .unwrap()
                .frobenius_sq()
        };
        for rank in [1, 3, 6] {
            let white_err = output_error(&white.reconstruct(rank).unwrap());
            let plain_err = output_error(&plain.reconstruct(rank).unwrap());
            let predicted = white.tail_energy(rank) * 200.0;
            assert!(
                (white_err - predicted).abs() <= 1e-3 * predicted.max(1e-9),
                "rank {rank}: {white_err} vs {predicted}"
            );
            assert!(white_err <= plain_err * (1.0 + 1e-6), "rank {rank}");
        }
    }

    #[test]
    fn projections_have_the_documented_shapes_and_ranks_are_checked() {
        let w = random_matrix(6, 10, 30);
        let f = Factorization::new(&w, None, "w").unwrap();
        assert_eq!(f.up_projection(4).unwrap().shape(), [6, 4]);
        assert_eq!(f.down_projection(4).unwrap().shape(), [4, 10]);
        assert!(f.down_projection(7).is_err());
        let halved: Vec<f64> = f.singular_values()[..2].iter().map(|s| s / 2.0).collect();
        let half = f.down_projection_with(&halved).unwrap();
        let full = f.down_projection(2).unwrap();
        for (a, b) in half.data().iter().zip(full.data()) {
            assert!((2.0 * a - b).abs() < 1e-6);
        }
        let bad = Matrix::new(1, 2, vec![f32::NAN, 0.0]).unwrap();
        assert!(Factorization::new(&bad, None, "bad").is_err());
        assert!(Factorization::new(&Matrix::zeros(0, 3), None, "empty").is_err());
    }
}
