//! Rotary position embedding for one window (positions `0..T`) and its causal mask, as candle
//! tensors built once per window length.

use candle_core::{Device, Tensor};
use starling_models::{rope_inv_freqs, ModelConfig, RopeStyle};

use super::DistillError;

/// `cos`/`sin` tables `[T, head_dim / 2]` and the causal mask `[T, T]` of one window.
pub(crate) struct RopeTables {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
    mask: Tensor,
}

impl RopeTables {
    /// The tables for positions `0..tokens` of a model with `config`.
    pub(crate) fn new(config: &ModelConfig, tokens: usize) -> Result<Self, DistillError> {
        let inv_freqs = rope_inv_freqs(&config.rope, config.head_dim);
        let half = inv_freqs.len();
        let (mut cos, mut sin) = (Vec::with_capacity(tokens * half), Vec::new());
        sin.reserve(tokens * half);
        for position in 0..tokens {
            for &inv_freq in &inv_freqs {
                // An f32 product, then f32 sin/cos: what the CPU backend's RoPE computes.
                let (s, c) = (position as f32 * inv_freq).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        let mask: Vec<f32> = (0..tokens)
            .flat_map(|i| (0..tokens).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let device = Device::Cpu;
        Ok(Self {
            cos: Tensor::from_vec(cos, (tokens, half), &device)?,
            sin: Tensor::from_vec(sin, (tokens, half), &device)?,
            style: config.rope.style,
            mask: Tensor::from_vec(mask, (tokens, tokens), &device)?,
        })
    }

    /// The causal mask, `[T, T]`.
    pub(crate) fn causal_mask(&self) -> &Tensor {
        &self.mask
    }

    /// Rotates `x [T, heads, head_dim]`: pairs `(i, i + half)` (NeoX) or `(2i, 2i + 1)`
    /// (interleaved), as the config says.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor, DistillError> {
        let (t, heads, hd) = x.dims3()?;
        let half = hd / 2;
        match self.style {
            RopeStyle::Neox => {
                let cos = self.cos.unsqueeze(1)?; // [T, 1, half]
                let sin = self.sin.unsqueeze(1)?;
                let x0 = x.narrow(2, 0, half)?;
                let x1 = x.narrow(2, half, half)?;
                let a = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
                let b = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
                Ok(Tensor::cat(&[&a, &b], 2)?)
            }
            RopeStyle::Interleaved => {
                let pairs = x.reshape((t, heads, half, 2))?;
                let cos = self.cos.reshape((t, 1, half, 1))?;
                let sin = self.sin.reshape((t, 1, half, 1))?;
                let x0 = pairs.narrow(3, 0, 1)?;
                let x1 = pairs.narrow(3, 1, 1)?;
                let a = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
                let b = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
                Ok(Tensor::cat(&[&a, &b], 3)?.reshape((t, heads, hd))?)
            }
        }
    }
}
