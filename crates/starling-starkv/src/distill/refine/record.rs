//! A checkpoint with refined projections: the same ranks, manifest figures and layout as the
//! checkpoint it refines, with the refinement recorded.

use super::RefineReport;
use crate::checkpoint::{loss_curve, RefinementRecord, StarKvCheckpoint};
use crate::distill::DistillError;
use crate::ModelProjections;

/// `checkpoint` with its projections replaced by `refined` (which must have exactly its ranks,
/// so its KV bytes per token and every figure in the manifest stay valid) and `report`
/// recorded: [`crate::checkpoint::CalibrationInfo::refinement_steps`] (also added to `steps`),
/// the tokens seen and a [`RefinementRecord`]. The rank strategy is left as it was: it names
/// how the ranks were chosen, which refinement does not change. Fails on a report without
/// steps (nothing was refined).
pub fn refined_checkpoint(
    mut checkpoint: StarKvCheckpoint,
    refined: ModelProjections,
    report: &RefineReport,
) -> Result<StarKvCheckpoint, DistillError> {
    let (Some(first), Some(last)) = (report.steps.first(), report.steps.last()) else {
        return Err(DistillError::InvalidArgument(
            "a refinement report without steps refined nothing".to_owned(),
        ));
    };
    if refined.allocation()? != checkpoint.projections.allocation()? {
        return Err(DistillError::InvalidArgument(
            "refined projections must keep the checkpoint's ranks".to_owned(),
        ));
    }
    let manifest = &mut checkpoint.manifest;
    let steps = report.steps.len() as u64;
    manifest.calibration.steps += steps;
    manifest.calibration.refinement_steps += steps;
    manifest.calibration.tokens = manifest.calibration.tokens.max(report.tokens_seen);
    manifest.refinement = Some(RefinementRecord {
        learning_rate: report.learning_rate,
        window_tokens: report.window_tokens as u64,
        windows: report.windows as u64,
        first_step_kl: first.kl,
        last_step_kl: last.kl,
    });
    let kls: Vec<f64> = report.steps.iter().map(|s| s.kl).collect();
    let tokens_per_step = report.tokens_seen / steps.max(1);
    manifest
        .loss_curve
        .extend(loss_curve("refine", &kls, tokens_per_step));
    checkpoint.projections = refined;
    Ok(checkpoint)
}
