//! The one error type of this crate: loading configs and weights, and (for the tokenizer and
//! chat-template modules) building and applying tokenizers.

use std::path::PathBuf;

/// Everything that can go wrong while reading a model from disk or preparing it for use.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file or directory could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O failure.
        source: std::io::Error,
    },
    /// The file does not start with the magic bytes of the format it was opened as.
    #[error("{} is not a GGUF file (magic bytes {found:02x?}, expected \"GGUF\")", path.display())]
    BadMagic {
        /// The file involved.
        path: PathBuf,
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The file's format version is not one this loader reads.
    #[error("{}: unsupported GGUF version {version} (supported: 2, 3)", path.display())]
    UnsupportedVersion {
        /// The file involved.
        path: PathBuf,
        /// The version found in the header.
        version: u32,
    },
    /// The file ends before the data its header announces.
    #[error("{} is truncated: {what}", path.display())]
    Truncated {
        /// The file involved.
        path: PathBuf,
        /// What could not be read (a header field, a tensor's data).
        what: String,
    },
    /// The file's structure is inconsistent (bad type tag, impossible sizes, unparsable header).
    #[error("{} is malformed: {reason}", path.display())]
    Malformed {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The model architecture is not one Starling implements.
    #[error("unsupported model architecture `{0}` (supported: llama, qwen2)")]
    UnsupportedArchitecture(String),
    /// A tensor is stored in a data type (quantisation or float format) that cannot be converted.
    #[error("tensor `{tensor}` has unsupported data type {type_name}")]
    UnsupportedQuantType {
        /// The tensor's name as stored in the file.
        tensor: String,
        /// The data type's name (or its numeric id when unknown).
        type_name: String,
    },
    /// A tensor the model needs is absent.
    #[error("missing tensor `{name}`")]
    MissingTensor {
        /// The canonical (Hugging Face style) tensor name.
        name: String,
    },
    /// A tensor has a different shape than the config implies.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The canonical tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape found in the file.
        found: Vec<usize>,
    },
    /// A required metadata key is absent from the model file.
    #[error("missing metadata key `{key}`")]
    MissingMetadata {
        /// The key looked up.
        key: String,
    },
    /// The model configuration is missing, unparsable or inconsistent.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// A tokenizer could not be built or used.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A chat template could not be parsed or rendered.
    #[error("chat template error: {0}")]
    Template(String),
    /// A tensor could not be built.
    #[error(transparent)]
    Backend(#[from] starling_backend::BackendError),
}

impl ModelError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
