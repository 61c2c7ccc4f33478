//! The one error type of the sampling module: invalid request parameters and unusable logits.

use thiserror::Error;

/// Why a request's sampling parameters were rejected, or why a token could not be sampled.
///
/// Parameter variants name the offending field (see [`SamplingError::field`]) so the API layer can
/// report it as the OpenAI `param` of a 400 response.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SamplingError {
    /// A numeric parameter lies outside its allowed range.
    #[error("{field} must be in {allowed}, got {value}")]
    OutOfRange {
        /// The parameter's name as it appears in the request.
        field: &'static str,
        /// The allowed range in interval notation.
        allowed: &'static str,
        /// The value the request gave.
        value: f64,
    },
    /// `min_tokens` is larger than `max_tokens`, so the request could never finish normally.
    #[error("min_tokens must be in [0, max_tokens = {max_tokens}], got {min_tokens}")]
    MinTokensAboveMaxTokens {
        /// The requested minimum.
        min_tokens: usize,
        /// The requested maximum.
        max_tokens: usize,
    },
    /// A stop token id does not exist in the model's vocabulary.
    #[error("stop_token_ids must be in [0, {vocab_size}), got {token_id}")]
    StopTokenOutOfVocab {
        /// The offending id.
        token_id: u32,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A stop string is empty; it would match before any text.
    #[error("stop must contain only non-empty strings, got an empty string")]
    EmptyStopString,
    /// The model produced no logits.
    #[error("cannot sample from an empty logits vector")]
    EmptyLogits,
    /// The model produced a NaN or +inf logit, which has no probability meaning.
    #[error(
        "the model produced a non-finite logit ({value} for token {token_id}); logits must be \
         finite or -inf"
    )]
    NonFiniteLogit {
        /// The token whose logit is invalid.
        token_id: u32,
        /// The invalid value.
        value: f32,
    },
    /// Every token is masked (-inf), for example when min_tokens masks the only finite logit.
    #[error("every token has a logit of -inf after masking; nothing can be sampled")]
    NoCandidate,
}

impl SamplingError {
    /// Whether the request's parameters are at fault (a 400), rather than the logits the model
    /// produced for it.
    pub fn is_parameter_error(&self) -> bool {
        !matches!(
            self,
            SamplingError::EmptyLogits
                | SamplingError::NonFiniteLogit { .. }
                | SamplingError::NoCandidate
        )
    }

    /// The request field this error is about, or `None` when the error is not about a parameter.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            SamplingError::OutOfRange { field, .. } => Some(field),
            SamplingError::MinTokensAboveMaxTokens { .. } => Some("min_tokens"),
            SamplingError::StopTokenOutOfVocab { .. } => Some("stop_token_ids"),
            SamplingError::EmptyStopString => Some("stop"),
            SamplingError::EmptyLogits
            | SamplingError::NonFiniteLogit { .. }
            | SamplingError::NoCandidate => None,
        }
    }
}

impl From<starling_backend::sampling::LogitsError> for SamplingError {
    fn from(e: starling_backend::sampling::LogitsError) -> Self {
        use starling_backend::sampling::LogitsError;
        match e {
            LogitsError::Empty => SamplingError::EmptyLogits,
            LogitsError::NonFinite { token_id, value } => {
                SamplingError::NonFiniteLogit { token_id, value }
            }
            LogitsError::NoCandidate => SamplingError::NoCandidate,
        }
    }
}
