//! Learned soft thresholds: one `α` per key head and per value layer on the scaled singular
//! values, trained by gradient descent (Adam) on an objective plus a budget penalty whose
//! price rises while the soft rank exceeds the budget (dual ascent), so `α` rises until the
//! budget is met. Gradients are written by hand: the only trained quantities are the
//! thresholds, and their derivatives are closed-form.

pub(crate) mod adam;
mod learn;
mod objective;
mod soft;

pub use learn::{
    learn_thresholds, LearnedThresholds, PenalisedValue, ThresholdConfig, ThresholdInit,
    ThresholdProblem,
};
pub use objective::{ReconstructionObjective, ThresholdObjective};
pub use soft::{
    alpha_for_rank, effective_rank, soft_keep, soft_threshold, soft_threshold_grad_alpha,
};
