//! The typed device buffer under every tensor and every recording-pool loan.
//!
//! A leaf module: `tensor` and `recording_pool` both hold these, and neither imports the other's
//! owner for it.

use cudarc::driver::CudaSlice;
use half::bf16;

/// A device buffer of one of the element types the backend uses.
#[derive(Debug)]
pub enum DeviceBuf {
    /// Weights and activations.
    Bf16(CudaSlice<bf16>),
    /// Logits (kept in f32 for sampling).
    F32(CudaSlice<f32>),
}
