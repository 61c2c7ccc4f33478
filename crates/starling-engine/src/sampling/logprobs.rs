//! Log-probabilities reported to the client.
//!
//! They are the model's raw log-softmax, taken before penalties, temperature and filtering (vLLM
//! v1's default `logprobs_mode = "raw_logprobs"`), so they describe what the model believed, not the
//! processed distribution the token was drawn from.

use super::error::SamplingError;

/// Checks that `logits` can form a distribution and returns `log(sum(exp(logits)))` (the shared
/// definition in `starling_backend::sampling`, with the engine's error type).
pub(super) fn log_normalizer(logits: &[f32]) -> Result<f32, SamplingError> {
    Ok(starling_backend::sampling::log_normalizer(logits)?)
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
    fn invalid_logits_map_to_sampling_errors() {
        assert_eq!(log_normalizer(&[]), Err(SamplingError::EmptyLogits));
        assert!(matches!(
            log_normalizer(&[0.0, f32::NAN]),
            Err(SamplingError::NonFiniteLogit { token_id: 1, .. })
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
