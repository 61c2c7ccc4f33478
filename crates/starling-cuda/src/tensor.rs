//! Device tensors: a typed device buffer plus a shape.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::device_buf::DeviceBuf;
use crate::recording_pool::RecordingPool;

/// A row-major tensor in device memory.
#[derive(Debug)]
pub struct CudaTensor {
    /// Dropped by hand (see `Drop`): a buffer lent by a recording pool goes back to it.
    buf: ManuallyDrop<DeviceBuf>,
    shape: Vec<usize>,
    /// The pool that lent `buf`, while a decode graph is recorded.
    pool: Option<Arc<RecordingPool>>,
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken exactly once, here, and never used again.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        match self.pool.take() {
            Some(pool) => pool.give_back(buf),
            None => drop(buf),
        }
    }
}

impl CudaTensor {
    /// A tensor owning `buf` (freed with it).
    pub(crate) fn new(buf: DeviceBuf, shape: Vec<usize>) -> Self {
        Self {
            buf: ManuallyDrop::new(buf),
            shape,
            pool: None,
        }
    }

    /// A tensor of a buffer `pool` lent, handed back to it on drop.
    pub(crate) fn pooled(buf: DeviceBuf, shape: Vec<usize>, pool: Arc<RecordingPool>) -> Self {
        Self {
            buf: ManuallyDrop::new(buf),
            shape,
            pool: Some(pool),
        }
    }

    /// Reshapes to `shape`, which must hold as many elements.
    pub(crate) fn set_shape(&mut self, shape: Vec<usize>) {
        debug_assert_eq!(shape.iter().product::<usize>(), self.numel());
        self.shape = shape;
    }

    /// The device buffer.
    pub(crate) fn buf(&self) -> &DeviceBuf {
        &self.buf
    }

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
        match &*self.buf {
            DeviceBuf::Bf16(b) => Ok(b),
            DeviceBuf::F32(_) => Err(crate::CudaError::Shape("expected a bf16 tensor".into())),
        }
    }

    pub(crate) fn f32(&self) -> Result<&CudaSlice<f32>, crate::CudaError> {
        match &*self.buf {
            DeviceBuf::F32(b) => Ok(b),
            DeviceBuf::Bf16(_) => Err(crate::CudaError::Shape("expected an f32 tensor".into())),
        }
    }

    pub(crate) fn bf16_mut(&mut self) -> Result<&mut CudaSlice<bf16>, crate::CudaError> {
        match &mut *self.buf {
            DeviceBuf::Bf16(b) => Ok(b),
            DeviceBuf::F32(_) => Err(crate::CudaError::Shape("expected a bf16 tensor".into())),
        }
    }

    pub(crate) fn f32_mut(&mut self) -> Result<&mut CudaSlice<f32>, crate::CudaError> {
        match &mut *self.buf {
            DeviceBuf::F32(b) => Ok(b),
            DeviceBuf::Bf16(_) => Err(crate::CudaError::Shape("expected an f32 tensor".into())),
        }
    }
}
