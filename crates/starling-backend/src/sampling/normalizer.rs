//! The log-normaliser behind every reported log-probability.
//!
//! Reported log-probabilities are the model's raw log-softmax, taken before penalties,
//! temperature and filtering (vLLM v1's default `logprobs_mode = "raw_logprobs"`), so they
//! describe what the model believed, not the processed distribution the token was drawn from.

use super::error::LogitsError;
use super::vector_math::{has_nan_or_positive_infinity, max_value, sum_exp_shifted};

/// Checks that `logits` can form a distribution and returns `log(sum(exp(logits)))`.
///
/// `-inf` logits are allowed (masked by the model); NaN and `+inf` are errors because the
/// softmax is undefined for them.
pub fn log_normalizer(logits: &[f32]) -> Result<f32, LogitsError> {
    if logits.is_empty() {
        return Err(LogitsError::Empty);
    }
    if has_nan_or_positive_infinity(logits) {
        let (token_id, &value) = (0u32..)
            .zip(logits)
            .find(|&(_, &logit)| logit.is_nan() || logit == f32::INFINITY)
            .ok_or(LogitsError::Empty)?;
        return Err(LogitsError::NonFinite { token_id, value });
    }
    let max_logit = max_value(logits);
    if max_logit == f32::NEG_INFINITY {
        return Err(LogitsError::NoCandidate);
    }
    Ok(max_logit + sum_exp_shifted(logits, max_logit).ln() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizer_makes_probabilities_sum_to_one() {
        let logits = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY, -4.0];
        let lse = log_normalizer(&logits).unwrap();
        let total: f64 = logits.iter().map(|&l| f64::from(l - lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Hand value: ln(e^1 + e^2 + e^3 + e^-4).
        let expected = (1f64.exp() + 2f64.exp() + 3f64.exp() + (-4f64).exp()).ln();
        assert!((f64::from(lse) - expected).abs() < 1e-5);
    }

    #[test]
    fn invalid_logits_are_rejected() {
        assert_eq!(log_normalizer(&[]), Err(LogitsError::Empty));
        assert!(matches!(
            log_normalizer(&[0.0, f32::NAN]),
            Err(LogitsError::NonFinite { token_id: 1, .. })
        ));
        assert!(matches!(
            log_normalizer(&[f32::INFINITY]),
            Err(LogitsError::NonFinite { token_id: 0, .. })
        ));
        assert_eq!(
            log_normalizer(&[f32::NEG_INFINITY; 3]),
            Err(LogitsError::NoCandidate)
        );
    }
}
