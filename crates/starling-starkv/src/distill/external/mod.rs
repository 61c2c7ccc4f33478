//! Distillation by a trainer outside this process: the PyTorch script
//! `scripts/starkv_distill_torch.py`, which trains the same objective as [`super::distill_with`]
//! and [`super::refine_with`] on a GPU at the reference's scale (millions of tokens).
//!
//! The division of work keeps every STAR-KV decision here: this crate writes a job directory
//! ([`ExternalJob::prepare`]: the factors, the calibration tokens, each profile's budget and
//! starting thresholds), the trainer writes back learned thresholds or refined projections,
//! and this crate projects the thresholds onto the budget exactly
//! ([`ThresholdsResult::outcome`]) and builds the checkpoint ([`RefineResult::apply`] for
//! refinement). The trainer never chooses ranks and never writes a checkpoint.
//!
//! Files of a job directory: [`JOB_FILE`] (an [`ExternalJob`]), [`FACTORS_FILE`] (per factor
//! `U`, `σ`, `R` in f32: `layers.{l}.k_u.{h}` `[head_dim, k]`, `k_sigma.{h}` `[k]`,
//! `k_r.{h}` `[k, hidden]`, `v_u` `[kv_size, k]`, `v_sigma`, `v_r` `[k, hidden]`),
//! [`TOKENS_FILE`] (little-endian u32 ids), and per profile a folder with
//! [`THRESHOLDS_RESULT`] / [`REFINE_RESULT`] + [`REFINED_PROJECTIONS`] and the trainer's
//! resumable state.

mod job;
mod results;

#[cfg(test)]
mod tests;

pub use job::{
    BudgetControl, ExternalJob, JobFiles, JobModel, JobProfile, JobRefine, JobSettings,
    JobThresholds, FACTORS_FILE, JOB_FILE, JOB_FORMAT, TOKENS_FILE,
};
pub use results::{
    RefineResult, ThresholdsResult, REFINED_PROJECTIONS, REFINE_RESULT, THRESHOLDS_RESULT,
};
