//! A plain row-major f32 tensor in host memory: the hand-off format between weight loaders and
//! backends (a backend uploads it into its own buffer type and dtype).

use crate::BackendError;

/// Row-major f32 tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl HostTensor {
    /// Wraps `data` with `shape`; fails when the element counts disagree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, BackendError> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(BackendError::Shape(format!(
                "shape {shape:?} needs {expected} elements, got {}",
                data.len()
            )));
        }
        Ok(Self { shape, data })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Self {
            shape,
            data: vec![0.0; n],
        }
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Mutable elements, row-major.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Consumes the tensor, returning its elements.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Same elements viewed with another shape of equal element count.
    pub fn reshape(self, shape: Vec<usize>) -> Result<Self, BackendError> {
        Self::new(shape, self.data)
    }
}
