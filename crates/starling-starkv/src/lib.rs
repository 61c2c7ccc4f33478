//! STAR-KV foundations: low-rank K/V projections for a compressed KV cache.
//!
//! Per layer, keys are factored per KV head and values jointly by SVD ([`Factorization`],
//! [`ModelFactors`]), optionally whitened by calibration activations ([`Whitener`]). Ranks are
//! chosen to meet a cache budget exactly ([`RankProfile`], [`CacheBudget`],
//! [`allocate_ranks`]): uniformly, greedily by singular-value energy, or by learned soft
//! thresholds ([`threshold`]). The truncated factors ([`ModelProjections`]) and a manifest are
//! written as a checkpoint ([`checkpoint`]) that refuses to load against another model.
//!
//! Everything here is host-side f32/f64 and device-free; the engine's execution path and the
//! distillation loop build on these types.
#![deny(missing_docs)]

mod allocation;
mod budget;
pub mod checkpoint;
mod error;
mod factorization;
mod matrix;
mod model_factors;
mod pipeline;
mod projections;
mod report;
mod shape;
mod spectra;
pub mod threshold;
mod whitening;

pub use allocation::{allocate_ranks, AllocationOutcome, LayerRanks, RankAllocation, RankStrategy};
pub use budget::{BudgetTarget, CacheBudget, RankProfile};
pub use error::StarKvError;
pub use factorization::Factorization;
pub use matrix::Matrix;
pub use model_factors::{FactorId, FactorKind, LayerFactors, ModelFactors};
pub use pipeline::{svd_checkpoint, CalibrationPlan};
pub use projections::{LayerProjections, ModelProjections};
pub use report::CompressionReport;
pub use shape::{KvShape, UncompressedLayers};
pub use spectra::{FactorSpectrum, ModelSpectra};
pub use threshold::ThresholdConfig;
pub use whitening::{SecondMoment, Whitener, DEFAULT_RELATIVE_FLOOR};
