//! A small dense row-major f32 matrix: the currency of this crate's public API, so callers
//! never see the linear-algebra library (it converts to and from it at the edges).

use faer::Mat;

use crate::StarKvError;

/// A dense `rows × cols` matrix stored row by row, as weights are (`[out, in]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    /// A matrix from row-major `data`; fails unless `data.len() == rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, StarKvError> {
        let expected = rows.checked_mul(cols).ok_or_else(|| {
            StarKvError::InvalidArgument(format!("matrix {rows} × {cols} is too large"))
        })?;
        if data.len() != expected {
            return Err(StarKvError::SizeMismatch {
                what: format!("matrix {rows} × {cols}"),
                expected,
                found: data.len(),
            });
        }
        Ok(Self { rows, cols, data })
    }

    /// A `rows × cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The elements, row by row.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Consumes the matrix, returning its row-major elements.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Row `index`.
    pub fn row(&self, index: usize) -> &[f32] {
        &self.data[index * self.cols..(index + 1) * self.cols]
    }

    /// The rows `start..end` as a new matrix.
    pub fn row_block(&self, start: usize, end: usize) -> Result<Matrix, StarKvError> {
        if start > end || end > self.rows {
            return Err(StarKvError::InvalidArgument(format!(
                "rows {start}..{end} of a matrix with {} rows",
                self.rows
            )));
        }
        Matrix::new(
            end - start,
            self.cols,
            self.data[start * self.cols..end * self.cols].to_vec(),
        )
    }

    /// The transpose, `[cols, rows]`.
    pub fn transpose(&self) -> Matrix {
        let mut data = Vec::with_capacity(self.data.len());
        for j in 0..self.cols {
            data.extend((0..self.rows).map(|i| self.data[i * self.cols + j]));
        }
        Matrix {
            rows: self.cols,
            cols: self.rows,
            data,
        }
    }

    /// `self · other`, accumulated in f64 (a reference product for tests and small host
    /// computations, not a fast GEMM).
    pub fn matmul(&self, other: &Matrix) -> Result<Matrix, StarKvError> {
        if self.cols != other.rows {
            return Err(StarKvError::InvalidArgument(format!(
                "cannot multiply {} × {} by {} × {}",
                self.rows, self.cols, other.rows, other.cols
            )));
        }
        Ok(Matrix::from_faer(&(self.to_faer() * other.to_faer())))
    }

    /// Squared Frobenius norm, in f64.
    pub fn frobenius_sq(&self) -> f64 {
        self.data.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
    }

    /// Squared Frobenius norm of `self − other`, in f64.
    pub fn distance_sq(&self, other: &Matrix) -> Result<f64, StarKvError> {
        if self.shape() != other.shape() {
            return Err(StarKvError::InvalidArgument(format!(
                "cannot compare {:?} with {:?}",
                self.shape(),
                other.shape()
            )));
        }
        Ok(self
            .data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum())
    }

    /// The matrix in f64, for faer.
    pub(crate) fn to_faer(&self) -> Mat<f64> {
        Mat::from_fn(self.rows, self.cols, |i, j| {
            f64::from(self.data[i * self.cols + j])
        })
    }

    /// A faer matrix rounded to f32, row-major.
    pub(crate) fn from_faer(mat: &Mat<f64>) -> Matrix {
        let (rows, cols) = (mat.nrows(), mat.ncols());
        let mut data = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            for j in 0..cols {
                data.push(mat[(i, j)] as f32);
            }
        }
        Matrix { rows, cols, data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_the_element_count() {
        assert!(Matrix::new(2, 3, vec![0.0; 6]).is_ok());
        assert!(matches!(
            Matrix::new(2, 3, vec![0.0; 5]),
            Err(StarKvError::SizeMismatch {
                expected: 6,
                found: 5,
                ..
            })
        ));
    }

    #[test]
    fn matmul_and_row_blocks() {
        let a = Matrix::new(2, 3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let b = Matrix::new(3, 1, vec![1.0, 0.0, -1.0]).unwrap();
        assert_eq!(a.matmul(&b).unwrap().data(), &[-2.0, -2.0]);
        assert!(b.matmul(&b).is_err());
        assert_eq!(a.row_block(1, 2).unwrap().data(), &[4.0, 5.0, 6.0]);
        assert!(a.row_block(1, 3).is_err());
        assert_eq!(a.row(1), &[4.0, 5.0, 6.0]);
        assert_eq!(a.transpose().data(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        assert_eq!(a.frobenius_sq(), 91.0);
        assert_eq!(a.distance_sq(&a).unwrap(), 0.0);
    }
}
