//! What an external trainer writes back, and how it becomes an allocation or a checkpoint.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::super::refine::{refined_checkpoint, RefineReport, RefineStep};
use super::super::train::Trained;
use super::super::{learned_outcome, DistillError, DistillReport, DistillStep};
use super::job::{scaled_spectra, ExternalJob};
use crate::checkpoint::{read_projections, ProjectionDtype, StarKvCheckpoint};
use crate::{AllocationOutcome, ModelFactors};

/// A profile's learned thresholds, JSON, in its folder of the job directory.
pub const THRESHOLDS_RESULT: &str = "thresholds.json";
/// A profile's refinement record, JSON.
pub const REFINE_RESULT: &str = "refine.json";
/// A profile's refined projections, in a checkpoint's tensor names and shapes, f32.
pub const REFINED_PROJECTIONS: &str = "refined.safetensors";

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, DistillError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DistillError::InvalidArgument(format!("reading {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| DistillError::InvalidArgument(format!("{}: {e}", path.display())))
}

/// [`THRESHOLDS_RESULT`]: the trained thresholds and every step's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThresholdsResult {
    /// `α` per factor, canonical order.
    pub alphas: Vec<f64>,
    /// The budget price after the last step.
    pub multiplier: f64,
    /// Per step, in order.
    pub steps: Vec<DistillStep>,
    /// Windows the tokens were cut into.
    pub windows: usize,
    /// Tokens per window.
    pub window_tokens: usize,
    /// Windows per step.
    pub batch_windows: usize,
    /// Tokens trained on (steps × windows per step × window tokens).
    pub tokens_seen: u64,
}

impl ThresholdsResult {
    /// Reads `dir/`[`THRESHOLDS_RESULT`].
    pub fn read(dir: &Path) -> Result<Self, DistillError> {
        read_json(&dir.join(THRESHOLDS_RESULT))
    }

    /// The allocation these thresholds give `profile` of `job` over `factors` (the factors
    /// the job was made from), projected onto the budget exactly, and the run's report.
    pub fn outcome(
        &self,
        job: &ExternalJob,
        profile: &str,
        factors: &ModelFactors,
    ) -> Result<(AllocationOutcome, DistillReport), DistillError> {
        let entry = job.profile(profile).ok_or_else(|| {
            DistillError::InvalidArgument(format!("profile {profile} is not in the job"))
        })?;
        let count = factors.factors().len();
        if self.alphas.len() != count || entry.initial_alphas.len() != count {
            return Err(DistillError::InvalidArgument(format!(
                "the trainer returned {} thresholds for {count} factors",
                self.alphas.len()
            )));
        }
        if let Some(bad) = self
            .alphas
            .iter()
            .find(|a| !(a.is_finite() && **a > 0.0 && **a < 1.0))
        {
            return Err(DistillError::InvalidArgument(format!(
                "the trainer returned a threshold of {bad}, outside (0, 1)"
            )));
        }
        if self.steps.is_empty() {
            return Err(DistillError::InvalidArgument(
                "the trainer recorded no steps".to_owned(),
            ));
        }
        let scaled = scaled_spectra(factors);
        let trained = Trained {
            alphas: self.alphas.clone(),
            last_kl: self.steps.last().map_or(f64::NAN, |s| s.kl),
            steps: self.steps.clone(),
            multiplier: self.multiplier,
        };
        learned_outcome(
            factors,
            &scaled,
            entry.target_elements,
            job.thresholds.sharpness,
            trained,
            self.windows,
            self.tokens_seen,
        )
    }
}

/// [`REFINE_RESULT`]: the refinement's steps (its projections are [`REFINED_PROJECTIONS`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RefineResult {
    /// Per step, in order.
    pub steps: Vec<RefineStep>,
    /// Windows the tokens were cut into.
    pub windows: usize,
    /// Tokens per window.
    pub window_tokens: usize,
    /// Windows per step.
    pub batch_windows: usize,
    /// Tokens trained on.
    pub tokens_seen: u64,
    /// The relative step size.
    pub learning_rate: f64,
}

impl RefineResult {
    /// Reads `dir/`[`REFINE_RESULT`].
    pub fn read(dir: &Path) -> Result<Self, DistillError> {
        read_json(&dir.join(REFINE_RESULT))
    }

    /// `checkpoint` with its projections replaced by `dir/`[`REFINED_PROJECTIONS`] (which
    /// must hold exactly its tensors, ranks and shapes) and this refinement recorded.
    pub fn apply(
        &self,
        dir: &Path,
        checkpoint: StarKvCheckpoint,
    ) -> Result<StarKvCheckpoint, DistillError> {
        let manifest = &checkpoint.manifest;
        let refined = read_projections(
            &dir.join(REFINED_PROJECTIONS),
            &manifest.model.shape,
            &manifest.layers,
            ProjectionDtype::F32,
        )?;
        let report = RefineReport {
            steps: self.steps.clone(),
            windows: self.windows,
            window_tokens: self.window_tokens,
            tokens_seen: self.tokens_seen,
            learning_rate: self.learning_rate,
        };
        refined_checkpoint(checkpoint, refined, &report)
    }
}
