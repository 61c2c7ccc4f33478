//! The reference execution path of a STAR-KV checkpoint: each compressed layer's `W_k` and `W_v`
//! are replaced by their low-rank reconstructions (`B_h A_h` per key head, `B_v A_v`) in the
//! host weights, before any backend sees them; biases stay as they are.
//!
//! Why this is the latent path's output: caching the latent `x A_hᵀ` and reconstructing
//! `latent B_hᵀ + b_h` yields `x (B_h A_h)ᵀ + b_h`, exactly what the reconstructed weight
//! computes (up to f32 summation order), and RoPE is applied after either. It therefore works
//! on every backend (it happens on host weights) and is the oracle the latent paged layout and
//! latent path ([`crate::load_latent_layers`]) is tested against. It does not reduce KV memory:
//! the cache holds full K/V rows.

use std::path::{Path, PathBuf};

use starling_models::{LayerTensor, ModelConfig, WeightMap};

use crate::checkpoint::{weights_identity, StarKvCheckpoint, MANIFEST_FILE};
use crate::{KvShape, Matrix, ModelProjections, ProfileRef, StarKvError};

/// Which factors of a checkpoint the reference path applies. Keys or values alone are
/// ablations: they show which side of a profile costs the quality.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AppliedSides {
    /// Keys and values (the method).
    #[default]
    Both,
    /// Only the key factors; `W_v` stays whole.
    KeysOnly,
    /// Only the value factor; `W_k` stays whole.
    ValuesOnly,
}

impl AppliedSides {
    fn keys(self) -> bool {
        self != Self::ValuesOnly
    }

    fn values(self) -> bool {
        self != Self::KeysOnly
    }
}

/// Replaces `W_k` and `W_v` of every layer `projections` compress by their reconstructions.
/// Returns how many layers changed. The shapes must be `config`'s; nothing is changed when
/// they are not.
pub fn apply_projections(
    config: &ModelConfig,
    weights: &mut WeightMap,
    projections: &ModelProjections,
) -> Result<usize, StarKvError> {
    apply_projection_sides(config, weights, projections, AppliedSides::Both)
}

/// [`apply_projections`] for the chosen `sides` only.
pub fn apply_projection_sides(
    config: &ModelConfig,
    weights: &mut WeightMap,
    projections: &ModelProjections,
    sides: AppliedSides,
) -> Result<usize, StarKvError> {
    let shape = KvShape::of(config);
    if *projections.shape() != shape {
        return Err(StarKvError::InvalidArgument(format!(
            "projections for {:?} applied to a model of {shape:?}",
            projections.shape()
        )));
    }
    // Reconstruct everything first, so a failure leaves the weights untouched.
    let mut replacements = Vec::new();
    let mut layers = 0;
    for (layer, p) in projections.layers().iter().enumerate() {
        let Some(p) = p else { continue };
        layers += 1;
        if sides.keys() {
            replacements.push((LayerTensor::KProj, layer, p.reconstructed_key_weight()?));
        }
        if sides.values() {
            replacements.push((LayerTensor::VProj, layer, p.reconstructed_value_weight()?));
        }
    }
    for (tensor, layer, matrix) in &replacements {
        let want = tensor.shape(config);
        if matrix.shape().as_slice() != want.as_slice() {
            return Err(StarKvError::InvalidArgument(format!(
                "reconstructed {} is {:?}, the model's is {want:?}",
                tensor.name(*layer),
                matrix.shape()
            )));
        }
    }
    for (tensor, layer, matrix) in replacements {
        replace(config, weights, tensor, layer, &matrix)?;
    }
    Ok(layers)
}

fn replace(
    config: &ModelConfig,
    weights: &mut WeightMap,
    tensor: LayerTensor,
    layer: usize,
    matrix: &Matrix,
) -> Result<(), StarKvError> {
    let name = tensor.name(layer);
    let mut host = weights.take(&name, &tensor.shape(config))?;
    host.data_mut().copy_from_slice(matrix.data());
    weights.insert(name, host);
    Ok(())
}

/// The checkpoint directory of `profile` under `dir`: `dir` itself when it holds a manifest
/// (a single-profile checkpoint), else `dir/<profile>` as `starling calibrate` writes them.
pub fn profile_dir(dir: &Path, profile: impl Into<ProfileRef>) -> PathBuf {
    if dir.join(MANIFEST_FILE).is_file() {
        dir.to_owned()
    } else {
        dir.join(profile.into().dir_name())
    }
}

/// Loads the `profile` checkpoint under `dir` for the model (`config`, `weights`), refusing one
/// made for other weights or for another profile.
pub fn load_profile(
    dir: &Path,
    profile: impl Into<ProfileRef>,
    config: &ModelConfig,
    weights: &WeightMap,
) -> Result<StarKvCheckpoint, StarKvError> {
    let profile = profile.into();
    let path = profile_dir(dir, profile);
    let identity = weights_identity(weights);
    let checkpoint = StarKvCheckpoint::load(&path, config, &identity)?;
    if !profile.matches(&checkpoint.manifest) {
        let manifest = &checkpoint.manifest;
        let made = manifest.profile.map_or_else(
            || format!("{}‰ removed, no named profile", manifest.removed_permille),
            |p| p.name().to_owned(),
        );
        return Err(StarKvError::InvalidArgument(format!(
            "rank_profile `{profile}` was asked for, but {} is `{made}`",
            path.display()
        )));
    }
    Ok(checkpoint)
}

/// [`load_profile`], then [`apply_projection_sides`] of its `sides`. Returns the checkpoint
/// (its manifest says what was applied).
pub fn load_and_apply(
    dir: &Path,
    profile: impl Into<ProfileRef>,
    sides: AppliedSides,
    config: &ModelConfig,
    weights: &mut WeightMap,
) -> Result<StarKvCheckpoint, StarKvError> {
    let checkpoint = load_profile(dir, profile, config, weights)?;
    apply_projection_sides(config, weights, &checkpoint.projections, sides)?;
    Ok(checkpoint)
}
