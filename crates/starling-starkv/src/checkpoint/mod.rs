//! A STAR-KV checkpoint: a directory with `projections.safetensors` (the A/B matrices) and
//! `manifest.json` ([`Manifest`]). Loading checks it against the model it is loaded with —
//! architecture, shapes and the weights' identity — and refuses a mismatch with an error.
//!
//! Writing goes through `*.partial` files renamed into place, projections first and the
//! manifest last, so a directory with a manifest is always complete.

mod identity;
mod manifest;
mod tensors;

use std::path::{Path, PathBuf};

use starling_kv::CacheDtype;
use starling_models::ModelConfig;

pub use identity::{weights_identity, IDENTITY_SCHEME};
pub use manifest::{
    loss_curve, CalibrationInfo, CurvePoint, LayerManifest, LayerThresholds, Manifest,
    ModelIdentity, ProjectionDtype, RefinementRecord, ThresholdRecord, CURVE_POINTS,
    FORMAT_VERSION, METHOD,
};
pub(crate) use tensors::read_projections;
#[cfg(test)]
pub(crate) use tensors::write_projections;

use crate::spectra::canonical_ids;
use crate::threshold::LearnedThresholds;
use crate::{
    BudgetTarget, CompressionReport, FactorKind, ModelProjections, RankProfile, StarKvError,
    UncompressedLayers,
};

/// File name of the projections inside a checkpoint directory.
pub const PROJECTIONS_FILE: &str = "projections.safetensors";

/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// How a checkpoint was produced (everything in the manifest that the projections do not
/// already say).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointSettings {
    /// The named profile, if the target was one.
    pub profile: Option<RankProfile>,
    /// The budget target.
    pub target: BudgetTarget,
    /// The allocation strategy's name.
    pub rank_strategy: String,
    /// Element type to store the projections in.
    pub projection_dtype: ProjectionDtype,
    /// Cache element type the KV-byte figures assume.
    pub cache_dtype: CacheDtype,
    /// Calibration data and steps.
    pub calibration: CalibrationInfo,
    /// Learned thresholds (canonical factor order), if any.
    pub thresholds: Option<LearnedThresholds>,
    /// The calibration seed.
    pub seed: u64,
}

/// Projections plus their manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct StarKvCheckpoint {
    /// The manifest.
    pub manifest: Manifest,
    /// The projections (as stored: rounded to bf16 when the manifest says so).
    pub projections: ModelProjections,
}

impl StarKvCheckpoint {
    /// Assembles a checkpoint for the model with `config` whose weights have identity
    /// `weights_sha256` (see [`weights_identity`]).
    pub fn new(
        config: &ModelConfig,
        weights_sha256: String,
        projections: ModelProjections,
        settings: CheckpointSettings,
    ) -> Result<Self, StarKvError> {
        let model = ModelIdentity::new(config, weights_sha256);
        if model.shape != *projections.shape() {
            return Err(StarKvError::InvalidArgument(format!(
                "projections for {:?} do not fit the model {:?}",
                projections.shape(),
                model.shape
            )));
        }
        let allocation = projections.allocation()?;
        let layers: Vec<LayerManifest> = allocation
            .layers()
            .iter()
            .enumerate()
            .filter_map(|(layer, ranks)| {
                ranks.as_ref().map(|r| LayerManifest {
                    layer,
                    key_ranks: r.key_ranks.clone(),
                    value_rank: r.value_rank,
                })
            })
            .collect();
        let uncompressed = allocation.uncompressed();
        let thresholds = settings
            .thresholds
            .as_ref()
            .map(|t| threshold_record(t, &model, &uncompressed))
            .transpose()?;
        let manifest = Manifest {
            method: METHOD.to_owned(),
            format_version: FORMAT_VERSION,
            profile: settings.profile,
            removed_permille: settings.target.permille(),
            rank_strategy: settings.rank_strategy,
            model,
            projection_dtype: settings.projection_dtype,
            uncompressed_layers: uncompressed,
            layers,
            compression: CompressionReport::of(&allocation, settings.cache_dtype),
            calibration: settings.calibration,
            thresholds,
            refinement: None,
            loss_curve: Vec::new(),
            seed: settings.seed,
        };
        Ok(Self {
            manifest,
            projections,
        })
    }

    /// Writes the checkpoint into `dir` (created if missing; existing files replaced).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), StarKvError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| StarKvError::io(dir, e))?;
        let projections = dir.join(PROJECTIONS_FILE);
        let partial = partial_path(&projections);
        tensors::write_projections(&partial, &self.projections, self.manifest.projection_dtype)?;
        std::fs::rename(&partial, &projections).map_err(|e| StarKvError::io(&projections, e))?;

        let manifest = dir.join(MANIFEST_FILE);
        let partial = partial_path(&manifest);
        let json = serde_json::to_vec_pretty(&self.manifest)
            .map_err(|e| StarKvError::corrupt(&manifest, format!("cannot serialise: {e}")))?;
        std::fs::write(&partial, json).map_err(|e| StarKvError::io(&partial, e))?;
        std::fs::rename(&partial, &manifest).map_err(|e| StarKvError::io(&manifest, e))
    }

    /// Loads the checkpoint in `dir` for the model with `config` whose weights have identity
    /// `weights_sha256`. A checkpoint for another method, format version, architecture, shape
    /// or set of weights is refused with [`StarKvError::ModelMismatch`] (or
    /// [`StarKvError::CorruptCheckpoint`] when the files disagree with each other).
    pub fn load(
        dir: impl AsRef<Path>,
        config: &ModelConfig,
        weights_sha256: &str,
    ) -> Result<Self, StarKvError> {
        let dir = dir.as_ref();
        let manifest = read_manifest(dir)?;
        check_model(dir, &manifest, config, weights_sha256)?;
        let shape = manifest.model.shape;
        let projections = tensors::read_projections(
            &dir.join(PROJECTIONS_FILE),
            &shape,
            &manifest.layers,
            manifest.projection_dtype,
        )?;
        check_consistent(dir, &manifest, &projections)?;
        Ok(Self {
            manifest,
            projections,
        })
    }
}

/// Reads and parses `dir/manifest.json`, checking only the method and format version (enough
/// for `starling info` to show ranks and bytes without the model's weights).
pub fn read_manifest(dir: impl AsRef<Path>) -> Result<Manifest, StarKvError> {
    let path = dir.as_ref().join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| StarKvError::io(&path, e))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| StarKvError::corrupt(&path, format!("invalid manifest: {e}")))?;
    if manifest.method != METHOD {
        return Err(StarKvError::corrupt(
            &path,
            format!("method `{}` is not `{METHOD}`", manifest.method),
        ));
    }
    if manifest.format_version != FORMAT_VERSION {
        return Err(StarKvError::corrupt(
            &path,
            format!(
                "format version {} (this build reads {FORMAT_VERSION})",
                manifest.format_version
            ),
        ));
    }
    Ok(manifest)
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn check_model(
    dir: &Path,
    manifest: &Manifest,
    config: &ModelConfig,
    weights_sha256: &str,
) -> Result<(), StarKvError> {
    let expected = ModelIdentity::new(config, weights_sha256.to_owned());
    let found = &manifest.model;
    let mismatch = |what: &str, made_for: String, given: String| StarKvError::ModelMismatch {
        path: dir.to_owned(),
        reason: format!("{what}: checkpoint made for {made_for}, model has {given}"),
    };
    if found.architecture != expected.architecture {
        let (a, b) = (found.architecture.clone(), expected.architecture.clone());
        return Err(mismatch("architecture", a, b));
    }
    if found.shape != expected.shape {
        let (a, b) = (
            format!("{:?}", found.shape),
            format!("{:?}", expected.shape),
        );
        return Err(mismatch("shape", a, b));
    }
    if found.attention_bias != expected.attention_bias {
        let (a, b) = (found.attention_bias, expected.attention_bias);
        return Err(mismatch("attention bias", a.to_string(), b.to_string()));
    }
    if found.identity_scheme != expected.identity_scheme {
        let (a, b) = (found.identity_scheme.clone(), expected.identity_scheme);
        return Err(mismatch("identity scheme", a, b));
    }
    if found.weights_sha256 != expected.weights_sha256 {
        let (a, b) = (found.weights_sha256.clone(), expected.weights_sha256);
        return Err(mismatch("weights", a, b));
    }
    Ok(())
}

/// The manifest's layer lists and figures must agree with the tensors read.
fn check_consistent(
    dir: &Path,
    manifest: &Manifest,
    projections: &ModelProjections,
) -> Result<(), StarKvError> {
    let path = dir.join(MANIFEST_FILE);
    let allocation = projections.allocation()?;
    if allocation.uncompressed() != manifest.uncompressed_layers {
        return Err(StarKvError::corrupt(
            &path,
            format!(
                "uncompressed layers {:?}, but the ranks leave {:?} uncompressed",
                manifest.uncompressed_layers,
                allocation.uncompressed()
            ),
        ));
    }
    let report = CompressionReport::of(&allocation, manifest.compression.cache_dtype);
    let stated = &manifest.compression;
    if report.kv_elements_per_token_compressed != stated.kv_elements_per_token_compressed
        || report.kv_bytes_per_token_compressed != stated.kv_bytes_per_token_compressed
        || report.projection_params_compressed != stated.projection_params_compressed
    {
        return Err(StarKvError::corrupt(
            &path,
            format!("stated figures {stated:?} disagree with the ranks ({report:?})"),
        ));
    }
    Ok(())
}

/// Groups canonical-order thresholds by layer.
fn threshold_record(
    learned: &LearnedThresholds,
    model: &ModelIdentity,
    uncompressed: &[usize],
) -> Result<ThresholdRecord, StarKvError> {
    let uncompressed = UncompressedLayers::from_list(uncompressed, model.shape.num_layers)?;
    let ids = canonical_ids(&model.shape, &uncompressed);
    if ids.len() != learned.alphas.len() {
        return Err(StarKvError::SizeMismatch {
            what: "learned thresholds".to_owned(),
            expected: ids.len(),
            found: learned.alphas.len(),
        });
    }
    let mut layers: Vec<LayerThresholds> = Vec::new();
    for (id, &alpha) in ids.iter().zip(&learned.alphas) {
        if layers.last().is_none_or(|l| l.layer != id.layer) {
            layers.push(LayerThresholds {
                layer: id.layer,
                keys: Vec::new(),
                value: 0.0,
            });
        }
        if let Some(entry) = layers.last_mut() {
            match id.kind {
                FactorKind::Key { .. } => entry.keys.push(alpha),
                FactorKind::Value => entry.value = alpha,
            }
        }
    }
    Ok(ThresholdRecord {
        sharpness: learned.sharpness,
        layers,
    })
}

#[cfg(test)]
mod tests;
