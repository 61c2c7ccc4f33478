//! Loading a Hugging Face model directory: `config.json` plus every `*.safetensors` shard,
//! with bf16 / f16 / f32 tensors converted to f32 in parallel.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use starling_backend::HostTensor;

use super::float_decode::{decode_floats, FloatEncoding};
use super::hf_config::read_hf_config;
use super::weight_names::is_norm_weight;
use super::WeightMap;
use crate::{ModelConfig, ModelError};

/// Reads the config and all weights of the HF model directory `dir`.
pub(crate) fn load_hf_dir(dir: &Path) -> Result<(ModelConfig, WeightMap), ModelError> {
    let config = read_hf_config(dir)?;
    config.validate()?;
    let shards = safetensors_files(dir)?;
    let mut weights = WeightMap::new();
    // One shard in memory at a time bounds peak memory to one shard plus the f32 weights.
    for shard in &shards {
        for (name, mut tensor) in read_shard(shard)? {
            if config.architecture.hf_norm_weights_are_offsets() && is_norm_weight(&name) {
                // Gemma's RMSNorm scales by `1 + weight`; llama.cpp's converter adds the one
                // too, so every loader hands the model the scale itself.
                tensor.data_mut().iter_mut().for_each(|w| *w += 1.0);
            }
            weights.insert(name, tensor);
        }
    }
    weights.check_complete(&config)?;
    Ok((config, weights))
}

/// The `*.safetensors` files of `dir`, sorted by name.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| ModelError::io(dir, e))?.path();
        if path.extension().is_some_and(|ext| ext == "safetensors") {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(ModelError::Malformed {
            path: dir.to_owned(),
            reason: "the directory has no *.safetensors files".to_owned(),
        });
    }
    files.sort();
    Ok(files)
}

fn read_shard(path: &Path) -> Result<Vec<(String, HostTensor)>, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
    parse_shard(&bytes, path)
}

/// Every tensor of one safetensors shard's bytes, as f32; `path` only names it in errors.
pub(crate) fn parse_shard(
    bytes: &[u8],
    path: &Path,
) -> Result<Vec<(String, HostTensor)>, ModelError> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Malformed {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    file.tensors()
        .into_par_iter()
        .map(|(name, view)| {
            let encoding = match view.dtype() {
                Dtype::F32 => FloatEncoding::F32,
                Dtype::F16 => FloatEncoding::F16,
                Dtype::BF16 => FloatEncoding::Bf16,
                other => {
                    return Err(ModelError::UnsupportedQuantType {
                        tensor: name,
                        type_name: format!("{other} (supported: BF16, F16, F32)"),
                    })
                }
            };
            let data =
                decode_floats(encoding, view.data()).map_err(|reason| ModelError::Malformed {
                    path: path.to_owned(),
                    reason: format!("tensor `{name}`: {reason}"),
                })?;
            let tensor = HostTensor::new(view.shape().to_vec(), data)?;
            Ok((name, tensor))
        })
        .collect()
}
