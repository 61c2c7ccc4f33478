//! The latent execution path of a checkpoint: each compressed layer's factors become what the
//! model's latent layer projects with and the cache stores ([`LatentLayerWeights`]), its ranks
//! rounded up to the stored multiple ([`starling_kv::LATENT_RANK_MULTIPLE`]) with zero
//! components. The reference path ([`crate::load_and_apply`]) computes the same function with
//! full K/V; it is the oracle the latent path is tested against.
//!
//! An ablation that keeps one side whole (keys only or values only low-rank) stores that side
//! exactly: the whole side as its own latent (`W` as the down-projection, the identity as the
//! up-projection), so the cache holds what the ablation really costs.

use std::path::Path;

use starling_backend::HostTensor;
use starling_kv::stored_rank;
use starling_models::llama::{LatentLayerWeights, LatentRanks};
use starling_models::{LayerTensor, ModelConfig, WeightMap};

use crate::checkpoint::StarKvCheckpoint;
use crate::reference_path::load_profile;
use crate::{
    AppliedSides, KvShape, LayerProjections, Matrix, ModelProjections, ProfileRef, StarKvError,
};

/// Loads the `profile` checkpoint under `dir` for the model (`config`, `weights`; refused when
/// made for other weights or another profile) and returns it with every layer's latent factors
/// (`None`: the layer stays full) for [`starling_models::llama::LlamaModel::load_latent`].
pub fn load_latent_layers(
    dir: &Path,
    profile: impl Into<ProfileRef>,
    sides: AppliedSides,
    config: &ModelConfig,
    weights: &WeightMap,
) -> Result<(StarKvCheckpoint, Vec<Option<LatentLayerWeights>>), StarKvError> {
    let checkpoint = load_profile(dir, profile, config, weights)?;
    let layers = latent_layers(config, weights, &checkpoint.projections, sides)?;
    Ok((checkpoint, layers))
}

/// Every layer's latent factors of `projections` (for the sides chosen; `weights` supplies a
/// side an ablation keeps whole).
pub fn latent_layers(
    config: &ModelConfig,
    weights: &WeightMap,
    projections: &ModelProjections,
    sides: AppliedSides,
) -> Result<Vec<Option<LatentLayerWeights>>, StarKvError> {
    let shape = KvShape::of(config);
    if *projections.shape() != shape {
        return Err(StarKvError::InvalidArgument(format!(
            "projections for {:?} used with a model of {shape:?}",
            projections.shape()
        )));
    }
    projections
        .layers()
        .iter()
        .enumerate()
        .map(|(layer, p)| {
            p.as_ref()
                .map(|p| latent_weights(&shape, p, sides, weights, layer))
                .transpose()
        })
        .collect()
}

/// One layer's factors at stored ranks.
fn latent_weights(
    shape: &KvShape,
    p: &LayerProjections,
    sides: AppliedSides,
    weights: &WeightMap,
    layer: usize,
) -> Result<LatentLayerWeights, StarKvError> {
    let (hd, d) = (shape.head_dim, shape.hidden_size);
    let whole = |tensor: LayerTensor| -> Result<Matrix, StarKvError> {
        let name = tensor.name(layer);
        let t = weights
            .get(&name)
            .ok_or_else(|| StarKvError::InvalidArgument(format!("the model has no {name}")))?;
        Matrix::new(shape.kv_size(), d, t.data().to_vec())
    };
    // (down [r, hidden], up [rows, r]) per key head and for the values.
    let (keys, value): (Vec<(Matrix, Matrix)>, (Matrix, Matrix)) = {
        let keys = if sides == AppliedSides::ValuesOnly {
            let w_k = whole(LayerTensor::KProj)?;
            (0..shape.num_kv_heads)
                .map(|h| Ok((w_k.row_block(h * hd, (h + 1) * hd)?, identity(hd))))
                .collect::<Result<_, StarKvError>>()?
        } else {
            p.key_down
                .iter()
                .cloned()
                .zip(p.key_up.iter().cloned())
                .collect()
        };
        let value = if sides == AppliedSides::KeysOnly {
            (whole(LayerTensor::VProj)?, identity(shape.kv_size()))
        } else {
            (p.value_down.clone(), p.value_up.clone())
        };
        (keys, value)
    };
    let key_ranks: Vec<usize> = keys
        .iter()
        .map(|(down, _)| stored_rank(down.rows()))
        .collect();
    let key_width: usize = key_ranks.iter().sum();
    let mut key_down = Vec::with_capacity(key_width * d);
    let mut key_up = vec![0.0f32; hd * key_width];
    let mut offset = 0;
    for ((down, up), &stored) in keys.iter().zip(&key_ranks) {
        key_down.extend_from_slice(down.data());
        key_down.resize(key_down.len() + (stored - down.rows()) * d, 0.0);
        for row in 0..hd {
            key_up[row * key_width + offset..][..up.cols()].copy_from_slice(up.row(row));
        }
        offset += stored;
    }
    let value_rank = stored_rank(value.0.rows());
    let mut value_down = value.0.data().to_vec();
    value_down.resize(value_rank * d, 0.0);
    let mut value_up = vec![0.0f32; shape.kv_size() * value_rank];
    for row in 0..shape.kv_size() {
        value_up[row * value_rank..][..value.1.cols()].copy_from_slice(value.1.row(row));
    }
    let tensor = |shape: Vec<usize>, data: Vec<f32>| {
        HostTensor::new(shape, data).map_err(|e| StarKvError::InvalidArgument(e.to_string()))
    };
    Ok(LatentLayerWeights {
        ranks: LatentRanks {
            key_ranks,
            value_rank,
        },
        key_down: tensor(vec![key_width, d], key_down)?,
        key_up: tensor(vec![hd, key_width], key_up)?,
        value_down: tensor(vec![value_rank, d], value_down)?,
        value_up: tensor(vec![shape.kv_size(), value_rank], value_up)?,
    })
}

fn identity(n: usize) -> Matrix {
    let mut m = vec![0.0f32; n * n];
    for i in 0..n {
        m[i * n + i] = 1.0;
    }
    Matrix::new(n, n, m).unwrap_or_else(|_| Matrix::zeros(n, n))
}
