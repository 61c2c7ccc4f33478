//! CUDA backend errors, mapped onto [`starling_backend::BackendError`] at the trait boundary.

use starling_backend::BackendError;

/// Failures of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library or no device.
    #[error("no CUDA device: {0}")]
    Unavailable(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// cuBLAS failed.
    #[error("cuBLAS: {0:?}")]
    Blas(cudarc::cublas::result::CublasError),
    /// cuBLASLt failed.
    #[error("cuBLASLt: {0:?}")]
    BlasLt(#[from] cudarc::cublaslt::result::CublasError),
    /// NVRTC could not compile a kernel source.
    #[error("NVRTC compiling {module}: {log}")]
    Compile {
        /// Module (source file) name.
        module: String,
        /// Compiler log.
        log: String,
    },
    /// The backend asked for a kernel that `kernel_modules()` does not list.
    #[error("kernel {0} is not listed in kernel_modules()")]
    UnlistedKernel(String),
    /// The on-disk kernel cache could not be used.
    #[error("kernel cache {path}: {source}")]
    Cache {
        /// Cache path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// Operands that do not fit the op.
    #[error("{0}")]
    Shape(String),
    /// A failure reported through the generic backend interface.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Blas(e)
    }
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Unavailable(m) => BackendError::DeviceUnavailable(m),
            CudaError::Shape(m) => BackendError::Shape(m),
            CudaError::Driver(d)
                if matches!(d.0, cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) =>
            {
                BackendError::OutOfMemory(d.to_string())
            }
            CudaError::Backend(b) => b,
            other => BackendError::Device(other.to_string()),
        }
    }
}
