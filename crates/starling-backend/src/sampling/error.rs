//! Why a row of logits cannot be sampled.

/// Logits that form no distribution.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum LogitsError {
    /// The row has no logits at all.
    #[error("cannot sample from an empty logits vector")]
    Empty,
    /// A NaN or +inf logit, which has no probability meaning.
    #[error("logit of token {token_id} is {value}; logits must be finite or -inf")]
    NonFinite {
        /// The first token whose logit is invalid.
        token_id: u32,
        /// The invalid value.
        value: f32,
    },
    /// Every token is -inf (masked); nothing can be sampled.
    #[error("every token has a logit of -inf after masking; nothing can be sampled")]
    NoCandidate,
}
