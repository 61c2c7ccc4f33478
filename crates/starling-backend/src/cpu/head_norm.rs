//! Per-head RMSNorm (Qwen3's q/k norm): the reference of [`crate::ModelOps::rms_norm_heads`], and
//! its argument check, which the CUDA backend calls too so both reject the same input.

use rayon::prelude::*;

use super::matrix_dims;
use crate::{BackendError, HeadSpan, HostTensor};

/// Fails unless `span` lies inside rows of `width` columns, has at least one head of a non-zero
/// width, and `weight_len` (the weight's element count) is its `head_dim`.
pub fn check_head_span(
    width: usize,
    weight_len: usize,
    span: HeadSpan,
) -> Result<(), BackendError> {
    if span.num_heads == 0 || span.head_dim == 0 {
        return Err(BackendError::Shape(format!(
            "rms_norm_heads: empty span {span:?}"
        )));
    }
    if span.end_col() > width {
        return Err(BackendError::Shape(format!(
            "rms_norm_heads: span {span:?} ends at column {} of rows {width} wide",
            span.end_col()
        )));
    }
    if weight_len != span.head_dim {
        return Err(BackendError::Shape(format!(
            "rms_norm_heads: weight of {weight_len} for heads of {}",
            span.head_dim
        )));
    }
    Ok(())
}

/// Every `head_dim` slice of `span` in every row of `x` becomes `v * rsqrt(mean(v²) + eps) * w`,
/// in f32 (the same formula as [`super::elementwise::rms_norm`], per head).
pub fn rms_norm_heads(
    x: &mut HostTensor,
    w: &HostTensor,
    span: HeadSpan,
    eps: f32,
) -> Result<(), BackendError> {
    let (_, width) = matrix_dims(x, "rms_norm_heads input")?;
    check_head_span(width, w.numel(), span)?;
    let weight = w.data();
    let d = span.head_dim;
    x.data_mut().par_chunks_mut(width).for_each(|row| {
        for head in row[span.first_col..span.end_col()].chunks_exact_mut(d) {
            let mean_sq = head.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean_sq + eps).sqrt();
            for (v, g) in head.iter_mut().zip(weight) {
                *v = *v * inv * g;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(first_col: usize, num_heads: usize, head_dim: usize) -> HeadSpan {
        HeadSpan {
            first_col,
            num_heads,
            head_dim,
        }
    }

    /// Row `[9, 3, 4, 0, 0, 5]`, span of two heads of 2 from column 1, weight `[1, 2]`:
    /// head (3, 4) has mean square 12.5, head (0, 0) stays zero (eps keeps it finite); columns 0
    /// and 5 are untouched.
    #[test]
    fn normalises_each_head_of_the_span_only() {
        let mut x = HostTensor::new(vec![1, 6], vec![9.0, 3.0, 4.0, 0.0, 0.0, 5.0]).unwrap();
        let w = HostTensor::new(vec![2], vec![1.0, 2.0]).unwrap();
        rms_norm_heads(&mut x, &w, span(1, 2, 2), 1e-6).unwrap();
        let inv = 1.0 / (12.5f32 + 1e-6).sqrt();
        let want = [9.0, 3.0 * inv, 4.0 * inv * 2.0, 0.0, 0.0, 5.0];
        for (got, want) in x.data().iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{:?}", x.data());
        }
    }

    #[test]
    fn equals_a_row_norm_of_each_head() {
        let (rows, heads, d) = (3, 4, 8);
        let data: Vec<f32> = (0..rows * heads * d)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let w = HostTensor::new(vec![d], (0..d).map(|i| 0.5 + i as f32 / 8.0).collect()).unwrap();
        let mut x = HostTensor::new(vec![rows, heads * d], data.clone()).unwrap();
        rms_norm_heads(&mut x, &w, span(0, heads, d), 1e-6).unwrap();
        let per_head = HostTensor::new(vec![rows * heads, d], data).unwrap();
        let want = super::super::elementwise::rms_norm(&per_head, &w, 1e-6).unwrap();
        assert_eq!(x.data(), want.data());
    }

    #[test]
    fn rejects_spans_outside_the_row_and_wrong_weights() {
        let mut x = HostTensor::zeros(vec![2, 8]);
        let w = HostTensor::zeros(vec![4]);
        for bad in [span(1, 2, 4), span(0, 0, 4), span(0, 1, 0)] {
            assert!(rms_norm_heads(&mut x, &w, bad, 1e-6).is_err(), "{bad:?}");
        }
        let w3 = HostTensor::zeros(vec![3]);
        assert!(rms_norm_heads(&mut x, &w3, span(0, 2, 4), 1e-6).is_err());
        assert!(rms_norm_heads(&mut x, &w, span(4, 1, 4), 1e-6).is_ok());
    }
}
