//! The CUDA backend: [`CudaBackend`] implements [`starling_backend::Backend`] with bf16 weights and
//! activations (f32 arithmetic), cuBLAS GEMMs and NVRTC-compiled kernels cached on disk.
//!
//! Nothing CUDA is needed at build time: cudarc loads `libcuda`, `libnvrtc` and `libcublas` at run
//! time. [`cuda_available`] checks for them first, so CPU-only machines get a clear message instead
//! of a panic. Kernel sources live in `kernels/*.cu`; each kernel names its CPU reference, and
//! `tests/parity.rs` (GPU only, `#[ignore]`d in CPU CI) checks it.
#![deny(missing_docs)]

mod backend;
pub mod bench;
mod compile;
mod device_buf;
mod error;
mod geometry;
mod kernel_profile;
mod kernel_source;
mod kernels;
mod launch;
mod mem_pool;
mod profile_gate;
mod recording_pool;
mod tensor;
mod tiled_kernels;

pub use backend::{
    CudaBackend, CudaBatch, CudaDecodeGraphs, CudaKvCache, GraphCensus, LatentScoreKernel,
    GEMM_BIAS_ENV, GEMM_BIAS_EPILOGUE_MAX_ROWS, GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV, GEMV_KSPLIT_ENV,
    GEMV_PREFETCH_ENV, LATENT_SCORES_ENV,
};
pub use compile::KernelCache;
pub use device_buf::DeviceBuf;
pub use error::CudaError;
pub use kernels::{
    kernel_modules, HopperPrefill, KernelModule, KernelSource, ModuleTarget, KERNEL_DIR_ENV,
    PREFILL_KERNEL_ENV, WGMMA_PREFILL_BY_DEFAULT,
};
pub use launch::PDL_ENV;
pub use mem_pool::MEMPOOL_RELEASE_THRESHOLD_ENV;
pub use tensor::CudaTensor;

/// Whether the CUDA driver library can be loaded on this machine (it says nothing about GPUs).
pub fn cuda_available() -> bool {
    // SAFETY: only tries to dlopen libcuda and reports whether it worked.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc`) can be loaded, so kernels can be compiled (no GPU needed).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen libnvrtc and reports whether it worked.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
