//! The model a STAR-KV selection asks for, built from the weights: latent layers (the method:
//! the cache stores latents) or the reference path (K/V weights replaced by their low-rank
//! reconstructions; full K/V cached). What was loaded is kept as [`StarKvInfo`] for logs,
//! `/metrics` and result files.

use starling_backend::Backend;
use starling_evict::{StarKvCache, StarKvFactors, StarKvSelection};
use starling_models::llama::LlamaModel;
use starling_models::{ModelConfig, WeightMap};
use starling_starkv::{AppliedSides, ProfileRef};

use super::EngineError;

/// The STAR-KV checkpoint an engine runs with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StarKvInfo {
    /// The rank profile (`aggressive`, `balanced`, `conservative`).
    pub profile: String,
    /// `latent` (the cache stores latents) or `reference` (full K/V of the reconstructions).
    pub cache: String,
    /// `both`, or an ablation: `keys` / `values`.
    pub factors: String,
    /// The checkpoint directory's name (never its full path: results and metrics leave the
    /// machine).
    pub checkpoint_name: String,
    /// Layers whose K/V the checkpoint compresses.
    pub compressed_layers: usize,
    /// K/V bytes per token the checkpoint's ranks need (bf16, unpadded), and the original's.
    pub kv_bytes_per_token_compressed: u64,
    /// K/V bytes per token of the original model (bf16).
    pub kv_bytes_per_token_original: u64,
    /// What identifies the checkpoint's contents in prefix-cache block hashes: its manifest
    /// as JSON (the weights' digest, ranks, calibration recipe and seed). Not serialized: it
    /// is long, and results name the checkpoint already.
    #[serde(skip)]
    pub checkpoint_identity: String,
}

/// Builds the model on `backend` from `weights`: plain when `selection` is `None`, else with the
/// selected checkpoint (refused when made for other weights or another profile).
pub fn load_model<B: Backend>(
    backend: &B,
    config: &ModelConfig,
    mut weights: WeightMap,
    selection: Option<&StarKvSelection>,
) -> Result<(LlamaModel<B>, Option<StarKvInfo>), EngineError> {
    let Some(selection) = selection else {
        return Ok((LlamaModel::load(backend, config, weights)?, None));
    };
    let profile: ProfileRef = selection.rank_profile.parse()?;
    let sides = match selection.factors {
        StarKvFactors::Both => AppliedSides::Both,
        StarKvFactors::Keys => AppliedSides::KeysOnly,
        StarKvFactors::Values => AppliedSides::ValuesOnly,
    };
    let dir = &selection.checkpoint;
    let (model, checkpoint) = match selection.cache {
        StarKvCache::Latent => {
            let (checkpoint, latents) =
                starling_starkv::load_latent_layers(dir, profile, sides, config, &weights)?;
            let model = LlamaModel::load_latent(backend, config, weights, latents)?;
            (model, checkpoint)
        }
        StarKvCache::Reference => {
            let checkpoint =
                starling_starkv::load_and_apply(dir, profile, sides, config, &mut weights)?;
            (LlamaModel::load(backend, config, weights)?, checkpoint)
        }
    };
    let report = &checkpoint.manifest.compression;
    let info = StarKvInfo {
        profile: profile.dir_name(),
        cache: selection.cache.name().to_owned(),
        factors: selection.factors.name().to_owned(),
        checkpoint_name: dir.file_name().map_or_else(
            || "checkpoint".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        ),
        compressed_layers: checkpoint.manifest.layers.len(),
        kv_bytes_per_token_compressed: report.kv_bytes_per_token_compressed,
        kv_bytes_per_token_original: report.kv_bytes_per_token_original,
        // Serializing a manifest of plain fields cannot fail; the debug form would still
        // tell checkpoints apart if it did.
        checkpoint_identity: serde_json::to_string(&checkpoint.manifest)
            .unwrap_or_else(|_| format!("{:?}", checkpoint.manifest)),
    };
    tracing::info!(
        "STAR-KV {} ({} factors, {} cache): {} of {} layers low-rank, {} of {} K/V bytes per \
         token",
        info.profile,
        info.factors,
        info.cache,
        info.compressed_layers,
        config.num_layers,
        info.kv_bytes_per_token_compressed,
        info.kv_bytes_per_token_original
    );
    Ok((model, Some(info)))
}
