//! What `starling model list` shows.

use std::path::{Path, PathBuf};

use crate::fetch::is_verified_in_cache;
use crate::home::model_dir;
use crate::Registry;

/// One known model and whether it is already in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// Alias to pass to `--model` / `starling model fetch`.
    pub alias: String,
    /// One-line description.
    pub description: String,
    /// Size of the GGUF file.
    pub size_bytes: u64,
    /// The cached file, when present and verified (by its marker; nothing is hashed here).
    pub cached_path: Option<PathBuf>,
}

/// The built-in models, with their cache state under the cache root `home`.
pub fn list_models(home: &Path) -> Vec<ModelEntry> {
    Registry::builtin().entries(home)
}

impl Registry {
    /// This registry's models, with their cache state under the cache root `home`.
    pub fn entries(&self, home: &Path) -> Vec<ModelEntry> {
        self.sources()
            .iter()
            .map(|source| {
                let path = model_dir(home, &source.alias).join(&source.file_name);
                ModelEntry {
                    alias: source.alias.clone(),
                    description: source.description.clone(),
                    size_bytes: source.size_bytes,
                    cached_path: is_verified_in_cache(source, &path).then_some(path),
                }
            })
            .collect()
    }
}
