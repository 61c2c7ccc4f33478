//! The error type of knowledge distillation.

use crate::StarKvError;

/// What can go wrong while distilling thresholds.
#[derive(Debug, thiserror::Error)]
pub enum DistillError {
    /// The tensor library failed (shape mismatch in the graph, backward of an unsupported op).
    #[error("autodiff: {0}")]
    Candle(#[from] candle_core::Error),
    /// Factors, budget or allocation failed in the rest of the crate.
    #[error(transparent)]
    StarKv(#[from] StarKvError),
    /// An argument is outside its valid range (no text, a zero window, bad hyper-parameters).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The loss or a gradient became non-finite.
    #[error("step {step}: non-finite {what}")]
    NonFinite {
        /// The optimisation step (0-based).
        step: usize,
        /// Which quantity.
        what: &'static str,
    },
}
