//! Benchmark errors.

/// Why a benchmark could not run or report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server could not be reached or answered badly outside a measured request.
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A dataset file or a server answer was not the JSON expected.
    #[error("{context}: {source}")]
    Json {
        /// What was being parsed.
        context: String,
        /// The failure.
        source: serde_json::Error,
    },
    /// The dataset gave nothing usable, or a parameter makes no sense.
    #[error("{0}")]
    Invalid(String),
    /// The server answered with an error status outside a measured request.
    #[error("server answered {status} to {what}: {body}")]
    Server {
        /// What was asked.
        what: String,
        /// HTTP status.
        status: u16,
        /// The body it sent.
        body: String,
    },
    /// Drawing the plot failed.
    #[error("plotting: {0}")]
    Plot(String),
}

impl BenchError {
    /// An [`BenchError::Io`] about `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
