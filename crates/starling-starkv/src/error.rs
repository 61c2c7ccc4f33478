//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while factoring projections, allocating ranks or reading and
/// writing a STAR-KV checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum StarKvError {
    /// A matrix or vector does not have the size its shape (or its partner) implies.
    #[error("{what}: expected {expected} elements, found {found}")]
    SizeMismatch {
        /// Which value is wrong.
        what: String,
        /// The size the shape implies.
        expected: usize,
        /// The size found.
        found: usize,
    },
    /// An argument is outside its valid range (a rank above the matrix's, a share above 100%…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The model's weights lack a tensor this crate needs, or have it in another shape.
    #[error("model weights: {0}")]
    Weights(#[from] starling_models::ModelError),
    /// Running the original model over calibration text failed.
    #[error("running the model on calibration text: {0}")]
    Calibration(starling_models::ModelError),
    /// The linear-algebra routine did not converge (non-finite input, usually).
    #[error("{what}: {reason}")]
    Decomposition {
        /// The matrix being decomposed.
        what: String,
        /// The solver's explanation.
        reason: String,
    },
    /// No rank assignment can meet the requested KV-cache budget.
    #[error("the budget cannot be met: {0}")]
    BudgetInfeasible(String),
    /// The objective of the threshold optimisation failed or returned a non-finite value.
    #[error("threshold objective: {0}")]
    Objective(String),
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// A checkpoint file is unreadable or internally inconsistent.
    #[error("checkpoint {}: {reason}", path.display())]
    CorruptCheckpoint {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A well-formed checkpoint was made for another model (shape or weights differ).
    #[error("checkpoint {} does not match the model: {reason}", path.display())]
    ModelMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// Which property differs, with both values.
        reason: String,
    },
}

impl StarKvError {
    /// Wraps an I/O failure on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// A corrupt-checkpoint error on `path`.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::CorruptCheckpoint {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
