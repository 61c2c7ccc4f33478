//! Compute backends behind one op-level trait ([`Backend`]); models are written once against it.
//!
//! The CPU backend ([`cpu::CpuBackend`]) is the f32 reference every accelerated kernel is tested
//! against; [`sampling`] is the reference of the token-sampling op.
#![deny(missing_docs)]

mod backend;
mod batch;
pub mod cpu;
mod error;
mod graphs;
mod host_tensor;
pub mod sampling;

pub use backend::{
    AttentionDims, Backend, HeadSpan, KeyScoreKind, KvCacheSpec, KvRows, LatentFactors, RopeSpec,
    RopeStyle, WindowScoreSpec,
};
pub use batch::{BatchMeta, SeqBatchMeta};
pub use error::BackendError;
pub use graphs::{DecodeGraphConfig, DecodeGraphs, DecodeStep, DeviceForward};
pub use host_tensor::HostTensor;
