//! The soft threshold on one singular value and its derivative in the threshold.
//!
//! Singular values are scaled by their factor's largest, `σ̂ = σ / σ_max ∈ [0, 1]`, and the
//! threshold `α` lives in the same units. So the sharpness `s` means the same for every factor
//! whatever its weight scale: with `s = 50` the tanh knee is about `2/s = 4%` of `σ_max` wide.

/// `f(σ̂) = σ̂ · tanh(s (σ̂ − α))` above the threshold, `0` at or below it. Continuous in both
/// arguments (`tanh(0) = 0` at the threshold).
pub fn soft_threshold(sigma_hat: f64, alpha: f64, sharpness: f64) -> f64 {
    if sigma_hat > alpha {
        sigma_hat * (sharpness * (sigma_hat - alpha)).tanh()
    } else {
        0.0
    }
}

/// `∂f/∂α = −σ̂ · s · (1 − tanh²(s (σ̂ − α)))` above the threshold, `0` below.
pub fn soft_threshold_grad_alpha(sigma_hat: f64, alpha: f64, sharpness: f64) -> f64 {
    if sigma_hat > alpha {
        let t = (sharpness * (sigma_hat - alpha)).tanh();
        -sigma_hat * sharpness * (1.0 - t * t)
    } else {
        0.0
    }
}

/// The smooth stand-in for "is this component kept" used by the budget penalty,
/// `sigmoid(s (σ̂ − α))`, with its derivative in `α`: `(value, ∂value/∂α)`.
pub fn soft_keep(sigma_hat: f64, alpha: f64, sharpness: f64) -> (f64, f64) {
    let p = 1.0 / (1.0 + (-sharpness * (sigma_hat - alpha)).exp());
    (p, -sharpness * p * (1.0 - p))
}

/// The hard rank a threshold implies: `#{σ̂ > α}`.
pub fn effective_rank(sigma_hat: &[f64], alpha: f64) -> usize {
    sigma_hat.iter().filter(|&&s| s > alpha).count()
}

/// A threshold that keeps exactly the first `rank` of the non-increasing `sigma_hat`: midway
/// between the last kept and the first dropped value (`1` keeps none, since `σ̂ ≤ 1`).
pub fn alpha_for_rank(sigma_hat: &[f64], rank: usize) -> f64 {
    match (rank, sigma_hat.len()) {
        (0, _) | (_, 0) => 1.0,
        (r, n) if r >= n => sigma_hat[n - 1] / 2.0,
        (r, _) => (sigma_hat[r - 1] + sigma_hat[r]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_shape_and_derivative_match_finite_differences() {
        assert_eq!(soft_threshold(0.3, 0.4, 50.0), 0.0);
        assert!((soft_threshold(0.9, 0.1, 50.0) - 0.9).abs() < 1e-12);
        assert!(soft_threshold(0.41, 0.4, 50.0) < 0.41 * 0.5);
        let h = 1e-7;
        for (sigma, alpha) in [(0.5, 0.48), (0.5, 0.3), (0.9, 0.85), (0.2, 0.25)] {
            let fd = (soft_threshold(sigma, alpha + h, 50.0)
                - soft_threshold(sigma, alpha - h, 50.0))
                / (2.0 * h);
            let analytic = soft_threshold_grad_alpha(sigma, alpha, 50.0);
            assert!(
                (fd - analytic).abs() < 1e-5,
                "{sigma} {alpha}: {fd} vs {analytic}"
            );
            let (_, keep_grad) = soft_keep(sigma, alpha, 50.0);
            let keep_fd = (soft_keep(sigma, alpha + h, 50.0).0
                - soft_keep(sigma, alpha - h, 50.0).0)
                / (2.0 * h);
            assert!((keep_fd - keep_grad).abs() < 1e-5);
        }
    }

    #[test]
    fn alpha_for_rank_keeps_exactly_that_rank() {
        let sigma = [1.0, 0.6, 0.6, 0.2, 0.0];
        for rank in [0, 1, 3, 4, 5] {
            assert_eq!(
                effective_rank(&sigma, alpha_for_rank(&sigma, rank)),
                rank.min(4)
            );
        }
        // Ties cannot be split by a threshold: rank 2 of (0.6, 0.6) keeps one of them or both.
        assert_eq!(effective_rank(&sigma, alpha_for_rank(&sigma, 2)), 1);
    }
}
