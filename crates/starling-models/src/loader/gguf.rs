//! Loading a GGUF file: header → config → shape checks against the directory → every tensor
//! read and dequantised to f32 in parallel, under canonical HF names.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use rayon::prelude::*;
use starling_backend::HostTensor;

use super::ggml_types::{to_f32, AlignedBytes};
use super::gguf_config::{config_from_gguf, Metadata};
use super::gguf_header::{read_gguf_header, GgufTensorInfo};
use super::gguf_names::{canonical_name, ROPE_FREQS};
use super::weight_names::expected_weights;
use super::WeightMap;
use crate::{ModelConfig, ModelError, RopeScaling};

/// What a GGUF file yields.
pub(crate) struct GgufModel {
    pub config: ModelConfig,
    pub weights: WeightMap,
    pub metadata: HashMap<String, Value>,
}

/// Reads the GGUF file at `path`.
pub(crate) fn load_gguf(path: &Path) -> Result<GgufModel, ModelError> {
    let header = read_gguf_header(path)?;
    let mut config = config_from_gguf(&Metadata::new(&header.metadata), &header.tensors)?;
    config.validate()?;
    // Checked on the directory, before minutes of dequantising a file that cannot be used.
    check_directory(&config, &header.tensors)?;

    // Largest first, so the long tensors start early and small ones fill in around them.
    let mut order: Vec<&GgufTensorInfo> = header.tensors.iter().collect();
    order.sort_by_key(|info| std::cmp::Reverse(info.size_bytes));
    let tensors = order
        .into_par_iter()
        .map(|info| Ok((info.name.clone(), read_tensor(path, info)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;

    let mut weights = WeightMap::new();
    for (name, tensor) in tensors {
        if name == ROPE_FREQS {
            config.rope.scaling = Some(RopeScaling::PerDimFactors(tensor.into_data()));
            continue;
        }
        match canonical_name(&name, config.architecture) {
            Some(canonical) => weights.insert(canonical, tensor),
            None => {
                tracing::warn!(tensor = %name, "unknown GGUF tensor kept under its own name");
                weights.insert(name, tensor)
            }
        };
    }
    config.validate()?;
    Ok(GgufModel {
        config,
        weights,
        metadata: header.metadata,
    })
}

/// Fails unless every tensor the config implies is in the directory with the implied shape.
pub(crate) fn check_directory(
    config: &ModelConfig,
    tensors: &[GgufTensorInfo],
) -> Result<(), ModelError> {
    let shapes: HashMap<String, &[usize]> = tensors
        .iter()
        .filter_map(|info| {
            let name = canonical_name(&info.name, config.architecture)?;
            Some((name, info.shape.as_slice()))
        })
        .collect();
    for (name, expected) in expected_weights(config) {
        match shapes.get(&name) {
            None => return Err(ModelError::MissingTensor { name }),
            Some(found) if *found != expected.as_slice() => {
                return Err(ModelError::ShapeMismatch {
                    name,
                    expected,
                    found: found.to_vec(),
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Reads one tensor's bytes through its own file handle (so tensors load in parallel) and
/// converts them to f32.
fn read_tensor(path: &Path, info: &GgufTensorInfo) -> Result<HostTensor, ModelError> {
    let io_error = |e| ModelError::io(path, e);
    let mut file = File::open(path).map_err(io_error)?;
    file.seek(SeekFrom::Start(info.file_offset_bytes))
        .map_err(io_error)?;
    let mut buffer = AlignedBytes::zeroed(info.size_bytes);
    file.read_exact(buffer.as_mut_slice()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ModelError::Truncated {
                path: path.to_owned(),
                what: format!("data of tensor `{}`", info.name),
            }
        } else {
            io_error(e)
        }
    })?;
    let data = to_f32(info.format, buffer.as_slice(), info.numel()).map_err(|reason| {
        ModelError::Malformed {
            path: path.to_owned(),
            reason: format!("tensor `{}`: {reason}", info.name),
        }
    })?;
    Ok(HostTensor::new(info.shape.clone(), data)?)
}
