//! Turning a user's `--model` argument into something loadable.

use std::fs;
use std::path::{Path, PathBuf};

use crate::gguf_magic::has_gguf_magic;
use crate::{fetch, FetchOptions, HubError};

/// Where a model's weights and tokenizer are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelLocation {
    /// A single GGUF file (weights, tokenizer and chat template inside).
    Gguf(PathBuf),
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    HfDir(PathBuf),
}

/// Resolves `arg`, in this order:
///
/// 1. a registry alias: fetched (or found in the cache) and returned as [`ModelLocation::Gguf`];
/// 2. a path to a file: must start with the GGUF magic, returned as [`ModelLocation::Gguf`];
/// 3. a directory with `config.json`: must also hold `tokenizer.json` and at least one
///    `*.safetensors`, returned as [`ModelLocation::HfDir`];
/// 4. anything else: an error listing the known aliases.
///
/// Aliases win over same-named relative paths; write `./smollm2-135m` to mean the directory.
pub fn resolve_model(arg: &str, options: &FetchOptions) -> Result<ModelLocation, HubError> {
    if options.registry.get(arg).is_some() {
        return fetch(arg, options).map(ModelLocation::Gguf);
    }
    let path = Path::new(arg);
    if path.is_file() {
        if has_gguf_magic(path)? {
            return Ok(ModelLocation::Gguf(path.to_path_buf()));
        }
        return Err(HubError::NotGguf {
            path: path.to_path_buf(),
            known: options.registry.known_aliases(),
        });
    }
    if path.is_dir() && path.join("config.json").is_file() {
        check_hf_dir(path)?;
        return Ok(ModelLocation::HfDir(path.to_path_buf()));
    }
    Err(HubError::UnknownModel {
        arg: arg.to_owned(),
        known: options.registry.known_aliases(),
    })
}

/// Checks that a directory with config.json also has weights and a tokenizer.
fn check_hf_dir(dir: &Path) -> Result<(), HubError> {
    let mut missing = Vec::new();
    if !has_safetensors(dir)? {
        missing.push("*.safetensors".to_owned());
    }
    if !dir.join("tokenizer.json").is_file() {
        missing.push("tokenizer.json".to_owned());
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(HubError::HfDirIncomplete {
            path: dir.to_path_buf(),
            missing,
        })
    }
}

/// True when the directory holds at least one `*.safetensors` file.
fn has_safetensors(dir: &Path) -> Result<bool, HubError> {
    let entries = fs::read_dir(dir).map_err(|e| HubError::io("list directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| HubError::io("list directory", dir, e))?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "safetensors") && path.is_file() {
            return Ok(true);
        }
    }
    Ok(false)
}
