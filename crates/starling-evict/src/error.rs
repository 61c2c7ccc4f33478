//! Eviction errors.

/// Errors raised while configuring, scoring or selecting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvictError {
    /// The compression configuration is not valid JSON or not a JSON object.
    #[error("compression config is not a JSON object: {0}")]
    Json(String),
    /// One field of the compression configuration is invalid.
    #[error("compression config field `{field}`: {reason}")]
    InvalidField {
        /// The offending field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Inputs whose sizes do not fit together.
    #[error("shape error: {0}")]
    Shape(String),
}
