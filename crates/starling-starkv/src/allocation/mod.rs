//! Ranks per key head and per value layer that meet a cache budget exactly.
//!
//! Strategies: [`RankStrategy::Uniform`] keeps the same share of every factor's maximum rank;
//! [`RankStrategy::GreedyEnergy`] keeps the globally most valuable components (singular-value
//! energy in per-row units, see [`ModelSpectra::energy_weight`]); and
//! [`RankStrategy::LearnedThresholds`] learns a soft threshold per factor (see
//! [`crate::threshold`]). All end with the exact-budget step (see `exact.rs` for the rounding
//! rule), so the total always equals [`CacheBudget::compressed_elements_per_token`].

use serde::{Deserialize, Serialize};
use starling_kv::{CacheDtype, CacheLayout, LayerLayout};

use crate::spectra::canonical_ids;
use crate::threshold::{learn_thresholds, LearnedThresholds, ReconstructionObjective};
use crate::{
    CacheBudget, FactorKind, KvShape, ModelSpectra, StarKvError, ThresholdConfig,
    UncompressedLayers,
};

use crate::exact_budget::{meet_budget, uniform_ranks};

/// The ranks of one compressed layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRanks {
    /// Rank of each KV head's key factor.
    pub key_ranks: Vec<usize>,
    /// Rank of the layer's joint value factor.
    pub value_rank: usize,
}

/// Ranks for every layer of a model (`None`: kept uncompressed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankAllocation {
    shape: KvShape,
    layers: Vec<Option<LayerRanks>>,
}

impl RankAllocation {
    /// Checks `layers` against `shape`: one entry per layer, one key rank per KV head, every
    /// rank in `[1, max]`.
    pub fn new(shape: KvShape, layers: Vec<Option<LayerRanks>>) -> Result<Self, StarKvError> {
        if layers.len() != shape.num_layers {
            return Err(StarKvError::SizeMismatch {
                what: "layers of the rank allocation".to_owned(),
                expected: shape.num_layers,
                found: layers.len(),
            });
        }
        for (layer, ranks) in layers.iter().enumerate() {
            let Some(ranks) = ranks else { continue };
            if ranks.key_ranks.len() != shape.num_kv_heads {
                return Err(StarKvError::SizeMismatch {
                    what: format!("key ranks of layer {layer}"),
                    expected: shape.num_kv_heads,
                    found: ranks.key_ranks.len(),
                });
            }
            let keys_ok = ranks
                .key_ranks
                .iter()
                .all(|r| (1..=shape.max_key_rank()).contains(r));
            if !keys_ok || !(1..=shape.max_value_rank()).contains(&ranks.value_rank) {
                return Err(StarKvError::InvalidArgument(format!(
                    "layer {layer}: ranks {ranks:?} outside [1, {}] (keys) / [1, {}] (value)",
                    shape.max_key_rank(),
                    shape.max_value_rank()
                )));
            }
        }
        Ok(Self { shape, layers })
    }

    /// Builds the allocation from one rank per factor in canonical order.
    pub(crate) fn from_canonical(
        shape: KvShape,
        uncompressed: &UncompressedLayers,
        ranks: &[usize],
    ) -> Result<Self, StarKvError> {
        let ids = canonical_ids(&shape, uncompressed);
        if ids.len() != ranks.len() {
            return Err(StarKvError::SizeMismatch {
                what: "ranks".to_owned(),
                expected: ids.len(),
                found: ranks.len(),
            });
        }
        let mut layers: Vec<Option<LayerRanks>> = vec![None; shape.num_layers];
        for (id, &rank) in ids.iter().zip(ranks) {
            let entry = layers[id.layer].get_or_insert_with(|| LayerRanks {
                key_ranks: Vec::with_capacity(shape.num_kv_heads),
                value_rank: 0,
            });
            match id.kind {
                FactorKind::Key { .. } => entry.key_ranks.push(rank),
                FactorKind::Value => entry.value_rank = rank,
            }
        }
        Self::new(shape, layers)
    }

    /// The model shape.
    pub fn shape(&self) -> &KvShape {
        &self.shape
    }

    /// Per layer: its ranks, or `None` when uncompressed.
    pub fn layers(&self) -> &[Option<LayerRanks>] {
        &self.layers
    }

    /// The ranks of `layer`, `None` when it is uncompressed (or does not exist).
    pub fn layer(&self, layer: usize) -> Option<&LayerRanks> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// The uncompressed layers.
    pub fn uncompressed(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l].is_none())
            .collect()
    }

    /// Cache elements one token stores across all layers (uncompressed layers at full size).
    pub fn elements_per_token(&self) -> u64 {
        self.layers
            .iter()
            .map(|ranks| match ranks {
                None => self.shape.full_layer_elements(),
                Some(r) => r.key_ranks.iter().sum::<usize>() as u64 + r.value_rank as u64,
            })
            .sum()
    }

    /// The paged-cache layout of this allocation with `dtype` elements, for sizing: what the
    /// engine allocates for a model loaded with these ranks (each rank stored in multiples of
    /// [`starling_kv::LATENT_RANK_MULTIPLE`], plus each token's position).
    pub fn cache_layout(&self, dtype: CacheDtype) -> CacheLayout {
        let layers = self
            .layers
            .iter()
            .map(|ranks| match ranks {
                None => LayerLayout::Full {
                    num_kv_heads: self.shape.num_kv_heads,
                    head_dim: self.shape.head_dim,
                    dtype,
                },
                Some(r) => LayerLayout::low_rank_padded(&r.key_ranks, r.value_rank, dtype),
            })
            .collect();
        CacheLayout { layers }
    }
}

/// How ranks are chosen before the exact-budget step.
#[derive(Clone, Debug, PartialEq)]
pub enum RankStrategy {
    /// The same share of each factor's maximum rank.
    Uniform,
    /// The globally most valuable components by per-row-normalised energy. For the weight
    /// reconstruction error this is optimal (the loss is separable and each factor's values
    /// are non-increasing).
    GreedyEnergy,
    /// Soft thresholds learned against the weight-reconstruction objective; the effective
    /// ranks `#{σ̂ > α}` then go through the exact-budget step with the greedy energy values.
    LearnedThresholds(ThresholdConfig),
}

impl RankStrategy {
    /// The name recorded in manifests.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::GreedyEnergy => "greedy_energy",
            Self::LearnedThresholds(_) => "learned_thresholds",
        }
    }
}

/// An allocation and, for learned strategies, the thresholds behind it.
#[derive(Clone, Debug)]
pub struct AllocationOutcome {
    /// The ranks.
    pub allocation: RankAllocation,
    /// The learned thresholds (learned strategies only).
    pub thresholds: Option<LearnedThresholds>,
}

/// Chooses ranks for every factor of `spectra` with `strategy`, meeting `budget` exactly.
pub fn allocate_ranks(
    spectra: &ModelSpectra,
    budget: &CacheBudget,
    strategy: &RankStrategy,
) -> Result<AllocationOutcome, StarKvError> {
    let target = budget.compressed_elements_per_token;
    let max_ranks: Vec<usize> = (0..spectra.factors().len())
        .map(|i| spectra.max_rank(i))
        .collect();
    let energy = |f: usize, c: usize| spectra.component_value(f, c);
    let (ranks, thresholds) = match strategy {
        RankStrategy::Uniform => (uniform_ranks(&max_ranks, target)?, None),
        RankStrategy::GreedyEnergy => {
            let mut ranks = vec![1; max_ranks.len()];
            meet_budget(&mut ranks, &max_ranks, target, &energy)?;
            (ranks, None)
        }
        RankStrategy::LearnedThresholds(config) => {
            let mut objective = ReconstructionObjective::new(spectra);
            let learned = learn_thresholds(spectra, target, &mut objective, config)?;
            let mut ranks = learned.effective_ranks.clone();
            meet_budget(&mut ranks, &max_ranks, target, &energy)?;
            (ranks, Some(learned))
        }
    };
    let allocation =
        RankAllocation::from_canonical(*spectra.shape(), spectra.uncompressed(), &ranks)?;
    Ok(AllocationOutcome {
        allocation,
        thresholds,
    })
}

/// The uniform allocation of `budget` over `shape` with `uncompressed` layers kept whole, from
/// the shapes alone (no weights, no spectra): what a profile gives a model whose weights are
/// not at hand (`starling info` on a synthetic preset). Equals
/// [`allocate_ranks`] with [`RankStrategy::Uniform`], which ignores singular values too.
pub fn uniform_allocation(
    shape: &KvShape,
    budget: &CacheBudget,
    uncompressed: &UncompressedLayers,
) -> Result<RankAllocation, StarKvError> {
    let max_ranks: Vec<usize> = canonical_ids(shape, uncompressed)
        .iter()
        .map(|id| match id.kind {
            FactorKind::Key { .. } => shape.max_key_rank(),
            FactorKind::Value => shape.max_value_rank(),
        })
        .collect();
    let ranks = uniform_ranks(&max_ranks, budget.compressed_elements_per_token)?;
    RankAllocation::from_canonical(*shape, uncompressed, &ranks)
}

#[cfg(test)]
mod tests;
