//! Turning a model on disk (a GGUF file or a Hugging Face directory) into a [`ModelConfig`]
//! and f32 weights under canonical HF names, so the forward pass is format-agnostic.

mod float_decode;
mod ggml_types;
pub(crate) mod gguf;
pub(crate) mod gguf_config;
pub(crate) mod gguf_header;
mod gguf_names;
pub(crate) mod hf_config;
pub(crate) mod safetensors;
mod synthetic;
mod weight_map;
pub mod weight_names;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use candle_core::quantized::gguf_file::Value as GgufValue;
pub use synthetic::synthetic_weights;
pub use weight_map::WeightMap;
pub use weight_names::{expected_weight_shapes, LayerTensor};

use crate::{ModelConfig, ModelError};

/// Where a model was loaded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face directory (`config.json` + `*.safetensors`).
    HfDir(PathBuf),
}

/// A model read from disk, ready for a forward pass to take its weights.
pub struct LoadedModel {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Every tensor, f32, under canonical HF names (checked complete against `config`).
    pub weights: WeightMap,
    /// Where it came from.
    pub source: ModelSource,
    /// The GGUF metadata (tokenizer vocabulary, merges, chat template…), for GGUF sources.
    pub gguf_metadata: Option<HashMap<String, GgufValue>>,
    /// Wall time spent loading.
    pub load_ms: u64,
}

/// Summarises instead of printing every weight and vocabulary entry.
impl fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedModel")
            .field("config", &self.config)
            .field("weights", &self.weights)
            .field("source", &self.source)
            .field(
                "gguf_metadata_keys",
                &self.gguf_metadata.as_ref().map(HashMap::len),
            )
            .field("load_ms", &self.load_ms)
            .finish()
    }
}

/// Loads the model at `path`: a directory is read as a Hugging Face model directory, a file
/// as GGUF. The config is validated and every tensor it implies is checked present with the
/// implied shape before this returns.
pub fn load_model(path: impl AsRef<Path>) -> Result<LoadedModel, ModelError> {
    let path = path.as_ref();
    let started = Instant::now();
    let kind = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    let (config, weights, source, gguf_metadata) = if kind.is_dir() {
        let (config, weights) = safetensors::load_hf_dir(path)?;
        (config, weights, ModelSource::HfDir(path.to_owned()), None)
    } else {
        let model = gguf::load_gguf(path)?;
        (
            model.config,
            model.weights,
            ModelSource::Gguf(path.to_owned()),
            Some(model.metadata),
        )
    };
    let load_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        path = %path.display(),
        tensors = weights.len(),
        params = weights.num_params(),
        load_ms,
        "model loaded"
    );
    Ok(LoadedModel {
        config,
        weights,
        source,
        gguf_metadata,
        load_ms,
    })
}
