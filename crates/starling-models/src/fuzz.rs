//! Entry points for the fuzz tests (`tests/fuzz.rs`, run by `cargo test`): each runs one loader
//! stage on untrusted bytes exactly as loading a file does, checks the promises the stage makes
//! about what it accepts (a broken promise panics: a finding), and returns its error otherwise.
//! Not a stable API.

use std::path::Path;

use crate::loader::gguf::check_directory;
use crate::loader::gguf_config::{config_from_gguf, Metadata};
use crate::loader::gguf_header::parse_gguf_header;
use crate::loader::hf_config::parse_hf_config;
use crate::loader::safetensors::parse_shard;
use crate::tokenizer::Tokenizer;
use crate::ModelError;

/// A GGUF file's header, config, tensor directory and tokenizer, as `load_model` and the
/// tokenizer read them (everything but dequantising tensor data).
pub fn gguf(bytes: &[u8]) -> Result<(), ModelError> {
    let len = bytes.len() as u64;
    let header = parse_gguf_header(bytes, len, Path::new("<fuzz>"))?;
    for info in &header.tensors {
        let end = info.file_offset_bytes.checked_add(info.size_bytes as u64);
        assert!(
            end.is_some_and(|end| end <= len),
            "accepted tensor `{}` ends past the file",
            info.name
        );
        assert_eq!(
            info.size_bytes % info.format.block_bytes(),
            0,
            "{}",
            info.name
        );
    }
    let config = config_from_gguf(&Metadata::new(&header.metadata), &header.tensors)?;
    config.validate()?;
    check_directory(&config, &header.tensors)?;
    Tokenizer::from_gguf_metadata(&header.metadata)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    Ok(())
}

/// One safetensors shard: its header and every tensor decoded to f32.
pub fn safetensors(bytes: &[u8]) -> Result<(), ModelError> {
    for (name, tensor) in parse_shard(bytes, Path::new("<fuzz>"))? {
        assert_eq!(
            tensor.shape().iter().product::<usize>(),
            tensor.data().len(),
            "tensor `{name}`"
        );
    }
    Ok(())
}

/// The text of a Hugging Face `config.json`, parsed and validated.
pub fn hf_config(text: &str) -> Result<(), ModelError> {
    parse_hf_config(text)?.validate()
}
