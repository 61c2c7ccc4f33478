//! `projections.safetensors`: the A/B matrices of every compressed layer.
//!
//! Names: `layers.{l}.k_down.{h}` (`[r_h, hidden]`), `layers.{l}.k_up.{h}` (`[head_dim, r_h]`),
//! `layers.{l}.v_down` (`[r_v, hidden]`), `layers.{l}.v_up` (`[kv_size, r_v]`).

use std::collections::HashMap;
use std::path::Path;

use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::manifest::{LayerManifest, ProjectionDtype};
use crate::{KvShape, LayerProjections, Matrix, ModelProjections, StarKvError};

fn key_down(layer: usize, head: usize) -> String {
    format!("layers.{layer}.k_down.{head}")
}

fn key_up(layer: usize, head: usize) -> String {
    format!("layers.{layer}.k_up.{head}")
}

fn value_down(layer: usize) -> String {
    format!("layers.{layer}.v_down")
}

fn value_up(layer: usize) -> String {
    format!("layers.{layer}.v_up")
}

fn encode(matrix: &Matrix, dtype: ProjectionDtype) -> Vec<u8> {
    match dtype {
        ProjectionDtype::F32 => matrix.data().iter().flat_map(|x| x.to_le_bytes()).collect(),
        ProjectionDtype::Bf16 => matrix
            .data()
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
            .collect(),
    }
}

fn safetensors_dtype(dtype: ProjectionDtype) -> Dtype {
    match dtype {
        ProjectionDtype::F32 => Dtype::F32,
        ProjectionDtype::Bf16 => Dtype::BF16,
    }
}

/// Writes every compressed layer's matrices to `path` in `dtype`.
pub(crate) fn write_projections(
    path: &Path,
    projections: &ModelProjections,
    dtype: ProjectionDtype,
) -> Result<(), StarKvError> {
    let mut named: Vec<(String, &Matrix)> = Vec::new();
    for (layer, p) in projections.layers().iter().enumerate() {
        let Some(p) = p else { continue };
        for (head, (down, up)) in p.key_down.iter().zip(&p.key_up).enumerate() {
            named.push((key_down(layer, head), down));
            named.push((key_up(layer, head), up));
        }
        named.push((value_down(layer), &p.value_down));
        named.push((value_up(layer), &p.value_up));
    }
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = named
        .into_iter()
        .map(|(name, m)| (name, m.shape().to_vec(), encode(m, dtype)))
        .collect();
    let views = encoded
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(safetensors_dtype(dtype), shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| StarKvError::corrupt(path, format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path)
        .map_err(|e| StarKvError::corrupt(path, format!("cannot write: {e}")))
}

/// Reads the matrices `layers` and `shape` imply from `path`; every tensor must be present
/// with exactly the implied shape and `dtype`, and no other tensor may be present.
pub(crate) fn read_projections(
    path: &Path,
    shape: &KvShape,
    layers: &[LayerManifest],
    dtype: ProjectionDtype,
) -> Result<ModelProjections, StarKvError> {
    let bytes = std::fs::read(path).map_err(|e| StarKvError::io(path, e))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| StarKvError::corrupt(path, format!("not a safetensors file: {e}")))?;
    let mut expected_count = 0;
    let mut read = |name: String, rows: usize, cols: usize| -> Result<Matrix, StarKvError> {
        expected_count += 1;
        read_matrix(path, &file, &name, [rows, cols], dtype)
    };
    let mut out: Vec<Option<LayerProjections>> = vec![None; shape.num_layers];
    for entry in layers {
        let l = entry.layer;
        if l >= shape.num_layers || entry.key_ranks.len() != shape.num_kv_heads {
            return Err(StarKvError::corrupt(
                path,
                format!("manifest entry for layer {l} does not fit {shape:?}"),
            ));
        }
        let mut key_down_m = Vec::with_capacity(shape.num_kv_heads);
        let mut key_up_m = Vec::with_capacity(shape.num_kv_heads);
        for (head, &rank) in entry.key_ranks.iter().enumerate() {
            key_down_m.push(read(key_down(l, head), rank, shape.hidden_size)?);
            key_up_m.push(read(key_up(l, head), shape.head_dim, rank)?);
        }
        out[l] = Some(LayerProjections {
            key_down: key_down_m,
            key_up: key_up_m,
            value_down: read(value_down(l), entry.value_rank, shape.hidden_size)?,
            value_up: read(value_up(l), shape.kv_size(), entry.value_rank)?,
        });
    }
    if file.len() != expected_count {
        return Err(StarKvError::corrupt(
            path,
            format!(
                "{} tensors where the manifest implies {expected_count}",
                file.len()
            ),
        ));
    }
    ModelProjections::new(*shape, out).map_err(|e| StarKvError::corrupt(path, e.to_string()))
}

fn read_matrix(
    path: &Path,
    file: &SafeTensors<'_>,
    name: &str,
    shape: [usize; 2],
    dtype: ProjectionDtype,
) -> Result<Matrix, StarKvError> {
    let view = file
        .tensor(name)
        .map_err(|_| StarKvError::corrupt(path, format!("tensor `{name}` is missing")))?;
    if view.shape() != shape {
        return Err(StarKvError::corrupt(
            path,
            format!("tensor `{name}` is {:?}, expected {shape:?}", view.shape()),
        ));
    }
    if view.dtype() != safetensors_dtype(dtype) {
        return Err(StarKvError::corrupt(
            path,
            format!(
                "tensor `{name}` is {:?}, the manifest says {dtype:?}",
                view.dtype()
            ),
        ));
    }
    let data: Vec<f32> = match dtype {
        ProjectionDtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        ProjectionDtype::Bf16 => view
            .data()
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
    };
    Matrix::new(shape[0], shape[1], data)
        .map_err(|e| StarKvError::corrupt(path, format!("tensor `{name}`: {e}")))
}
