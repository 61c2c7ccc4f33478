//! Choosing the compute backend (`--device`) and running a command generically over it.

use anyhow::{bail, Result};
use starling_backend::cpu::CpuBackend;
use starling_backend::Backend;
use starling_cuda::{cuda_available, CudaBackend};

use crate::args::DeviceArg;

/// A command body that works on any backend.
pub trait BackendJob {
    /// Runs the command on `backend`.
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()>;
}

/// Opens the backend `device` names and runs `job` on it.
pub fn with_backend(device: DeviceArg, job: impl BackendJob) -> Result<()> {
    match device {
        DeviceArg::Cpu => job.run(CpuBackend::new()),
        DeviceArg::Cuda => {
            if !cuda_available() {
                bail!("--device cuda: no CUDA driver (libcuda) on this machine; use --device cpu");
            }
            job.run(CudaBackend::new(0)?)
        }
        DeviceArg::Auto => {
            if cuda_available() {
                match CudaBackend::new(0) {
                    Ok(gpu) => return job.run(gpu),
                    Err(e) => tracing::info!("no usable GPU ({e}); running on the CPU"),
                }
            }
            job.run(CpuBackend::new())
        }
    }
}
