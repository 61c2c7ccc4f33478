//! The STAR-KV checkpoint the demo runs its latent arm with: calibrated once per model and
//! cached like a model, under `$STARLING_HOME/star-kv/<weights identity>/<recipe>/`.
//!
//! The folder is keyed by the weights' identity (`tensor-sha256-v1`, the one every checkpoint
//! records), so another model — or the same model in another format — never finds this one;
//! loading re-checks the identity anyway. The recipe is the cheapest one worth showing: the
//! whitened SVD of the K/V projections over [`CALIBRATION_TOKENS`] essay tokens, greedy ranks,
//! no distillation (16 distillation steps cost 6-20 s each on 2 cores; see `starling
//! calibrate` for the full recipe). A calibration writes into a scratch folder beside the
//! cache entry and renames it into place, so a failure or an interrupt leaves nothing that a
//! later run could mistake for a checkpoint.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use starling_backend::Backend;
use starling_starkv::checkpoint::{read_manifest, weights_identity, MANIFEST_FILE};
use starling_starkv::RankProfile;

use crate::commands::calibrate::{stage_bar, write_checkpoints, CalibrateArgs, CalibrationModel};
use crate::session::ModelSource;

/// Calibration tokens of the demo's checkpoint: 8 windows of 512. Measured on SmolLM2-135M,
/// 2 CPU cores shared with another build, balanced profile (KL to the original model on 4 × 64
/// held-out tokens after 512 of context, `bench quality`): 2048 tokens 12 s, KL 0.085; 4096
/// tokens 17-24 s, KL 0.081; 16384 tokens (calibrate's default) 89 s, KL 0.084; the weight-only
/// SVD 0.9 s but KL 1.43. Past a few windows more text buys nothing measurable; 4096 keeps a
/// margin over 2048 at a cost the first demo run can carry.
pub const CALIBRATION_TOKENS: usize = 4096;

/// The recipe's folder name: a new recipe gets a new folder instead of reusing an old one.
const RECIPE: &str = "whitened-svd-4096";

/// Hex digits of the weights identity in the folder name (the manifest holds all 64).
const IDENTITY_PREFIX_CHARS: usize = 16;

/// A checkpoint ready to load: the `starling calibrate --output` folder (one sub-folder per
/// profile) and whether this run made it.
pub struct CachedCheckpoint {
    /// The folder to pass as `checkpoint` in a STAR-KV selection.
    pub dir: PathBuf,
    /// Seconds spent calibrating in this run; `None` when it was reused.
    pub calibrated_s: Option<f64>,
}

/// The cached checkpoint of `profile` for `source`'s weights, calibrated on `backend` first
/// when there is none.
pub fn ensure<B: Backend>(
    backend: &B,
    source: &ModelSource,
    model_name: &str,
    profile: RankProfile,
) -> Result<CachedCheckpoint> {
    let weights = source
        .weights
        .as_ref()
        .context("a STAR-KV checkpoint is calibrated from real weights")?;
    let home = starling_hub::FetchOptions::from_env()?.home;
    let identity = weights_identity(weights);
    let dir = cache_dir(&home, &identity);
    if is_complete(&dir, profile, &identity) {
        return Ok(CachedCheckpoint {
            dir,
            calibrated_s: None,
        });
    }
    eprintln!(
        "STAR-KV: calibrating a {profile} checkpoint for {model_name} once (whitened SVD over \
         {CALIBRATION_TOKENS} essay tokens, no distillation; under a minute on 2 cores), cached \
         in {}",
        dir.display()
    );
    let started = Instant::now();
    let parent = dir.parent().context("the cache folder has a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Dot-prefixed and unique to this process: never taken for a recipe folder.
    let scratch = Scratch(parent.join(format!(".{RECIPE}-{}", std::process::id())));
    scratch.clear()?;
    let args = CalibrateArgs::svd_only(model_name, profile, CALIBRATION_TOKENS, scratch.0.clone());
    let model = CalibrationModel {
        name: model_name,
        path: &source.path,
        config: &source.config,
        weights,
        tokenizer: &source.tokenizer,
        identity: &identity,
    };
    // Two stages (text and factors) and the one profile.
    let bar = stage_bar(3);
    let lines = write_checkpoints(backend, &model, &args, &bar, started)?;
    // An incomplete folder from an earlier failure is replaced, not merged into.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&scratch.0, &dir)
        .with_context(|| format!("moving the checkpoint into {}", dir.display()))?;
    // The summary names the scratch folder; say where the checkpoint lives now.
    let (scratch_name, final_name) = (scratch.0.display().to_string(), dir.display().to_string());
    for line in lines.iter().skip(1) {
        eprintln!(
            "STAR-KV: {}",
            line.trim().replace(&scratch_name, &final_name)
        );
    }
    Ok(CachedCheckpoint {
        dir,
        calibrated_s: Some(started.elapsed().as_secs_f64()),
    })
}

/// `$STARLING_HOME/star-kv/<identity prefix>/<recipe>`.
fn cache_dir(home: &Path, identity: &str) -> PathBuf {
    let prefix: String = identity.chars().take(IDENTITY_PREFIX_CHARS).collect();
    home.join("star-kv").join(prefix).join(RECIPE)
}

/// Whether `dir` holds `profile`'s checkpoint made for weights of `identity` (its manifest
/// reads and names them; the projections are checked when the engine loads them).
fn is_complete(dir: &Path, profile: RankProfile, identity: &str) -> bool {
    let profile_dir = dir.join(profile.name());
    if !profile_dir.join(MANIFEST_FILE).is_file() {
        return false;
    }
    match read_manifest(&profile_dir) {
        Ok(manifest) => {
            manifest.model.weights_sha256 == identity && manifest.profile == Some(profile)
        }
        Err(e) => {
            tracing::warn!("recalibrating: {e}");
            false
        }
    }
}

/// A scratch folder removed when dropped (after a successful rename there is nothing left to
/// remove).
struct Scratch(PathBuf);

impl Scratch {
    /// Removes what an earlier run of the same process id may have left.
    fn clear(&self) -> Result<()> {
        if self.0.exists() {
            std::fs::remove_dir_all(&self.0)
                .with_context(|| format!("removing {}", self.0.display()))?;
        }
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: the folder is gone already when the rename succeeded.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_is_keyed_by_the_weights_identity_and_the_recipe() {
        let home = Path::new("home");
        let a = cache_dir(home, &"ab".repeat(32));
        let b = cache_dir(home, &"cd".repeat(32));
        assert_ne!(a, b);
        assert_eq!(
            a,
            Path::new("home/star-kv/abababababababab/whitened-svd-4096")
        );
    }

    #[test]
    fn a_missing_or_unreadable_manifest_is_not_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let identity = "0".repeat(64);
        assert!(!is_complete(dir.path(), RankProfile::Balanced, &identity));
        let profile_dir = dir.path().join("balanced");
        std::fs::create_dir_all(&profile_dir).unwrap();
        std::fs::write(profile_dir.join(MANIFEST_FILE), "{ not json").unwrap();
        assert!(!is_complete(dir.path(), RankProfile::Balanced, &identity));
    }

    #[test]
    fn a_dropped_scratch_folder_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".scratch");
        std::fs::create_dir_all(path.join("balanced")).unwrap();
        drop(Scratch(path.clone()));
        assert!(!path.exists());
    }
}
