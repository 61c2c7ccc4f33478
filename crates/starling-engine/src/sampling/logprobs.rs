//! Log-probabilities reported to the client.
//!
//! They are the model's raw log-softmax, taken before penalties, temperature and filtering (vLLM
//! v1's default `logprobs_mode = "raw_logprobs"`), so they describe what the model believed, not the
//! processed distribution the token was drawn from.

use super::error::SamplingError;
use super::vector_math::{has_nan_or_positive_infinity, max_value, sum_exp_shifted};

/// Checks that `logits` can form a distribution and returns `log(sum(exp(logits)))`.
///
/// `-inf` logits are allowed (masked by the model); NaN and `+inf` are errors because the
/// softmax is undefined for them.
pub(super) fn log_normalizer(logits: &[f32]) -> Result<f32, SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    if has_nan_or_positive_infinity(logits) {
        let (token_id, &value) = (0u32..)
            .zip(logits)
            .find(|&(_, &logit)| logit.is_nan() || logit == f32::INFINITY)
            .ok_or(SamplingError::EmptyLogits)?;
        return Err(SamplingError::NonFiniteLogit { token_id, value });
    }
    let max_logit = max_value(logits);
    if max_logit == f32::NEG_INFINITY {
        return Err(SamplingError::NoCandidate);
    }
    Ok(max_logit + sum_exp_shifted(logits, max_logit).ln() as f32)
}

/// The `top_n` most likely tokens with their log-probabilities, most likely first (lower id first
/// on ties).
///
/// One pass with a small sorted buffer: `top_n` is at most 20, so nearly every logit is rejected
/// by a single comparison and no vocabulary-sized sort or index buffer is needed.
pub(super) fn top_logprobs(logits: &[f32], log_normalizer: f32, top_n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top_n + 1);
    if top_n == 0 {
        return best;
    }
    for (token_id, &logit) in (0u32..).zip(logits) {
        let full = best.len() == top_n;
        // Ids arrive in increasing order, so an equal logit never displaces an earlier id.
        if full && best.last().is_some_and(|&(_, worst)| logit <= worst) {
            continue;
        }
        let position = best.partition_point(|&(_, kept)| kept >= logit);
        best.insert(position, (token_id, logit));
        if best.len() > top_n {
            best.pop();
        }
    }
    best.into_iter()
        .map(|(token_id, logit)| (token_id, logit - log_normalizer))
        .collect()
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
        assert_eq!(log_normalizer(&[]), Err(SamplingError::EmptyLogits));
        assert!(matches!(
            log_normalizer(&[0.0, f32::NAN]),
            Err(SamplingError::NonFiniteLogit { token_id: 1, .. })
        ));
        assert!(matches!(
            log_normalizer(&[f32::INFINITY]),
            Err(SamplingError::NonFiniteLogit { token_id: 0, .. })
        ));
        assert_eq!(
            log_normalizer(&[f32::NEG_INFINITY; 3]),
            Err(SamplingError::NoCandidate)
        );
    }

    #[test]
    fn top_n_is_ordered_and_ties_keep_lower_id() {
        let logits = [0.0f32, 5.0, 1.0, 5.0, 3.0, 1.0];
        let top = top_logprobs(&logits, 0.0, 4);
        let ids: Vec<u32> = top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![1, 3, 4, 2]);
        assert_eq!(top[0].1, 5.0);
        assert!(top_logprobs(&logits, 0.0, 0).is_empty());
        assert_eq!(top_logprobs(&logits, 0.0, 99).len(), logits.len());
    }
}
