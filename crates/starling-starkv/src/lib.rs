//! STAR-KV foundations: low-rank K/V projections for a compressed KV cache.
//!
//! Per layer, keys are factored per KV head and values jointly by SVD ([`Factorization`],
//! [`ModelFactors`]), optionally whitened by calibration activations ([`Whitener`], from the
//! per-layer statistics of [`AttentionInputMoments`] over [`calibration_windows`]). Ranks are
//! chosen to meet a cache budget exactly ([`RankProfile`], [`CacheBudget`],
//! [`allocate_ranks`]): uniformly, greedily by singular-value energy, or by learned soft
//! thresholds ([`threshold`]). The truncated factors ([`ModelProjections`]) and a manifest are
//! written as a checkpoint ([`checkpoint`]) that refuses to load against another model.
//!
//! Everything here is host-side f32/f64; only the activation statistics run the model, on any
//! backend, and read its activations back to the host. A checkpoint runs two ways: the latent
//! path ([`load_latent_layers`]: the model caches latents, the bytes the profile saves become
//! blocks) and the reference path ([`load_and_apply`]: K/V weights replaced by their low-rank
//! reconstructions, full K/V cached), the oracle of the first.
#![deny(missing_docs)]

mod activations;
mod allocation;
mod budget;
mod calibration_text;
pub mod checkpoint;
pub mod distill;
mod error;
mod exact_budget;
mod factorization;
mod latent_path;
mod matrix;
mod model_factors;
mod pipeline;
mod profile_ref;
mod projections;
mod reference_path;
mod report;
mod shape;
mod spectra;
pub mod threshold;
mod whitening;

pub use activations::AttentionInputMoments;
pub use allocation::{
    allocate_ranks, uniform_allocation, AllocationOutcome, LayerRanks, RankAllocation, RankStrategy,
};
pub use budget::{BudgetTarget, CacheBudget, RankProfile};
pub use calibration_text::calibration_windows;
pub use error::StarKvError;
pub use factorization::Factorization;
pub use latent_path::{latent_layers, load_latent_layers};
pub use matrix::Matrix;
pub use model_factors::{FactorId, FactorKind, LayerFactors, ModelFactors};
pub use pipeline::{svd_checkpoint, CalibrationPlan};
pub use profile_ref::ProfileRef;
pub use projections::{LayerProjections, ModelProjections};
pub use reference_path::{
    apply_projection_sides, apply_projections, load_and_apply, load_profile, profile_dir,
    AppliedSides,
};
pub use report::CompressionReport;
pub use shape::{KvShape, UncompressedLayers};
pub use spectra::{FactorSpectrum, ModelSpectra};
pub use threshold::ThresholdConfig;
pub use whitening::{SecondMoment, Whitener, DEFAULT_RELATIVE_FLOOR};
