//! `y = x · wᵀ + b` through the `gemm` crate.

use super::matrix_dims;
use crate::{BackendError, HostTensor};

/// `x` `[n, k]` times `w` `[m, k]` transposed, plus an optional bias `[m]` → `[n, m]`.
pub fn linear(
    x: &HostTensor,
    w: &HostTensor,
    bias: Option<&HostTensor>,
) -> Result<HostTensor, BackendError> {
    let (n, k) = matrix_dims(x, "linear input")?;
    let (m, wk) = matrix_dims(w, "linear weight")?;
    if k != wk {
        return Err(BackendError::Shape(format!(
            "linear: input [{n}, {k}] vs weight [{m}, {wk}]"
        )));
    }
    let mut out = vec![0.0f32; n * m];
    let read_dst = if let Some(b) = bias {
        if b.numel() != m {
            return Err(BackendError::Shape(format!(
                "linear: bias of {} for {m} outputs",
                b.numel()
            )));
        }
        for row in out.chunks_exact_mut(m) {
            row.copy_from_slice(b.data());
        }
        true
    } else {
        false
    };
    if n > 0 && m > 0 && k > 0 {
        // SAFETY: the pointers cover exactly n*k, m*k and n*m f32 values with the strides given
        // (row-major x and out; w read transposed: element (kk, j) of wᵀ is w[j*k + kk]), and
        // `out` is not aliased.
        unsafe {
            gemm::gemm(
                n,
                m,
                k,
                out.as_mut_ptr(),
                1,
                m as isize,
                read_dst,
                x.data().as_ptr(),
                1,
                k as isize,
                w.data().as_ptr(),
                k as isize,
                1,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            );
        }
    }
    HostTensor::new(vec![n, m], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_with_bias() {
        let (n, k, m) = (3, 5, 4);
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let b: Vec<f32> = (0..m).map(|i| i as f32 - 1.5).collect();
        let y = linear(
            &HostTensor::new(vec![n, k], x.clone()).unwrap(),
            &HostTensor::new(vec![m, k], w.clone()).unwrap(),
            Some(&HostTensor::new(vec![m], b.clone()).unwrap()),
        )
        .unwrap();
        for r in 0..n {
            for c in 0..m {
                let want: f32 = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum::<f32>() + b[c];
                assert!((y.data()[r * m + c] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn rejects_mismatched_inner_dims() {
        let x = HostTensor::zeros(vec![2, 3]);
        let w = HostTensor::zeros(vec![4, 5]);
        assert!(linear(&x, &w, None).is_err());
    }
}
