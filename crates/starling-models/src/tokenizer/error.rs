//! Errors from building or using a [`crate::tokenizer::Tokenizer`].

use std::path::PathBuf;

/// Everything that can go wrong while building a tokenizer or running it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata has no `{key}`; the file carries no usable tokenizer")]
    MissingKey {
        /// The key, e.g. `tokenizer.ggml.tokens`.
        key: String,
    },

    /// A GGUF metadata key has a value of the wrong type.
    #[error("GGUF metadata `{key}` should be {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What it should hold, e.g. "an array of strings".
        expected: &'static str,
    },

    /// The GGUF tokenizer model is not one Starling implements yet.
    #[error("GGUF tokenizer model `{model}` is not supported yet (only `gpt2`, byte-level BPE, is); use a Hugging Face model directory with tokenizer.json for this model")]
    Unsupported {
        /// The value of `tokenizer.ggml.model`, e.g. `llama` (SentencePiece).
        model: String,
    },

    /// The GGUF pre-tokenizer type (`tokenizer.ggml.pre`) is unknown.
    #[error("GGUF pre-tokenizer `{pre}` is not supported; supported: {supported}")]
    UnknownPreTokenizer {
        /// The value of `tokenizer.ggml.pre`.
        pre: String,
        /// The supported names, comma separated.
        supported: String,
    },

    /// A merge rule is not two tokens separated by one space.
    #[error("GGUF merge #{index} `{merge}` is not of the form `left right`")]
    BadMerge {
        /// Position in `tokenizer.ggml.merges`.
        index: usize,
        /// The rule as stored.
        merge: String,
    },

    /// A special-token id points outside the vocabulary.
    #[error("`{key}` is {id}, outside the vocabulary of {vocab_size} tokens")]
    TokenIdOutOfRange {
        /// The key that held the id.
        key: String,
        /// The id.
        id: u64,
        /// The vocabulary size.
        vocab_size: usize,
    },

    /// The `tokenizers` library refused to build the tokenizer.
    #[error("could not build the tokenizer ({what}): {message}")]
    Build {
        /// Which part failed, e.g. "BPE model".
        what: &'static str,
        /// The library's message.
        message: String,
    },

    /// A tokenizer file could not be read.
    #[error("could not read `{}`: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A tokenizer file is not valid JSON of the expected shape.
    #[error("could not parse `{}`: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// Encoding text failed.
    #[error("could not encode text: {message}")]
    Encode {
        /// The library's message.
        message: String,
    },

    /// Decoding token ids failed.
    #[error("could not decode token ids: {message}")]
    Decode {
        /// The library's message.
        message: String,
    },
}
