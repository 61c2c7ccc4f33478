//! The job an external trainer runs: what it reads, with which settings, and where.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::super::train::initial_alphas;
use super::super::DistillError;
use crate::threshold::ThresholdInit;
use crate::{BudgetTarget, CacheBudget, FactorKind, KvShape, ModelFactors, ModelSpectra};

/// The job format this crate writes and the script checks. Bump on any incompatible change.
pub const JOB_FORMAT: u32 = 1;
/// The job description, JSON.
pub const JOB_FILE: &str = "job.json";
/// The full-rank factors of every compressed layer, f32 safetensors.
pub const FACTORS_FILE: &str = "factors.safetensors";
/// The calibration token ids, little-endian u32.
pub const TOKENS_FILE: &str = "tokens.u32";

/// The model the trainer loads as teacher (and patches into the student).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobModel {
    /// A GGUF file or a Hugging Face model directory, as Starling opened it.
    pub path: String,
    /// Starling's identity of the weights the factors came from (recorded, for messages).
    pub weights_sha256: String,
    /// Whether each key head's rows (of `k_u` here, of `k_up` in a checkpoint) are in
    /// adjacent-pair RoPE order, as Starling holds GGUF `llama` weights (llama.cpp permuted
    /// them); a trainer on Hugging Face weights takes them to halves order and back.
    pub key_rows_interleaved: bool,
}

/// How the threshold phase holds each profile's budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetControl {
    /// A Lagrangian price on the soft rank raised by dual ascent, at a constant learning rate:
    /// the CPU distiller's objective (the two backends agree step for step). Over hundreds of
    /// steps the soft rank swings around the budget (measured on the H100: 0.5-1.45x the
    /// budget with a period of about 64 steps), so the thresholds end wherever the swing is.
    #[default]
    Dual,
    /// Every step shifts all threshold logits by one constant (found by bisection, no
    /// gradient) so the soft rank equals the budget, then takes an Adam step on the KL,
    /// its gradient's component along the soft rank's gradient removed (the least-squares
    /// price) and its learning rate cosine-decayed to a tenth: the KL is always that of a
    /// student at the budget, and nothing oscillates.
    Projected,
}

/// Threshold-distillation settings (the objective of [`super::super::DistillConfig`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobThresholds {
    /// Calibration tokens per profile (rounded up to whole steps).
    pub tokens: u64,
    /// Adam's learning rate on `θ`, `α = sigmoid(θ)`.
    pub learning_rate: f64,
    /// Tanh sharpness `s` on `σ̂`.
    pub sharpness: f64,
    /// Dual-ascent rate of the budget price.
    pub dual_rate: f64,
    /// The budget price at the first step.
    pub initial_multiplier: f64,
    /// How the budget is held (`dual_rate` and `initial_multiplier` matter for `dual` only).
    #[serde(default)]
    pub budget: BudgetControl,
}

/// Projection-refinement settings (0 tokens: no refinement).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRefine {
    /// Calibration tokens per profile (rounded up to whole steps).
    pub tokens: u64,
    /// Adam's step size relative to each matrix's RMS entry (cosine-decayed to a tenth).
    pub learning_rate: f64,
}

/// One profile to distil.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobProfile {
    /// Its name, also the name of its folder in the job directory.
    pub name: String,
    /// The share of K/V elements per token removed, per-mille.
    pub removed_permille: u32,
    /// What the compressed layers' ranks must sum to.
    pub target_elements: u64,
    /// The starting `α` per factor, canonical order.
    pub initial_alphas: Vec<f64>,
}

/// Everything [`JOB_FILE`] holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExternalJob {
    /// Always [`JOB_FORMAT`].
    pub format: u32,
    /// The teacher.
    pub model: JobModel,
    /// The attention shapes.
    pub shape: KvShape,
    /// Layers whose K/V projections the student replaces, ascending.
    pub compressed_layers: Vec<usize>,
    /// [`FACTORS_FILE`].
    pub factors_file: String,
    /// sha256 of the factors file's bytes (a resumed job must train the same factors).
    pub factors_sha256: String,
    /// [`TOKENS_FILE`].
    pub tokens_file: String,
    /// sha256 of the token file's bytes.
    pub tokens_sha256: String,
    /// Calibration tokens in the file.
    pub tokens: u64,
    /// Tokens per window (each window runs from position 0).
    pub window_tokens: usize,
    /// Windows per optimisation step.
    pub batch_windows: usize,
    /// Whether window order is a seeded permutation per epoch (otherwise file order, as the
    /// CPU distiller's `step mod windows`).
    pub shuffle: bool,
    /// The seed of the permutation.
    pub seed: u64,
    /// Largest relative Frobenius error with which the factors must reproduce the trainer's
    /// own copy of the K/V weights (dequantisation and dtype differ a little; a layout or
    /// model mismatch by far more).
    pub factor_tolerance: f64,
    /// Threshold distillation.
    pub thresholds: JobThresholds,
    /// Projection refinement.
    pub refine: JobRefine,
    /// The profiles, in the order they run.
    pub profiles: Vec<JobProfile>,
}

/// How the trainer is asked to run, apart from the profiles.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSettings {
    /// See [`ExternalJob::window_tokens`].
    pub window_tokens: usize,
    /// See [`ExternalJob::batch_windows`].
    pub batch_windows: usize,
    /// See [`ExternalJob::shuffle`].
    pub shuffle: bool,
    /// See [`ExternalJob::seed`].
    pub seed: u64,
    /// Threshold distillation.
    pub thresholds: JobThresholds,
    /// Refinement.
    pub refine: JobRefine,
    /// The allocation the thresholds start from.
    pub init: ThresholdInit,
}

/// The bytes a job writes besides its description.
pub struct JobFiles {
    factors: Vec<u8>,
    tokens: Vec<u8>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `σ / σ_max` per factor, canonical order (the student's `σ̂`).
pub(super) fn scaled_spectra(factors: &ModelFactors) -> Vec<Vec<f64>> {
    factors
        .factors()
        .into_iter()
        .map(|(_, f)| {
            let sigma = f.singular_values();
            let top = sigma.first().copied().unwrap_or(0.0);
            sigma
                .iter()
                .map(|s| if top > 0.0 { s / top } else { 0.0 })
                .collect()
        })
        .collect()
}

/// The factors file's bytes: per factor `U`, `σ` and `R` (the student's `U diag(σ) R = W`).
fn factors_bytes(factors: &ModelFactors) -> Result<Vec<u8>, DistillError> {
    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (id, f) in factors.factors() {
        let k = f.max_rank();
        let (u_name, s_name, r_name) = match id.kind {
            FactorKind::Key { head } => (
                format!("layers.{}.k_u.{head}", id.layer),
                format!("layers.{}.k_sigma.{head}", id.layer),
                format!("layers.{}.k_r.{head}", id.layer),
            ),
            FactorKind::Value => (
                format!("layers.{}.v_u", id.layer),
                format!("layers.{}.v_sigma", id.layer),
                format!("layers.{}.v_r", id.layer),
            ),
        };
        let u = f.up_projection(k)?;
        let r = f.down_projection_with(&vec![1.0; k])?;
        let sigma: Vec<f32> = f.singular_values().iter().map(|&s| s as f32).collect();
        named.push((u_name, u.shape().to_vec(), le(u.data())));
        named.push((s_name, vec![k], le(&sigma)));
        named.push((r_name, r.shape().to_vec(), le(r.data())));
    }
    let views = named
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| DistillError::InvalidArgument(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None::<HashMap<String, String>>)
        .map_err(|e| DistillError::InvalidArgument(format!("serialising the factors: {e}")))
}

impl ExternalJob {
    /// The job for `factors` of `model` on `text_ids`, one entry per `(name, target)` profile
    /// (its budget and its starting thresholds from `settings.init`), and the files it needs.
    pub fn new(
        model: JobModel,
        factors: &ModelFactors,
        text_ids: &[u32],
        profiles: &[(String, BudgetTarget)],
        settings: &JobSettings,
    ) -> Result<(Self, JobFiles), DistillError> {
        if settings.window_tokens < 2 || settings.batch_windows == 0 {
            return Err(DistillError::InvalidArgument(format!(
                "windows of {} tokens, {} per step: need at least 2 tokens and 1 window",
                settings.window_tokens, settings.batch_windows
            )));
        }
        let step_tokens = settings.window_tokens * settings.batch_windows;
        if text_ids.len() < step_tokens {
            return Err(DistillError::InvalidArgument(format!(
                "{} calibration tokens hold no step of {} windows of {} tokens",
                text_ids.len(),
                settings.batch_windows,
                settings.window_tokens
            )));
        }
        let shape = factors.shape();
        let spectra = ModelSpectra::of(factors)?;
        let scaled = scaled_spectra(factors);
        let mut job_profiles = Vec::with_capacity(profiles.len());
        for (name, target) in profiles {
            let budget = CacheBudget::new(&shape, *target, factors.uncompressed())?;
            let target_elements = budget.compressed_elements_per_token;
            job_profiles.push(JobProfile {
                name: name.clone(),
                removed_permille: target.permille(),
                target_elements,
                initial_alphas: initial_alphas(&spectra, &scaled, target_elements, settings.init)?,
            });
        }
        let files = JobFiles {
            factors: factors_bytes(factors)?,
            tokens: text_ids.iter().flat_map(|t| t.to_le_bytes()).collect(),
        };
        let compressed_layers = (0..shape.num_layers)
            .filter(|&l| factors.layer(l).is_some())
            .collect();
        let job = Self {
            format: JOB_FORMAT,
            model,
            shape,
            compressed_layers,
            factors_file: FACTORS_FILE.to_owned(),
            factors_sha256: sha256_hex(&files.factors),
            tokens_file: TOKENS_FILE.to_owned(),
            tokens_sha256: sha256_hex(&files.tokens),
            tokens: text_ids.len() as u64,
            window_tokens: settings.window_tokens,
            batch_windows: settings.batch_windows,
            shuffle: settings.shuffle,
            seed: settings.seed,
            factor_tolerance: 2e-2,
            thresholds: settings.thresholds.clone(),
            refine: settings.refine.clone(),
            profiles: job_profiles,
        };
        Ok((job, files))
    }

    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&JobProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Writes the job into `dir`. When `dir` already holds exactly this job (same settings,
    /// factors and tokens) it is kept as it is, with whatever the trainer saved there, so the
    /// run resumes; returns `true` then. Any other content of `dir` is removed first.
    pub fn write(&self, dir: &Path, files: &JobFiles) -> Result<bool, DistillError> {
        let io = |what: &str, e: std::io::Error| {
            DistillError::InvalidArgument(format!("{what} {}: {e}", dir.display()))
        };
        let description = serde_json::to_string_pretty(self)
            .map_err(|e| DistillError::InvalidArgument(format!("job description: {e}")))?;
        let job_path = dir.join(JOB_FILE);
        if std::fs::read_to_string(&job_path).is_ok_and(|old| old == description) {
            return Ok(true);
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| io("clearing the job directory", e))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
        std::fs::write(dir.join(FACTORS_FILE), &files.factors)
            .map_err(|e| io("writing the factors into", e))?;
        std::fs::write(dir.join(TOKENS_FILE), &files.tokens)
            .map_err(|e| io("writing the tokens into", e))?;
        // Written last: a job directory with a description is complete.
        std::fs::write(&job_path, description).map_err(|e| io("writing the job into", e))?;
        Ok(false)
    }
}
