//! From learned thresholds to ranks that meet the budget exactly, and to a checkpoint.

use starling_models::ModelConfig;

use super::{DistillError, DistillReport};
use crate::checkpoint::{loss_curve, CheckpointSettings, StarKvCheckpoint};
use crate::exact_budget::meet_budget;
use crate::threshold::effective_rank;
use crate::{
    AllocationOutcome, CalibrationPlan, KvShape, ModelFactors, ModelProjections, RankAllocation,
    UncompressedLayers,
};

/// The name distilled checkpoints record as their rank strategy.
pub const DISTILLED_STRATEGY: &str = "distilled_thresholds";

/// Ranks `#{σ̂ > α_f}` per factor, then the exact-budget step of the allocation code with a
/// component's value = its margin over its factor's learned threshold, `σ̂_c − α_f`: the
/// components the thresholds barely kept are dropped first, those they barely cut are added
/// first. The margin is non-increasing within a factor, as the exact step assumes.
pub(crate) fn project_to_budget(
    shape: KvShape,
    uncompressed: &UncompressedLayers,
    scaled: &[Vec<f64>],
    alphas: &[f64],
    target: u64,
) -> Result<(Vec<usize>, RankAllocation), DistillError> {
    if scaled.len() != alphas.len() {
        return Err(DistillError::InvalidArgument(format!(
            "{} thresholds for {} factors",
            alphas.len(),
            scaled.len()
        )));
    }
    let learned: Vec<usize> = scaled
        .iter()
        .zip(alphas)
        .map(|(s, &a)| effective_rank(s, a))
        .collect();
    let max_ranks: Vec<usize> = scaled.iter().map(Vec::len).collect();
    let mut ranks = learned.clone();
    let margin = |f: usize, c: usize| scaled[f][c] - alphas[f];
    meet_budget(&mut ranks, &max_ranks, target, &margin)?;
    let allocation = RankAllocation::from_canonical(shape, uncompressed, &ranks)?;
    Ok((learned, allocation))
}

/// A checkpoint of `factors` truncated to `outcome`'s distilled ranks, like
/// [`crate::svd_checkpoint`] but with the distilled allocation: the manifest records the
/// strategy [`DISTILLED_STRATEGY`], the thresholds, and the distillation steps and tokens of
/// `report` (added to `plan.calibration`).
pub fn distilled_checkpoint(
    config: &ModelConfig,
    weights_sha256: &str,
    factors: &ModelFactors,
    plan: &CalibrationPlan,
    outcome: &AllocationOutcome,
    report: &DistillReport,
) -> Result<StarKvCheckpoint, DistillError> {
    let projections = ModelProjections::from_factors(factors, &outcome.allocation)?;
    let mut calibration = plan.calibration.clone();
    calibration.whitened = factors.is_whitened();
    let steps = report.steps.len() as u64;
    calibration.steps += steps;
    calibration.distillation_steps += steps;
    calibration.tokens = calibration.tokens.max(report.tokens_seen);
    let settings = CheckpointSettings {
        profile: plan.profile,
        target: plan.target,
        rank_strategy: DISTILLED_STRATEGY.to_owned(),
        projection_dtype: plan.projection_dtype,
        cache_dtype: plan.cache_dtype,
        calibration,
        thresholds: outcome.thresholds.clone(),
        seed: plan.seed,
    };
    let mut checkpoint =
        StarKvCheckpoint::new(config, weights_sha256.to_owned(), projections, settings)?;
    let kls: Vec<f64> = report.steps.iter().map(|s| s.kl).collect();
    let tokens_per_step = report.tokens_seen / (steps.max(1));
    checkpoint.manifest.loss_curve = loss_curve("thresholds", &kls, tokens_per_step);
    Ok(checkpoint)
}
