//! The student's compressed projections: per compressed layer, the SVD factors as tensors and
//! the K/V weights `U diag(v) R` for singular values `v` chosen by a [`Values`] rule (soft
//! thresholds with a trainable `α`, the exact spectrum, or a hard rank per factor).

use candle_core::{Device, Tensor};

use super::frozen::KvWeights;
use super::DistillError;
use crate::{Factorization, ModelFactors};

/// Which singular values the student's factors use.
pub(crate) enum Values<'a> {
    /// `σ_max · σ̂ · tanh(s (σ̂ − α_f))` above `α_f`, 0 below, with `alphas [factors]` in
    /// canonical order (a tracked tensor while training).
    Soft {
        /// One threshold per factor, canonical order, in units of `σ_max`.
        alphas: &'a Tensor,
        /// The tanh sharpness `s`.
        sharpness: f64,
    },
    /// `σ` itself: the factors reproduce `W` (up to f32 rounding). The parity tests'
    /// student.
    #[cfg(test)]
    Exact,
    /// The first `ranks[f]` values of factor `f` (canonical order), the rest 0: a truncation.
    Hard(&'a [usize]),
}

/// One compressed layer's factors. Keys stack their heads on a leading axis (every key head
/// has the same shape), so a layer costs one batched product per projection.
struct LayerTensors {
    layer: usize,
    /// `[kv_heads, head_dim, k]`.
    key_u: Tensor,
    /// `[kv_heads, k, hidden]`.
    key_r: Tensor,
    /// `σ`, `[kv_heads, k]`.
    key_sigma: Tensor,
    /// `σ / σ_max`, `[kv_heads, k]`.
    key_scaled: Tensor,
    /// `[kv_size, k_v]`.
    value_u: Tensor,
    /// `[k_v, hidden]`.
    value_r: Tensor,
    /// `[k_v]`.
    value_sigma: Tensor,
    /// `[k_v]`.
    value_scaled: Tensor,
}

/// Every compressed layer's factors, plus the scaled spectra on the host (canonical order).
pub(crate) struct StudentFactors {
    layers: Vec<LayerTensors>,
    num_layers: usize,
    kv_heads: usize,
    scaled: Vec<Vec<f64>>,
}

/// One factor's parts, row-major.
struct FactorParts {
    /// `U`, `[rows, k]`.
    u: Vec<f32>,
    /// `R`, `[k, cols]`.
    r: Vec<f32>,
    /// `σ`.
    sigma: Vec<f64>,
    /// `σ / σ_max`.
    scaled: Vec<f64>,
}

fn factor_parts(f: &Factorization) -> Result<FactorParts, DistillError> {
    let k = f.max_rank();
    let u = f.up_projection(k)?.into_data();
    let r = f.down_projection_with(&vec![1.0; k])?.into_data();
    let sigma = f.singular_values().to_vec();
    let top = sigma.first().copied().unwrap_or(0.0);
    let scaled = sigma
        .iter()
        .map(|s| if top > 0.0 { s / top } else { 0.0 })
        .collect();
    Ok(FactorParts {
        u,
        r,
        sigma,
        scaled,
    })
}

fn f32s(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

impl StudentFactors {
    /// The tensors of every factor of `factors`.
    pub(crate) fn new(factors: &ModelFactors) -> Result<Self, DistillError> {
        let shape = factors.shape();
        let (heads, hd, hidden) = (shape.num_kv_heads, shape.head_dim, shape.hidden_size);
        let device = Device::Cpu;
        let mut layers = Vec::new();
        let mut scaled_all = Vec::new();
        for layer in 0..shape.num_layers {
            let Some(lf) = factors.layer(layer) else {
                continue;
            };
            let k = shape.max_key_rank();
            let (mut u, mut r, mut sigma, mut scaled) = (vec![], vec![], vec![], vec![]);
            for key in &lf.keys {
                let parts = factor_parts(key)?;
                u.extend(parts.u);
                r.extend(parts.r);
                sigma.extend(f32s(&parts.sigma));
                scaled.extend(f32s(&parts.scaled));
                scaled_all.push(parts.scaled);
            }
            let value = factor_parts(&lf.value)?;
            let kv_k = value.sigma.len();
            layers.push(LayerTensors {
                layer,
                key_u: Tensor::from_vec(u, (heads, hd, k), &device)?,
                key_r: Tensor::from_vec(r, (heads, k, hidden), &device)?,
                key_sigma: Tensor::from_vec(sigma, (heads, k), &device)?,
                key_scaled: Tensor::from_vec(scaled, (heads, k), &device)?,
                value_u: Tensor::from_vec(value.u, (heads * hd, kv_k), &device)?,
                value_r: Tensor::from_vec(value.r, (kv_k, hidden), &device)?,
                value_sigma: Tensor::from_vec(f32s(&value.sigma), kv_k, &device)?,
                value_scaled: Tensor::from_vec(f32s(&value.scaled), kv_k, &device)?,
            });
            scaled_all.push(value.scaled);
        }
        Ok(Self {
            layers,
            num_layers: shape.num_layers,
            kv_heads: heads,
            scaled: scaled_all,
        })
    }

    /// Per factor (canonical order), `σ / σ_max`.
    pub(crate) fn scaled(&self) -> &[Vec<f64>] {
        &self.scaled
    }

    /// The first compressed layer (`num_layers` when none is).
    pub(crate) fn first_layer(&self) -> usize {
        self.layers.first().map_or(self.num_layers, |l| l.layer)
    }

    /// Per layer, the K/V weights the student uses (`None` for uncompressed layers).
    pub(crate) fn kv_weights(
        &self,
        values: &Values,
    ) -> Result<Vec<Option<KvWeights>>, DistillError> {
        let mut out: Vec<Option<KvWeights>> = (0..self.num_layers).map(|_| None).collect();
        let per_layer = self.kv_heads + 1;
        for (index, lt) in self.layers.iter().enumerate() {
            let first = index * per_layer;
            let (key_values, value_values) = match values {
                #[cfg(test)]
                Values::Exact => (lt.key_sigma.clone(), lt.value_sigma.clone()),
                Values::Soft { alphas, sharpness } => {
                    let key_alpha = alphas.narrow(0, first, self.kv_heads)?.unsqueeze(1)?;
                    let value_alpha = alphas.narrow(0, first + self.kv_heads, 1)?;
                    (
                        soft_threshold(&lt.key_sigma, &lt.key_scaled, &key_alpha, *sharpness)?,
                        soft_threshold(
                            &lt.value_sigma,
                            &lt.value_scaled,
                            &value_alpha,
                            *sharpness,
                        )?,
                    )
                }
                Values::Hard(ranks) => {
                    let key_mask = self.mask(ranks, first, self.kv_heads)?;
                    let value_mask = self.mask(ranks, first + self.kv_heads, 1)?.squeeze(0)?;
                    ((&lt.key_sigma * key_mask)?, (&lt.value_sigma * value_mask)?)
                }
            };
            let (heads, hd, _) = lt.key_u.dims3()?;
            let hidden = lt.key_r.dim(2)?;
            let key = lt
                .key_u
                .broadcast_mul(&key_values.unsqueeze(1)?)?
                .matmul(&lt.key_r)?
                .reshape((heads * hd, hidden))?;
            let value = lt
                .value_u
                .broadcast_mul(&value_values.unsqueeze(0)?)?
                .matmul(&lt.value_r)?;
            out[lt.layer] = Some(KvWeights { key, value });
        }
        Ok(out)
    }

    /// `Σ_f Σ_i sigmoid(s (σ̂_i − α_f))`, the differentiable stand-in for the kept count.
    pub(crate) fn soft_rank(
        &self,
        alphas: &Tensor,
        sharpness: f64,
    ) -> Result<Tensor, DistillError> {
        let per_layer = self.kv_heads + 1;
        let mut total = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu)?;
        for (index, lt) in self.layers.iter().enumerate() {
            let first = index * per_layer;
            let key_alpha = alphas.narrow(0, first, self.kv_heads)?.unsqueeze(1)?;
            let value_alpha = alphas.narrow(0, first + self.kv_heads, 1)?;
            let keys = sigmoid(&(lt.key_scaled.broadcast_sub(&key_alpha)? * sharpness)?)?;
            let value = sigmoid(&(lt.value_scaled.broadcast_sub(&value_alpha)? * sharpness)?)?;
            total = ((total + keys.sum_all()?)? + value.sum_all()?)?;
        }
        Ok(total)
    }

    /// `[count, k]` 0/1 rows keeping the first `ranks[first + i]` components of row `i`.
    fn mask(&self, ranks: &[usize], first: usize, count: usize) -> Result<Tensor, DistillError> {
        let k = self.scaled.get(first).map_or(0, Vec::len);
        let rows = ranks.get(first..first + count).ok_or_else(|| {
            DistillError::InvalidArgument(format!(
                "{} ranks for at least {} factors",
                ranks.len(),
                first + count
            ))
        })?;
        let data: Vec<f32> = rows
            .iter()
            .flat_map(|&r| (0..k).map(move |c| if c < r { 1.0 } else { 0.0 }))
            .collect();
        Ok(Tensor::from_vec(data, (count, k), &Device::Cpu)?)
    }
}

/// `σ · tanh(relu(s (σ̂ − α)))`: `σ tanh(s (σ̂ − α))` above the threshold, 0 below (the
/// `σ_max` scale is already in `σ = σ_max σ̂`).
fn soft_threshold(
    sigma: &Tensor,
    scaled: &Tensor,
    alpha: &Tensor,
    sharpness: f64,
) -> Result<Tensor, DistillError> {
    let gate = (scaled.broadcast_sub(alpha)? * sharpness)?.relu()?.tanh()?;
    Ok((sigma * gate)?)
}

/// `sigmoid(x) = (1 + tanh(x / 2)) / 2` (candle-core has tanh with a backward, not sigmoid).
pub(crate) fn sigmoid(x: &Tensor) -> Result<Tensor, DistillError> {
    Ok((((x * 0.5)?.tanh()? + 1.0)? * 0.5)?)
}
