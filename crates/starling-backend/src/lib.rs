//! Compute backends behind a few op-level traits, united in [`Backend`]; models are written once
//! against them.
//!
//! The CPU backend ([`cpu::CpuBackend`]) is the f32 reference every accelerated kernel is tested
//! against; [`sampling`] is the reference of the token-sampling op. [`prelude`] brings every
//! op trait into scope, for code that calls ops on a concrete backend type.
#![deny(missing_docs)]

mod backend;
mod batch;
pub mod cpu;
mod error;
pub mod fp8;
mod graphs;
mod host_tensor;
pub mod int4;
pub mod int8;
pub mod keep;
mod kernel_profile;
pub mod sampling;

pub use backend::{
    AttentionDims, Backend, BackendCore, DeviceSampling, HeadSpan, KeyScoreKind, KvCacheOps,
    KvCacheSpec, KvRows, LatentFactors, ModelOps, RopeSpec, RopeStyle, WindowScoreSpec,
};
pub use batch::{BatchMeta, GroupBatchMeta, SeqBatchMeta};
pub use error::BackendError;
pub use graphs::{DecodeGraphConfig, DecodeGraphs, DecodeStep, DeviceForward, GraphCapture};
pub use host_tensor::HostTensor;
pub use keep::KeepPlan;
pub use kernel_profile::KernelSiteTime;

/// The op traits, for calling ops on a concrete backend (`CpuBackend`, `CudaBackend`): generic
/// code bounded by [`Backend`] sees every op without imports.
pub mod prelude {
    pub use crate::{Backend, BackendCore, DeviceSampling, GraphCapture, KvCacheOps, ModelOps};
}
