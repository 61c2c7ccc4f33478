//! The teacher, the student's factors and the calibration windows, prepared once: teacher
//! outputs are computed once per window (outside any graph) and cached; the student shares the
//! teacher's uncompressed prefix, so its forward starts at the first compressed layer.

use std::ops::Range;

use candle_core::Tensor;
use starling_models::{ModelConfig, WeightMap};

use super::frozen::{FrozenModel, KvWeights};
use super::loss::{log_softmax, mean_kl};
use super::rope::RopeTables;
use super::student::{StudentFactors, Values};
use super::DistillError;
use crate::{
    KvShape, LayerProjections, Matrix, ModelFactors, ModelProjections, RankAllocation,
    UncompressedLayers,
};

/// What the teacher gives one window: the residual stream entering the first compressed
/// layer (shared with the student) and its final normed hidden states, `[T, hidden]` each.
/// Hidden states rather than log probabilities: `T × hidden` instead of `T × vocab` floats
/// per window, for one extra head product per use.
struct TeacherWindow {
    prefix: Tensor,
    hidden: Tensor,
}

/// Distillation's fixed inputs: frozen model, factor tensors, windows and the teacher cache.
pub struct Distiller {
    model: FrozenModel,
    student: StudentFactors,
    rope: RopeTables,
    windows: Vec<Vec<u32>>,
    teacher: Vec<Option<TeacherWindow>>,
    shape: KvShape,
    uncompressed: UncompressedLayers,
}

impl Distiller {
    /// Prepares distillation of `factors` (computed from `weights`) on `text_ids`, cut into
    /// consecutive windows of `window_tokens` (a shorter tail is dropped). Fails when the
    /// text holds no full window or the factors belong to another shape.
    pub fn new(
        config: &ModelConfig,
        weights: &WeightMap,
        factors: &ModelFactors,
        text_ids: &[u32],
        window_tokens: usize,
    ) -> Result<Self, DistillError> {
        if window_tokens < 2 || text_ids.len() < window_tokens {
            return Err(DistillError::InvalidArgument(format!(
                "{} calibration tokens hold no window of {window_tokens} (at least 2) tokens",
                text_ids.len()
            )));
        }
        if factors.shape() != KvShape::of(config) {
            return Err(DistillError::InvalidArgument(format!(
                "factors of {:?} for a model of {:?}",
                factors.shape(),
                KvShape::of(config)
            )));
        }
        let windows: Vec<Vec<u32>> = text_ids
            .chunks_exact(window_tokens)
            .map(<[u32]>::to_vec)
            .collect();
        Ok(Self {
            model: FrozenModel::new(config, weights)?,
            student: StudentFactors::new(factors)?,
            rope: RopeTables::new(config, window_tokens)?,
            teacher: (0..windows.len()).map(|_| None).collect(),
            windows,
            shape: factors.shape(),
            uncompressed: factors.uncompressed().clone(),
        })
    }

    /// How many windows the text was cut into.
    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Tokens per window.
    pub fn window_tokens(&self) -> usize {
        self.windows.first().map_or(0, Vec::len)
    }

    /// Mean KL(teacher ‖ student) per position over `windows` (clipped to the text's) when
    /// the student keeps exactly `allocation`'s ranks (plain truncation, no thresholds): the
    /// quality of a final allocation, comparable across strategies at equal KV bytes.
    /// Windows past those trained on are held-out text.
    pub fn allocation_kl(
        &mut self,
        allocation: &RankAllocation,
        windows: Range<usize>,
    ) -> Result<f64, DistillError> {
        self.check_layers(allocation)?;
        let ranks: Vec<usize> = allocation
            .layers()
            .iter()
            .flatten()
            .flat_map(|r| r.key_ranks.iter().copied().chain([r.value_rank]))
            .collect();
        self.mean_window_kl(windows, |d, window| {
            d.window_kl(window, &Values::Hard(&ranks))
        })
    }

    /// Mean KL(teacher ‖ student) per position over `windows` (clipped to the text's) when
    /// the student's compressed layers use `projections` as they are (refined or not): what a
    /// checkpoint holding them would give on this text.
    pub fn projections_kl(
        &mut self,
        projections: &ModelProjections,
        windows: Range<usize>,
    ) -> Result<f64, DistillError> {
        self.check_layers(&projections.allocation()?)?;
        let overrides = projections
            .layers()
            .iter()
            .map(|p| p.as_ref().map(projection_weights).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        self.mean_window_kl(windows, |d, window| d.window_kl_with(window, &overrides))
    }

    /// The mean of `kl_of(window)` over `windows` (clipped to the text's; empty is an error).
    fn mean_window_kl(
        &mut self,
        windows: Range<usize>,
        mut kl_of: impl FnMut(&mut Self, usize) -> Result<Tensor, DistillError>,
    ) -> Result<f64, DistillError> {
        let windows = windows.start..windows.end.min(self.windows.len());
        if windows.is_empty() {
            return Err(DistillError::InvalidArgument(format!(
                "no window in {windows:?} of {}",
                self.windows.len()
            )));
        }
        let mut total = 0.0;
        for window in windows.clone() {
            total += f64::from(kl_of(self, window)?.to_scalar::<f32>()?);
        }
        Ok(total / windows.len() as f64)
    }

    /// Fails unless `allocation` compresses exactly the layers this distiller's factors do
    /// (the teacher's shared prefix ends at the first of them).
    pub(crate) fn check_layers(&self, allocation: &RankAllocation) -> Result<(), DistillError> {
        if *allocation.shape() != self.shape
            || allocation.uncompressed() != self.uncompressed.to_vec()
        {
            return Err(DistillError::InvalidArgument(
                "the allocation is for another shape or other uncompressed layers".to_owned(),
            ));
        }
        Ok(())
    }

    /// The student's factors.
    pub(crate) fn student(&self) -> &StudentFactors {
        &self.student
    }

    /// Mean KL of the student with `values` on `window`, a graph node when `values` is
    /// tracked.
    pub(crate) fn window_kl(
        &mut self,
        window: usize,
        values: &Values,
    ) -> Result<Tensor, DistillError> {
        let overrides = self.student.kv_weights(values)?;
        self.window_kl_with(window, &overrides)
    }

    /// Mean KL of the student whose compressed layer `l` uses the K/V weights `overrides[l]`
    /// on `window`, a graph node when the weights are tracked. `overrides` must cover the
    /// layers the factors compress (checked by the caller, [`Self::check_layers`]).
    pub(crate) fn window_kl_with(
        &mut self,
        window: usize,
        overrides: &[Option<KvWeights>],
    ) -> Result<Tensor, DistillError> {
        let teacher = self.teacher_log_probs(window)?;
        let student = log_softmax(&self.student_logits_with(window, overrides)?)?;
        mean_kl(&teacher, &student)
    }

    /// The student's log probabilities `[T, vocab]` on `window`.
    #[cfg(test)]
    pub(crate) fn student_log_probs(
        &mut self,
        window: usize,
        values: &Values,
    ) -> Result<Tensor, DistillError> {
        log_softmax(&self.student_logits(window, values)?)
    }

    /// The student's logits `[T, vocab]` on `window`.
    #[cfg(test)]
    pub(crate) fn student_logits(
        &mut self,
        window: usize,
        values: &Values,
    ) -> Result<Tensor, DistillError> {
        let overrides = self.student.kv_weights(values)?;
        self.student_logits_with(window, &overrides)
    }

    /// The logits `[T, vocab]` on `window` of the student with K/V weights `overrides`.
    fn student_logits_with(
        &mut self,
        window: usize,
        overrides: &[Option<KvWeights>],
    ) -> Result<Tensor, DistillError> {
        let prefix = self.teacher_window(window)?.prefix.clone();
        let hidden =
            self.model
                .run_layers(self.student.first_layer(), &prefix, overrides, &self.rope)?;
        self.model.logits(&hidden)
    }

    /// The teacher's log probabilities `[T, vocab]` on `window`, from the cached hidden
    /// states.
    pub(crate) fn teacher_log_probs(&mut self, window: usize) -> Result<Tensor, DistillError> {
        let hidden = self.teacher_window(window)?.hidden.clone();
        log_softmax(&self.model.logits(&hidden)?)
    }

    fn teacher_window(&mut self, window: usize) -> Result<&TeacherWindow, DistillError> {
        let ids = self.windows.get(window).ok_or_else(|| {
            DistillError::InvalidArgument(format!("window {window} of {}", self.windows.len()))
        })?;
        let cached = match self.teacher[window].take() {
            Some(cached) => cached,
            None => {
                let first = self.student.first_layer();
                let prefix = self.model.prefix(ids, first, &self.rope)?;
                let hidden = self.model.run_layers(first, &prefix, &[], &self.rope)?;
                TeacherWindow { prefix, hidden }
            }
        };
        Ok(self.teacher[window].insert(cached))
    }
}

/// The K/V weights `[B_0 A_0; …]` and `B_v A_v` of one layer's projections, as constants.
fn projection_weights(p: &LayerProjections) -> Result<KvWeights, DistillError> {
    let tensor = |m: Matrix| -> Result<Tensor, DistillError> {
        let (rows, cols) = (m.rows(), m.cols());
        Ok(Tensor::from_vec(
            m.into_data(),
            (rows, cols),
            &candle_core::Device::Cpu,
        )?)
    };
    Ok(KvWeights {
        key: tensor(p.reconstructed_key_weight()?)?,
        value: tensor(p.reconstructed_value_weight()?)?,
    })
}
