//! The op-level interface every compute backend implements, as a few traits by concern, so a
//! new backend or a test double implements what it needs; models are written once against them.
//!
//! - [`BackendCore`]: the associated types (tensor, cache, batch) and memory — upload, copy
//!   back, cache allocation, step metadata. Every other trait builds on it.
//! - [`ModelOps`]: the ops of a forward pass (embedding, linear, norms, RoPE, the K/V write,
//!   paged and latent attention, the logits).
//! - [`KvCacheOps`]: cache management outside the forward pass (block copies, gather/scatter,
//!   compaction, eviction scores, latent reconstruction).
//! - [`DeviceSampling`]: sampling where the logits are.
//! - [`GraphCapture`](crate::GraphCapture): recorded decode steps.
//!
//! [`Backend`] is their union, implemented for every type that implements all five: what the
//! engine and the models ask for.

mod device_sampling;
mod kv_cache_ops;
mod kv_cache_spec;
mod model_ops;

pub use device_sampling::DeviceSampling;
pub use kv_cache_ops::{KeyScoreKind, KvCacheOps, KvRows, WindowScoreSpec};
pub use kv_cache_spec::KvCacheSpec;
pub use model_ops::{AttentionDims, HeadSpan, LatentFactors, ModelOps, RopeSpec, RopeStyle};

use crate::{BackendError, BatchMeta, GraphCapture, HostTensor};

/// What every backend has: its tensor, cache and batch types, and its memory (uploads, copies
/// back, cache allocation, the step's metadata). Reference: [`crate::cpu::CpuBackend`].
pub trait BackendCore: Send + Sync {
    /// A 2-D (or 1-D for vectors) tensor in the backend's memory and compute dtype.
    type Tensor: Send + Sync;

    /// One layer's paged K/V cache storage.
    type KvCache: Send + Sync;

    /// Step metadata in the backend's memory (uploaded once per step, read by every layer).
    type Batch: Send + Sync;

    /// Short name for logs ("cpu", "cuda:0").
    fn name(&self) -> String;

    /// Element type this backend stores the KV cache in (sizes the cache from a byte budget).
    fn kv_cache_dtype(&self) -> starling_kv::CacheDtype;

    /// `(free, total)` bytes of device memory, for backends that have their own (sizes the KV
    /// cache from a utilisation share); `None` for host memory.
    fn memory_info(&self) -> Option<(u64, u64)> {
        None
    }

    /// Copies a host tensor into backend memory (converting to the compute dtype).
    fn upload(&self, host: &HostTensor) -> Result<Self::Tensor, BackendError>;

    /// A tensor of N(`mean`, `std`) values (deterministic for a seed), for synthetic weights.
    /// The default makes it on the host and uploads it; device backends make it in place.
    fn random_tensor(
        &self,
        shape: Vec<usize>,
        seed: u64,
        std: f32,
        mean: f32,
    ) -> Result<Self::Tensor, BackendError> {
        let n: usize = shape.iter().product();
        let mut state = seed;
        let mut next = || {
            // SplitMix64: fast, and statistically fine for filler values.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let data = (0..n)
            .map(|_| {
                let (u1, u2) = (next().max(f64::MIN_POSITIVE), next());
                let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                mean + std * normal as f32
            })
            .collect();
        self.upload(&HostTensor::new(shape, data)?)
    }

    /// Like [`BackendCore::upload`], but may reuse the host buffer (the CPU backend moves it instead
    /// of copying, so loading a model does not hold its weights twice).
    fn upload_owned(&self, host: HostTensor) -> Result<Self::Tensor, BackendError> {
        self.upload(&host)
    }

    /// Copies a tensor back to the host as f32.
    fn to_host(&self, t: &Self::Tensor) -> Result<HostTensor, BackendError>;

    /// Allocates one layer's K/V cache, zero-filled.
    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<Self::KvCache, BackendError>;

    /// Makes the step metadata available to the ops (validated against the cache size).
    fn prepare_batch(
        &self,
        meta: &BatchMeta,
        num_cache_blocks: usize,
    ) -> Result<Self::Batch, BackendError>;

    /// Starts timing every device launch by site ([`crate::KernelSiteTime`]); `false` when this
    /// backend cannot (the CPU has no launches). Launches recorded into a CUDA graph are not
    /// timed, so a caller turns graphs off while profiling. Timing serialises launches (an
    /// event pair around each), so a profiled run measures each kernel alone, not the overlap.
    fn start_kernel_profile(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Device time per launch site since [`start_kernel_profile`](Self::start_kernel_profile),
    /// counting the launches that have completed; empty when not profiling.
    fn kernel_profile(&self) -> Result<Vec<crate::KernelSiteTime>, BackendError> {
        Ok(Vec::new())
    }

    /// The error of an op this backend does not implement.
    fn unsupported(&self, op: &str) -> BackendError {
        BackendError::Device(format!(
            "{op} is not implemented on the {} backend",
            self.name()
        ))
    }
}

/// A complete compute backend: the union of the op traits, which is what the engine and the
/// models need. Implemented for every type that implements all of them; implement the parts.
pub trait Backend: BackendCore + ModelOps + KvCacheOps + DeviceSampling + GraphCapture {}

impl<T> Backend for T where T: BackendCore + ModelOps + KvCacheOps + DeviceSampling + GraphCapture {}
