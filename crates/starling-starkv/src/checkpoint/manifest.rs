//! The JSON manifest of a checkpoint: what was compressed, how, for which model, at what cost.

use serde::{Deserialize, Serialize};
use starling_models::ModelConfig;

use crate::{CompressionReport, KvShape, LayerRanks, RankAllocation, RankProfile, StarKvError};

/// The `method` every STAR-KV manifest carries.
pub const METHOD: &str = "star_kv";

/// The manifest format this crate writes and reads. Bump on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// Element type of the stored projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectionDtype {
    /// 32-bit float (exact copy of the factors).
    F32,
    /// bfloat16 (half the file; round-to-nearest-even from f32).
    Bf16,
}

/// The model a checkpoint was made for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// `llama` or `qwen2`.
    pub architecture: String,
    /// The attention shapes.
    pub shape: KvShape,
    /// Whether K/V carry biases (kept uncompressed, added after reconstruction).
    pub attention_bias: bool,
    /// How `weights_sha256` was computed (see [`super::IDENTITY_SCHEME`]).
    pub identity_scheme: String,
    /// The weights' identity.
    pub weights_sha256: String,
}

impl ModelIdentity {
    /// The identity of the model with `config` whose weights hash to `weights_sha256`.
    pub fn new(config: &ModelConfig, weights_sha256: String) -> Self {
        Self {
            architecture: config.architecture.name().to_owned(),
            shape: KvShape::of(config),
            attention_bias: config.attention_bias,
            identity_scheme: super::IDENTITY_SCHEME.to_owned(),
            weights_sha256,
        }
    }
}

/// The ranks of one compressed layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerManifest {
    /// Decoder layer.
    pub layer: usize,
    /// Rank of each KV head's key latent.
    pub key_ranks: Vec<usize>,
    /// Rank of the value latent.
    pub value_rank: usize,
}

impl LayerManifest {
    /// The ranks as an allocation entry.
    pub fn ranks(&self) -> LayerRanks {
        LayerRanks {
            key_ranks: self.key_ranks.clone(),
            value_rank: self.value_rank,
        }
    }
}

/// What the projections were calibrated on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationInfo {
    /// Names of the calibration texts the windows were drawn from (empty for weight-only SVD).
    pub data: Vec<String>,
    /// Calibration tokens seen.
    pub tokens: u64,
    /// Optimisation steps (threshold learning, distillation).
    pub steps: u64,
    /// Threshold-distillation steps among `steps`: 0 when the ranks were not distilled.
    /// Absent in older manifests, which had none.
    #[serde(default)]
    pub distillation_steps: u64,
    /// Projection-refinement steps among `steps`: 0 when the projections are the truncated
    /// SVD factors, unrefined ([`Manifest::refinement`] says more when not). Absent in older
    /// manifests, which had none.
    #[serde(default)]
    pub refinement_steps: u64,
    /// Whether the factors were whitened by activation statistics.
    pub whitened: bool,
    /// Digest of the dataset the calibration text came from (for the Paul Graham essays, the
    /// set digest of `starling-hub`); absent for weight-only SVD and in older manifests.
    #[serde(default)]
    pub dataset_sha256: Option<String>,
    /// Calibration windows run through the model (each from position 0, its own cache).
    #[serde(default)]
    pub windows: u64,
    /// Tokens per calibration window (`tokens = windows · window_tokens`).
    #[serde(default)]
    pub window_tokens: u64,
}

/// Learned thresholds of one compressed layer, in units of each factor's top singular value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerThresholds {
    /// Decoder layer.
    pub layer: usize,
    /// One per KV head.
    pub keys: Vec<f64>,
    /// The value factor's.
    pub value: f64,
}

/// Learned thresholds, kept so distillation can resume from them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThresholdRecord {
    /// The tanh sharpness they were trained with.
    pub sharpness: f64,
    /// Per compressed layer.
    pub layers: Vec<LayerThresholds>,
}

/// How the projections were refined by knowledge distillation (the step count is
/// [`CalibrationInfo::refinement_steps`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RefinementRecord {
    /// Adam's step size, relative to each matrix's RMS entry.
    pub learning_rate: f64,
    /// Tokens per refinement window.
    pub window_tokens: u64,
    /// Windows the calibration text was cut into (step `i` used window `i mod windows`).
    pub windows: u64,
    /// Mean KL(original ‖ compressed) per position, nats, at the first step (the unrefined
    /// projections, on window 0).
    pub first_step_kl: f64,
    /// The same at the last step (before its update).
    pub last_step_kl: f64,
}

/// One point of a training curve: the mean KL(original ‖ compressed) per position over a run
/// of consecutive optimisation steps, and the tokens trained on by the end of that run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// `thresholds` (rank distillation) or `refine` (projection refinement).
    pub phase: String,
    /// Tokens of this phase trained on by the last step of the run.
    pub tokens_seen: u64,
    /// Mean KL of the run's steps, nats per position.
    pub kl: f64,
}

/// At most this many points per phase: longer runs are averaged in equal runs of steps.
pub const CURVE_POINTS: usize = 64;

/// The curve of a phase whose steps had `kls`, each step `tokens_per_step` tokens.
pub fn loss_curve(phase: &str, kls: &[f64], tokens_per_step: u64) -> Vec<CurvePoint> {
    let per_point = kls.len().div_ceil(CURVE_POINTS).max(1);
    kls.chunks(per_point)
        .enumerate()
        .map(|(i, run)| CurvePoint {
            phase: phase.to_owned(),
            tokens_seen: ((i * per_point + run.len()) as u64) * tokens_per_step,
            kl: run.iter().sum::<f64>() / run.len() as f64,
        })
        .collect()
}

/// Everything `manifest.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`METHOD`].
    pub method: String,
    /// [`FORMAT_VERSION`] at writing time.
    pub format_version: u32,
    /// The named profile, if the target was one.
    pub profile: Option<RankProfile>,
    /// The share of K/V cache elements per token the target removes, per-mille.
    pub removed_permille: u32,
    /// The allocation strategy (`uniform`, `greedy_energy`, `learned_thresholds`…).
    pub rank_strategy: String,
    /// The model these projections belong to.
    pub model: ModelIdentity,
    /// Element type of `projections.safetensors`.
    pub projection_dtype: ProjectionDtype,
    /// Layers kept at full K/V, ascending.
    pub uncompressed_layers: Vec<usize>,
    /// Ranks of the compressed layers, ascending by layer.
    pub layers: Vec<LayerManifest>,
    /// KV bytes per token vs the original, and the parameter compression rate.
    pub compression: CompressionReport,
    /// Calibration data and steps.
    pub calibration: CalibrationInfo,
    /// Learned thresholds, when ranks were learned.
    pub thresholds: Option<ThresholdRecord>,
    /// How the projections were refined, when they were (absent in older manifests).
    #[serde(default)]
    pub refinement: Option<RefinementRecord>,
    /// The training curves of distillation and refinement, in order (empty when neither ran,
    /// and in older manifests).
    #[serde(default)]
    pub loss_curve: Vec<CurvePoint>,
    /// The seed of every random choice made while calibrating.
    pub seed: u64,
}

impl Manifest {
    /// The rank allocation the manifest records (no tensors read): enough to size a cache.
    pub fn allocation(&self) -> Result<RankAllocation, StarKvError> {
        let shape = self.model.shape;
        let mut layers: Vec<Option<LayerRanks>> = vec![None; shape.num_layers];
        for entry in &self.layers {
            let slot = layers.get_mut(entry.layer).ok_or_else(|| {
                StarKvError::InvalidArgument(format!(
                    "manifest lists layer {} of a {}-layer model",
                    entry.layer, shape.num_layers
                ))
            })?;
            *slot = Some(entry.ranks());
        }
        RankAllocation::new(shape, layers)
    }
}
