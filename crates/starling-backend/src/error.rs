//! Backend errors.

/// Errors raised by compute backends.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Operands whose shapes do not fit the operation.
    #[error("shape error: {0}")]
    Shape(String),
    /// The requested device is not available (no driver, no GPU, not compiled in).
    #[error("device unavailable: {0}")]
    DeviceUnavailable(String),
    /// Device memory could not be allocated.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// Any other device-side failure.
    #[error("device error: {0}")]
    Device(String),
}
