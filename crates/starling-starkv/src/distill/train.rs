//! The distillation loop: Adam on `θ` (`α = sigmoid(θ)`, so `0 < α < 1` like `σ̂`), loss =
//! mean KL + `μ (soft rank − target) / target`, dual ascent on `μ` so the thresholds rise
//! until the soft rank meets the budget.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};

use super::student::{sigmoid, Values};
use super::{DistillConfig, DistillError, DistillStep, Distiller};
use crate::exact_budget::{meet_budget, uniform_ranks};
use crate::threshold::adam::Adam;
use crate::threshold::{alpha_for_rank, effective_rank, ThresholdInit};
use crate::ModelSpectra;

/// The learned thresholds, per step records and the last step's KL.
pub(crate) struct Trained {
    /// `α` per factor, canonical order.
    pub(crate) alphas: Vec<f64>,
    pub(crate) steps: Vec<DistillStep>,
    pub(crate) multiplier: f64,
    pub(crate) last_kl: f64,
}

/// `α` is kept inside `[ALPHA_FLOOR, 1 − ALPHA_FLOOR]` at the start so `θ = logit(α)` is
/// finite (a full-rank start puts `α` at half the smallest `σ̂`, which may be 0).
const ALPHA_FLOOR: f64 = 1e-4;

fn logit(alpha: f64) -> f64 {
    let a = alpha.clamp(ALPHA_FLOOR, 1.0 - ALPHA_FLOOR);
    (a / (1.0 - a)).ln()
}

fn logistic(theta: f64) -> f64 {
    1.0 / (1.0 + (-theta).exp())
}

/// The starting thresholds: midway between the last kept and the first dropped component of
/// `config.init`'s allocation of `target` elements.
pub(crate) fn initial_alphas(
    spectra: &ModelSpectra,
    scaled: &[Vec<f64>],
    target: u64,
    init: ThresholdInit,
) -> Result<Vec<f64>, DistillError> {
    let max_ranks: Vec<usize> = scaled.iter().map(Vec::len).collect();
    let ranks = match init {
        ThresholdInit::Uniform => uniform_ranks(&max_ranks, target)?,
        ThresholdInit::GreedyEnergy => {
            let mut ranks = vec![1; max_ranks.len()];
            let value = |f: usize, c: usize| spectra.component_value(f, c);
            meet_budget(&mut ranks, &max_ranks, target, &value)?;
            ranks
        }
    };
    Ok(scaled
        .iter()
        .zip(&ranks)
        .map(|(s, &r)| alpha_for_rank(s, r))
        .collect())
}

/// Runs `config.steps` steps from `alphas`, window `step mod windows` each.
pub(crate) fn train(
    distiller: &mut Distiller,
    alphas: &[f64],
    target: u64,
    config: &DistillConfig,
) -> Result<Trained, DistillError> {
    let mut theta: Vec<f64> = alphas.iter().map(|&a| logit(a)).collect();
    let var = Var::from_tensor(&Tensor::from_vec(
        theta.iter().map(|&t| t as f32).collect::<Vec<_>>(),
        theta.len(),
        &Device::Cpu,
    )?)?;
    let mut adam = Adam::new(theta.len(), config.learning_rate);
    let mut multiplier = config.initial_multiplier;
    let target_f = target.max(1) as f64;
    let mut steps = Vec::with_capacity(config.steps);
    let mut last_kl = f64::NAN;
    for step in 0..config.steps {
        let start = Instant::now();
        let window = step % distiller.windows();
        let alpha = sigmoid(var.as_tensor())?;
        let values = Values::Soft {
            alphas: &alpha,
            sharpness: config.sharpness,
        };
        let kl = distiller.window_kl(window, &values)?;
        let soft_rank = distiller.student().soft_rank(&alpha, config.sharpness)?;
        let penalty = ((&soft_rank - target_f)? * (multiplier / target_f))?;
        let loss = (&kl + penalty)?;
        let grads = loss.backward()?;
        let grad: Vec<f64> = match grads.get(var.as_tensor()) {
            Some(g) => g.to_vec1::<f32>()?.into_iter().map(f64::from).collect(),
            None => vec![0.0; theta.len()],
        };
        let kl_value = f64::from(kl.to_scalar::<f32>()?);
        let soft_value = f64::from(soft_rank.to_scalar::<f32>()?);
        if !kl_value.is_finite() || !soft_value.is_finite() {
            return Err(DistillError::NonFinite { step, what: "loss" });
        }
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(DistillError::NonFinite {
                step,
                what: "threshold gradient",
            });
        }
        let hard_rank = hard_rank(distiller.student().scaled(), &theta);
        steps.push(DistillStep {
            step,
            window,
            kl: kl_value,
            soft_rank: soft_value,
            hard_rank,
            multiplier,
            elapsed_ms: 0,
        });
        adam.step(&mut theta, &grad);
        var.set(&Tensor::from_vec(
            theta.iter().map(|&t| t as f32).collect::<Vec<_>>(),
            theta.len(),
            &Device::Cpu,
        )?)?;
        multiplier = (multiplier + config.dual_rate * (soft_value - target_f) / target_f).max(0.0);
        last_kl = kl_value;
        if let Some(record) = steps.last_mut() {
            record.elapsed_ms = start.elapsed().as_millis() as u64;
        }
        tracing::info!(
            step,
            window,
            kl = kl_value,
            soft_rank = soft_value,
            multiplier,
            "distill step"
        );
    }
    Ok(Trained {
        alphas: theta.iter().map(|&t| logistic(t)).collect(),
        steps,
        multiplier,
        last_kl,
    })
}

/// `Σ_f #{σ̂ > α_f}` at `α = sigmoid(θ)`.
fn hard_rank(scaled: &[Vec<f64>], theta: &[f64]) -> usize {
    scaled
        .iter()
        .zip(theta)
        .map(|(s, &t)| effective_rank(s, logistic(t)))
        .sum()
}
