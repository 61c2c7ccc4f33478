//! Knowledge distillation of the STAR-KV thresholds: one `α` per key head and per value layer
//! is trained so the compressed student's next-token distributions match the original
//! model's, KL(teacher ‖ student), on calibration text, under the profile's KV budget; the
//! learned thresholds then become ranks meeting the budget exactly.
//!
//! The student is the model with each compressed layer's K projection per KV head
//! `U_h diag(f(σ_h; α_h)) R_h` and V projection `U diag(f(σ; α)) R` (joint), with
//! `f(σ) = σ tanh(s (σ̂ − α))` above `α` (`σ̂ = σ / σ_max`), and every other weight frozen;
//! uncompressed layers use their original weights. `α = sigmoid(θ)` keeps `0 < α < 1`, the
//! range of `σ̂`. Loss: mean KL + `μ (Σ sigmoid(s (σ̂ − α)) − budget) / budget`, Adam on `θ`,
//! dual ascent on `μ` (the price rises while the soft rank exceeds the budget).
//!
//! **Autodiff: candle-core's CPU autograd** (`Var`, `backward`, `GradStore`). It is well kept,
//! already in the tree (starling-models dequantises GGUF blocks with it) and CPU-only here
//! (default features off, so no nvcc). Gradients must flow through the whole transformer
//! above the first compressed layer (attention, RMSNorm, SwiGLU, RoPE, the LM head) to reach
//! the thresholds; a hand-written backward of all of that is a second model implementation
//! with no natural bound, while here the forward is written once in candle ops
//! (`frozen.rs`; frozen weights go through `frozen_linear.rs`, whose backward skips the
//! unused weight gradients) and checked against the engine's CPU backend logits. The teacher
//! runs outside any graph (no variable reaches it) and is computed once per window.
//!
//! Entry point: [`distill_ranks`]; [`distilled_checkpoint`] writes the result like
//! [`crate::svd_checkpoint`]. Once the ranks are fixed, [`refine_with`] trains the kept factors
//! themselves on the same loss and [`refined_checkpoint`] records the result.

mod config;
mod distiller;
mod error;
pub mod external;
mod frozen;
mod frozen_linear;
mod loss;
mod project;
mod refine;
mod rope;
mod student;
mod train;

#[cfg(test)]
mod tests;

use starling_models::{ModelConfig, WeightMap};

pub use config::{DistillConfig, DistillReport, DistillStep};
pub use distiller::Distiller;
pub use error::DistillError;
pub use project::{distilled_checkpoint, DISTILLED_STRATEGY};
pub use refine::{refine_with, refined_checkpoint, RefineConfig, RefineReport, RefineStep};

use crate::threshold::LearnedThresholds;
use crate::{AllocationOutcome, CacheBudget, CalibrationPlan, ModelFactors, ModelSpectra};

/// Distils thresholds for `plan`'s budget over `factors` (computed from `weights`) on
/// `text_ids`, and projects them onto the budget exactly. Returns the allocation (with the
/// learned thresholds, as [`crate::RankStrategy::LearnedThresholds`] does) and the run's
/// report. Deterministic: no randomness, fixed window order.
pub fn distill_ranks(
    config: &ModelConfig,
    weights: &WeightMap,
    factors: &ModelFactors,
    plan: &CalibrationPlan,
    text_ids: &[u32],
    distill: &DistillConfig,
) -> Result<(AllocationOutcome, DistillReport), DistillError> {
    distill.validate()?;
    let mut distiller = Distiller::new(config, weights, factors, text_ids, distill.window_tokens)?;
    distill_with(&mut distiller, factors, plan, distill)
}

/// [`distill_ranks`] on a prepared [`Distiller`] (whose teacher cache it fills), so a caller
/// can also score allocations on the same windows ([`Distiller::allocation_kl`]).
pub fn distill_with(
    distiller: &mut Distiller,
    factors: &ModelFactors,
    plan: &CalibrationPlan,
    distill: &DistillConfig,
) -> Result<(AllocationOutcome, DistillReport), DistillError> {
    distill.validate()?;
    let budget = CacheBudget::new(&factors.shape(), plan.target, factors.uncompressed())?;
    let target = budget.compressed_elements_per_token;
    let spectra = ModelSpectra::of(factors)?;
    let scaled = distiller.student().scaled().to_vec();
    let start = train::initial_alphas(&spectra, &scaled, target, distill.init)?;
    let trained = train::train(distiller, &start, target, distill)?;
    let tokens_seen = (trained.steps.len() * distiller.window_tokens()) as u64;
    learned_outcome(
        factors,
        &scaled,
        target,
        distill.sharpness,
        trained,
        distiller.windows(),
        tokens_seen,
    )
}

/// The allocation and report of thresholds trained to `target` elements (by this process or
/// by an external trainer): the thresholds projected onto the budget exactly, as
/// [`crate::RankStrategy::LearnedThresholds`] does.
pub(crate) fn learned_outcome(
    factors: &ModelFactors,
    scaled: &[Vec<f64>],
    target: u64,
    sharpness: f64,
    trained: train::Trained,
    windows: usize,
    tokens_seen: u64,
) -> Result<(AllocationOutcome, DistillReport), DistillError> {
    let (learned, allocation) = project::project_to_budget(
        factors.shape(),
        factors.uncompressed(),
        scaled,
        &trained.alphas,
        target,
    )?;
    let report = DistillReport {
        windows,
        tokens_seen,
        target_elements: target,
        learned_hard_rank: learned.iter().sum(),
        steps: trained.steps,
    };
    let thresholds = LearnedThresholds {
        sharpness,
        alphas: trained.alphas,
        effective_ranks: learned,
        multiplier: trained.multiplier,
        objective: trained.last_kl,
        steps: report.steps.len(),
    };
    let outcome = AllocationOutcome {
        allocation,
        thresholds: Some(thresholds),
    };
    Ok((outcome, report))
}
