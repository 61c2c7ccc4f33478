//! The kernel profile's hook into every launch: kernels through `launch!`, cuBLAS calls
//! through [`CudaBackend::profiled_library`] with a site naming the operation and weight shape.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::CudaBackend;
use crate::CudaError;

impl CudaBackend {
    /// Runs `launch` (one of our kernels, queued on the backend's stream) between the
    /// profile's timing events when a kernel profile is on and no decode graph is being
    /// recorded, held at the profile's host gate until issued.
    pub(crate) fn profiled<T>(
        &self,
        site: impl FnOnce() -> Arc<str>,
        launch: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        self.profiled_site(site, true, launch)
    }

    /// [`CudaBackend::profiled`] for a library call (cuBLAS, cuBLASLt), timed without the host
    /// gate: a library loads its kernels lazily at first use, and a module load waits for the
    /// context's work, which behind a closed gate never ends (session 35: `serve
    /// --kernel-profile` on a model with biases hung in its warm-up at the first cuBLASLt bias
    /// GEMM). Host time inside such a site is counted where the stream had drained.
    pub(crate) fn profiled_library<T>(
        &self,
        site: impl FnOnce() -> Arc<str>,
        launch: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        self.profiled_site(site, false, launch)
    }

    fn profiled_site<T>(
        &self,
        site: impl FnOnce() -> Arc<str>,
        gated: bool,
        launch: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        if !self.profiler.enabled() || self.recording.load(Ordering::Relaxed) {
            return launch();
        }
        let timing = self.profiler.begin(&self.stream, site, gated)?;
        let result = launch();
        self.profiler.end(&self.stream, timing)?;
        result
    }

    /// The site of a cuBLAS call: `cublas:<op> <m>x<k>` (output features × inputs of the
    /// weight), so each projection of a layer is a row of its own.
    pub(super) fn blas_site(op: &str, m: usize, k: usize) -> impl FnOnce() -> Arc<str> + '_ {
        move || Arc::from(format!("cublas:{op} {m}x{k}"))
    }
}
