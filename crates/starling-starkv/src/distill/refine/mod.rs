//! Refinement of the projections by knowledge distillation: once the ranks are fixed (by the
//! greedy rule or by distilled thresholds), the kept factors themselves — per compressed layer
//! and key head `B_h = U_h[:, :r_h]` and `A_h = diag(σ) R_h[:r_h]`, and the value pair likewise
//! — are trained on the same KL(teacher ‖ student) over the calibration windows, with Adam,
//! for a fixed number of steps, deterministically (window `step mod windows`, no randomness).
//! Ranks do not change, so the KV bytes per token stay exactly the profile's, and the refined
//! matrices go into the checkpoint in the SVD's layout ([`refined_checkpoint`]): the loader
//! and the reference path read them like any other.
//!
//! Why the factors and not the weights `W ≈ B A`: training `B` and `A` keeps the rank by
//! construction, and `A` is what the cache stores latents of.

mod config;
mod record;
mod vars;

use std::time::Instant;

use candle_core::Tensor;

pub use config::{RefineConfig, RefineReport, RefineStep};
pub use record::refined_checkpoint;

use super::{DistillError, Distiller};
use crate::threshold::adam::Adam;
use crate::ModelProjections;
use vars::ProjectionVars;

/// Refines `projections` (which must compress the layers `distiller`'s factors do) for
/// `config.steps` steps on `distiller`'s windows; `on_step` sees each step's record as it
/// ends (for progress). Returns the refined projections, at the same ranks, and the report.
pub fn refine_with(
    distiller: &mut Distiller,
    projections: &ModelProjections,
    config: &RefineConfig,
    on_step: &mut dyn FnMut(&RefineStep),
) -> Result<(ModelProjections, RefineReport), DistillError> {
    config.validate()?;
    distiller.check_layers(&projections.allocation()?)?;
    let vars = ProjectionVars::new(projections)?;
    let mut params: Vec<Vec<f64>> = vars
        .all()
        .into_iter()
        .map(|v| -> Result<Vec<f64>, DistillError> {
            let data = v.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            Ok(data.into_iter().map(f64::from).collect())
        })
        .collect::<Result<_, _>>()?;
    let mut adams: Vec<Adam> = params
        .iter()
        .map(|p| Adam::new(p.len(), config.learning_rate * rms(p)))
        .collect();
    let mut steps = Vec::with_capacity(config.steps);
    for step in 0..config.steps {
        let start = Instant::now();
        let window = step % distiller.windows();
        let kl = distiller.window_kl_with(window, &vars.kv_weights()?)?;
        let kl_value = f64::from(kl.to_scalar::<f32>()?);
        if !kl_value.is_finite() {
            return Err(DistillError::NonFinite { step, what: "loss" });
        }
        let grads = kl.backward()?;
        // Every gradient is read and checked before any parameter moves.
        let mut all_grads = Vec::with_capacity(params.len());
        for (var, param) in vars.all().into_iter().zip(&params) {
            let grad: Vec<f64> = match grads.get(var.as_tensor()) {
                Some(g) => g
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
                None => vec![0.0; param.len()],
            };
            if grad.iter().any(|g| !g.is_finite()) {
                return Err(DistillError::NonFinite {
                    step,
                    what: "projection gradient",
                });
            }
            all_grads.push(grad);
        }
        for (((var, param), adam), grad) in vars
            .all()
            .into_iter()
            .zip(&mut params)
            .zip(&mut adams)
            .zip(&all_grads)
        {
            adam.step(param, grad);
            let data: Vec<f32> = param.iter().map(|&x| x as f32).collect();
            var.set(&Tensor::from_vec(
                data,
                var.as_tensor().shape(),
                var.device(),
            )?)?;
        }
        let record = RefineStep {
            step,
            window,
            kl: kl_value,
            elapsed_ms: start.elapsed().as_millis() as u64,
        };
        tracing::info!(step, window, kl = kl_value, "refine step");
        on_step(&record);
        steps.push(record);
    }
    let report = RefineReport {
        tokens_seen: (steps.len() * distiller.window_tokens()) as u64,
        steps,
        windows: distiller.windows(),
        window_tokens: distiller.window_tokens(),
        learning_rate: config.learning_rate,
    };
    Ok((vars.projections()?, report))
}

/// The root mean square of `values` (0 when empty).
fn rms(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    (values.iter().map(|x| x * x).sum::<f64>() / values.len() as f64).sqrt()
}

#[cfg(test)]
mod tests;
