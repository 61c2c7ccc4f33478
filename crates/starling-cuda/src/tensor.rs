//! Device tensors: a typed device buffer plus a shape.

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

/// A row-major tensor in device memory.
#[derive(Debug)]
pub struct CudaTensor {
    pub(crate) buf: DeviceBuf,
    pub(crate) shape: Vec<usize>,
}

impl CudaTensor {
    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// `(rows, cols)`, a 1-D tensor counting as one row.
    pub(crate) fn matrix_dims(&self) -> Result<(usize, usize), crate::CudaError> {
        match self.shape.as_slice() {
            [n] => Ok((1, *n)),
            [r, c] => Ok((*r, *c)),
            s => Err(crate::CudaError::Shape(format!(
                "expected a matrix, got {s:?}"
            ))),
        }
    }

    pub(crate) fn bf16(&self) -> Result<&CudaSlice<bf16>, crate::CudaError> {
        match &self.buf {
            DeviceBuf::Bf16(b) => Ok(b),
            DeviceBuf::F32(_) => Err(crate::CudaError::Shape("expected a bf16 tensor".into())),
        }
    }

    pub(crate) fn f32(&self) -> Result<&CudaSlice<f32>, crate::CudaError> {
        match &self.buf {
            DeviceBuf::F32(b) => Ok(b),
            DeviceBuf::Bf16(_) => Err(crate::CudaError::Shape("expected an f32 tensor".into())),
        }
    }

    pub(crate) fn bf16_mut(&mut self) -> Result<&mut CudaSlice<bf16>, crate::CudaError> {
        match &mut self.buf {
            DeviceBuf::Bf16(b) => Ok(b),
            DeviceBuf::F32(_) => Err(crate::CudaError::Shape("expected a bf16 tensor".into())),
        }
    }
}
