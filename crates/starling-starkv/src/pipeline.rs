//! The weight-only calibration path end to end: factors → spectra → ranks → projections →
//! checkpoint. Distillation will start from its output.

use starling_kv::CacheDtype;
use starling_models::ModelConfig;

use crate::checkpoint::{CalibrationInfo, CheckpointSettings, ProjectionDtype, StarKvCheckpoint};
use crate::{
    allocate_ranks, BudgetTarget, CacheBudget, ModelFactors, ModelProjections, ModelSpectra,
    RankProfile, RankStrategy, StarKvError,
};

/// What to build from a model's factors.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationPlan {
    /// The named profile, if the target is one.
    pub profile: Option<RankProfile>,
    /// The share of K/V cache elements per token to remove.
    pub target: BudgetTarget,
    /// How ranks are chosen.
    pub strategy: RankStrategy,
    /// Element type of the stored projections.
    pub projection_dtype: ProjectionDtype,
    /// Cache element type the KV-byte figures assume.
    pub cache_dtype: CacheDtype,
    /// Calibration data and steps, recorded in the manifest (`whitened` is taken from the
    /// factors).
    pub calibration: CalibrationInfo,
    /// The seed recorded in the manifest.
    pub seed: u64,
}

impl CalibrationPlan {
    /// A plan for a named profile, with f32 projections, a bf16 cache and no calibration data.
    pub fn for_profile(profile: RankProfile, strategy: RankStrategy, seed: u64) -> Self {
        Self {
            profile: Some(profile),
            target: profile.target(),
            strategy,
            projection_dtype: ProjectionDtype::F32,
            cache_dtype: CacheDtype::BF16,
            calibration: CalibrationInfo::default(),
            seed,
        }
    }
}

/// Allocates ranks for `plan` over `factors` and truncates them into a checkpoint for the
/// model with `config` and weight identity `weights_sha256`.
pub fn svd_checkpoint(
    config: &ModelConfig,
    weights_sha256: &str,
    factors: &ModelFactors,
    plan: &CalibrationPlan,
) -> Result<StarKvCheckpoint, StarKvError> {
    let spectra = ModelSpectra::of(factors)?;
    let budget = CacheBudget::new(&factors.shape(), plan.target, factors.uncompressed())?;
    let outcome = allocate_ranks(&spectra, &budget, &plan.strategy)?;
    let projections = ModelProjections::from_factors(factors, &outcome.allocation)?;
    let mut calibration = plan.calibration.clone();
    calibration.whitened = factors.is_whitened();
    if let Some(thresholds) = &outcome.thresholds {
        calibration.steps = calibration.steps.max(thresholds.steps as u64);
    }
    let settings = CheckpointSettings {
        profile: plan.profile,
        target: plan.target,
        rank_strategy: plan.strategy.name().to_owned(),
        projection_dtype: plan.projection_dtype,
        cache_dtype: plan.cache_dtype,
        calibration,
        thresholds: outcome.thresholds,
        seed: plan.seed,
    };
    StarKvCheckpoint::new(config, weights_sha256.to_owned(), projections, settings)
}
