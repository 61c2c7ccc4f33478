//! The kernel profile's hook into every launch: kernels through `launch!`, cuBLAS calls
//! through [`CudaBackend::profiled`] with a site naming the operation and weight shape.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::CudaBackend;
use crate::CudaError;

impl CudaBackend {
    /// Runs `launch` (which queues device work on the backend's stream) between the profile's
    /// timing events when a kernel profile is on and no decode graph is being recorded.
    pub(crate) fn profiled<T>(
        &self,
        site: impl FnOnce() -> Arc<str>,
        launch: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        if !self.profiler.enabled() || self.recording.load(Ordering::Relaxed) {
            return launch();
        }
        let timing = self.profiler.begin(&self.stream, site)?;
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
