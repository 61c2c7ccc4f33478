//! Row-wise and elementwise ops: embedding gather, RMSNorm, residual add, SwiGLU, RoPE.

use rayon::prelude::*;

use super::{matrix_dims, rope_head};
use crate::{AttentionDims, BackendError, HostTensor, RopeSpec};

/// Gathers rows of `table` by token id.
pub fn embedding(table: &HostTensor, ids: &[u32]) -> Result<HostTensor, BackendError> {
    let (vocab, d) = matrix_dims(table, "embedding table")?;
    let mut out = Vec::with_capacity(ids.len() * d);
    for &id in ids {
        let id = id as usize;
        if id >= vocab {
            return Err(BackendError::Shape(format!(
                "token id {id} outside a vocabulary of {vocab}"
            )));
        }
        out.extend_from_slice(&table.data()[id * d..(id + 1) * d]);
    }
    HostTensor::new(vec![ids.len(), d], out)
}

/// Selected rows, in order.
pub fn gather_rows(x: &HostTensor, rows: &[u32]) -> Result<HostTensor, BackendError> {
    embedding(x, rows)
}

/// `x * rsqrt(mean(x²) + eps) * w`, row by row, in f32.
pub fn rms_norm(x: &HostTensor, w: &HostTensor, eps: f32) -> Result<HostTensor, BackendError> {
    let (_, d) = matrix_dims(x, "rms_norm input")?;
    if w.numel() != d {
        return Err(BackendError::Shape(format!(
            "rms_norm: weight of {} for rows of {d}",
            w.numel()
        )));
    }
    let mut out = x.data().to_vec();
    out.par_chunks_mut(d.max(1)).for_each(|row| {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w.data()) {
            *v = *v * inv * g;
        }
    });
    HostTensor::new(x.shape().to_vec(), out)
}

/// `x += delta`.
pub fn add_inplace(x: &mut HostTensor, delta: &HostTensor) -> Result<(), BackendError> {
    if x.shape() != delta.shape() {
        return Err(BackendError::Shape(format!(
            "add: {:?} vs {:?}",
            x.shape(),
            delta.shape()
        )));
    }
    for (a, b) in x.data_mut().iter_mut().zip(delta.data()) {
        *a += b;
    }
    Ok(())
}

/// `silu(gate) * up` on a fused `[n, 2f]` tensor.
pub fn silu_mul(gate_up: &HostTensor) -> Result<HostTensor, BackendError> {
    gated(gate_up, "silu_mul", |g| g / (1.0 + (-g).exp()))
}

/// `gelu(gate) * up` on a fused `[n, 2f]` tensor, GELU's tanh approximation (PyTorch's
/// `gelu(approximate="tanh")`): `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))`.
pub fn gelu_tanh_mul(gate_up: &HostTensor) -> Result<HostTensor, BackendError> {
    gated(gate_up, "gelu_tanh_mul", gelu_tanh)
}

/// GELU, tanh approximation.
pub fn gelu_tanh(g: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
}

/// `act(gate) * up` on a fused `[n, 2f]` gate|up tensor.
fn gated(
    gate_up: &HostTensor,
    what: &str,
    act: impl Fn(f32) -> f32 + Sync,
) -> Result<HostTensor, BackendError> {
    let (n, two_f) = matrix_dims(gate_up, what)?;
    if two_f % 2 != 0 {
        return Err(BackendError::Shape(format!("{what}: odd width {two_f}")));
    }
    let f = two_f / 2;
    let mut out = vec![0.0f32; n * f];
    out.par_chunks_mut(f.max(1))
        .zip(gate_up.data().par_chunks(two_f.max(1)))
        .for_each(|(o, gu)| {
            let (gate, up) = gu.split_at(f);
            for ((o, g), u) in o.iter_mut().zip(gate).zip(up) {
                *o = act(*g) * u;
            }
        });
    HostTensor::new(vec![n, f], out)
}

/// RoPE on the Q and K parts of a fused `[n, q | k | v]` tensor.
pub fn rope_qk(
    qkv: &mut HostTensor,
    dims: &AttentionDims,
    rope: &RopeSpec,
    positions: &[u32],
) -> Result<(), BackendError> {
    let (n, width) = matrix_dims(qkv, "rope input")?;
    if width != dims.qkv_size() || positions.len() != n {
        return Err(BackendError::Shape(format!(
            "rope: [{n}, {width}] with {} positions, expected width {}",
            positions.len(),
            dims.qkv_size()
        )));
    }
    if rope.inv_freqs.len() * 2 != dims.head_dim {
        return Err(BackendError::Shape(format!(
            "rope: {} frequencies for head_dim {}",
            rope.inv_freqs.len(),
            dims.head_dim
        )));
    }
    let rotated = dims.q_size() + dims.kv_size();
    qkv.data_mut()
        .par_chunks_mut(width)
        .zip(positions.par_iter())
        .for_each(|(row, &pos)| {
            for head in row[..rotated].chunks_exact_mut(dims.head_dim) {
                rope_head(head, pos, &rope.inv_freqs, rope.style);
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RopeStyle;

    #[test]
    fn rms_norm_matches_hand_example() {
        let x = HostTensor::new(vec![1, 2], vec![3.0, 4.0]).unwrap();
        let w = HostTensor::new(vec![2], vec![1.0, 2.0]).unwrap();
        let y = rms_norm(&x, &w, 0.0).unwrap();
        let rms = (12.5f32).sqrt();
        assert!((y.data()[0] - 3.0 / rms).abs() < 1e-6);
        assert!((y.data()[1] - 8.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn silu_mul_hand_example() {
        let gu = HostTensor::new(vec![1, 2], vec![1.0, 3.0]).unwrap();
        let y = silu_mul(&gu).unwrap();
        let silu1 = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((y.data()[0] - 3.0 * silu1).abs() < 1e-6);
    }

    /// PyTorch's `gelu(x, approximate="tanh")` at a few points (values from torch 2.11, f32).
    #[test]
    fn gelu_tanh_matches_pytorch() {
        for (x, want) in [
            (-3.0f32, -0.003_637_433),
            (-0.5, -0.154_286),
            (0.0, 0.0),
            (1.0, 0.841_192),
            (2.5, 2.484_915_7),
        ] {
            assert!(
                (gelu_tanh(x) - want).abs() < 1e-6,
                "gelu_tanh({x}) = {}",
                gelu_tanh(x)
            );
        }
        let gu = HostTensor::new(vec![1, 2], vec![1.0, 3.0]).unwrap();
        let y = gelu_tanh_mul(&gu).unwrap();
        assert!((y.data()[0] - 3.0 * 0.841_192).abs() < 1e-5);
    }

    #[test]
    fn rope_styles_agree_up_to_the_permutation() {
        // Interleaved rope on a vector whose halves were interleaved equals NeoX rope on the
        // original, permuted the same way — the identity llama.cpp's converter relies on.
        let hd = 8;
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let orig: Vec<f32> = (0..hd).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut neox = orig.clone();
        rope_head(&mut neox, 7, &inv, RopeStyle::Neox);
        let perm = |v: &[f32]| -> Vec<f32> {
            (0..hd)
                .map(|j| {
                    if j % 2 == 0 {
                        v[j / 2]
                    } else {
                        v[j / 2 + hd / 2]
                    }
                })
                .collect()
        };
        let mut inter = perm(&orig);
        rope_head(&mut inter, 7, &inv, RopeStyle::Interleaved);
        for (a, b) in inter.iter().zip(perm(&neox)) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn embedding_rejects_out_of_vocab_ids() {
        let t = HostTensor::zeros(vec![4, 2]);
        assert!(embedding(&t, &[1, 4]).is_err());
    }
}
