//! Compression targets (named profiles) and the exact per-token cache-element budget they imply.
//!
//! A token stores `2 · kv_heads · head_dim` K/V elements in an uncompressed layer and
//! `Σ_h r_h + r_v` in a compressed one. A target removes a share of the whole model's K/V
//! elements per token; uncompressed layers count at full size, so the compressed layers make
//! up the difference. Shares are in per-mille so the arithmetic stays in integers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{KvShape, StarKvError, UncompressedLayers};

/// A named compression target, selectable at serve time.
///
/// The shares were set by measurement (BENCHMARKS.md, "STAR-KV quality"): on Qwen2.5-Coder-1.5B
/// a whitened-SVD cut stays within 3% perplexity only up to about 15–20% of the K/V bytes (10%:
/// +1.4%, 20%: +3.8%, 50%: +18–22% with NIAH falling), so `balanced` — the default, meant to keep
/// answers — removes 15%, `conservative` 8%, and `aggressive` 30% for workloads that trade some
/// quality for capacity. Larger cuts remain available to experiments through [`BudgetTarget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankProfile {
    /// 30% of K/V cache bytes per token removed.
    Aggressive,
    /// 15% removed.
    Balanced,
    /// 8% removed.
    Conservative,
}

impl RankProfile {
    /// Every profile, most compressed first.
    pub const ALL: [RankProfile; 3] = [Self::Aggressive, Self::Balanced, Self::Conservative];

    /// The name used in manifests and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aggressive => "aggressive",
            Self::Balanced => "balanced",
            Self::Conservative => "conservative",
        }
    }

    /// The share of K/V cache elements per token this profile removes, in per-mille.
    pub fn removed_permille(self) -> u32 {
        match self {
            Self::Aggressive => 300,
            Self::Balanced => 150,
            Self::Conservative => 80,
        }
    }

    /// This profile's budget target.
    pub fn target(self) -> BudgetTarget {
        BudgetTarget {
            removed_permille: self.removed_permille(),
        }
    }
}

impl fmt::Display for RankProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RankProfile {
    type Err = StarKvError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                StarKvError::InvalidArgument(format!(
                    "unknown rank profile `{name}` (known: aggressive, balanced, conservative)"
                ))
            })
    }
}

/// A share of the model's K/V cache elements per token to remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BudgetTarget {
    removed_permille: u32,
}

impl BudgetTarget {
    /// Removes `removed_permille / 1000` of the elements; must be in `1..=999`.
    pub fn removed_permille(removed_permille: u32) -> Result<Self, StarKvError> {
        if !(1..=999).contains(&removed_permille) {
            return Err(StarKvError::InvalidArgument(format!(
                "removed share {removed_permille}‰ must be between 1‰ and 999‰"
            )));
        }
        Ok(Self { removed_permille })
    }

    /// The removed share in per-mille.
    pub fn permille(self) -> u32 {
        self.removed_permille
    }
}

/// The exact number of cache elements per token the compressed layers must hold in total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheBudget {
    /// Elements per token of the uncompressed model, all layers.
    pub full_elements_per_token: u64,
    /// Elements per token the whole compressed model keeps:
    /// `⌊full · (1000 − removed‰) / 1000⌋` (rounded down, so at least the target share is
    /// removed).
    pub target_elements_per_token: u64,
    /// Elements per token of the uncompressed layers (at full size).
    pub uncompressed_elements_per_token: u64,
    /// What the compressed layers' ranks must sum to: target minus uncompressed.
    pub compressed_elements_per_token: u64,
    /// The target it was computed from.
    pub target: BudgetTarget,
}

impl CacheBudget {
    /// The budget `target` implies for `shape` with `uncompressed` layers kept whole. Fails when
    /// no ranks in `[1, max]` per factor can sum to it.
    pub fn new(
        shape: &KvShape,
        target: BudgetTarget,
        uncompressed: &UncompressedLayers,
    ) -> Result<Self, StarKvError> {
        let layer_full = shape.full_layer_elements();
        let full = layer_full * shape.num_layers as u64;
        let kept = full * u64::from(1000 - target.permille()) / 1000;
        let whole = layer_full * uncompressed.len() as u64;
        let compressed_layers = (shape.num_layers - uncompressed.len()) as u64;
        let heads = shape.num_kv_heads as u64;
        let min = compressed_layers * (heads + 1);
        let max = compressed_layers
            * (heads * shape.max_key_rank() as u64 + shape.max_value_rank() as u64);
        let compressed = kept.checked_sub(whole).ok_or_else(|| {
            StarKvError::BudgetInfeasible(format!(
                "removing {}‰ keeps {kept} elements per token, but the {} uncompressed layers \
                 alone hold {whole}",
                target.permille(),
                uncompressed.len()
            ))
        })?;
        if compressed < min || compressed > max {
            return Err(StarKvError::BudgetInfeasible(format!(
                "the {compressed_layers} compressed layers must hold {compressed} elements per \
                 token, outside [{min}, {max}] (rank 1 to full rank per factor)"
            )));
        }
        Ok(Self {
            full_elements_per_token: full,
            target_elements_per_token: kept,
            uncompressed_elements_per_token: whole,
            compressed_elements_per_token: compressed,
            target,
        })
    }
}

#[cfg(test)]
mod tests {
    use starling_models::ModelConfig;

    use super::*;

    #[test]
    fn profiles_parse_and_map_to_shares() {
        assert_eq!(
            "Balanced".parse::<RankProfile>().unwrap(),
            RankProfile::Balanced
        );
        assert!("tiny".parse::<RankProfile>().is_err());
        let shares: Vec<u32> = RankProfile::ALL.map(|p| p.removed_permille()).to_vec();
        assert_eq!(shares, vec![300, 150, 80]);
        assert!(BudgetTarget::removed_permille(0).is_err());
        assert!(BudgetTarget::removed_permille(1000).is_err());
    }

    #[test]
    fn smollm2_budgets_round_down_and_count_uncompressed_layers_whole() {
        // 30 layers × 2 · 3 · 64 = 11 520 elements per token.
        let shape = KvShape::of(&ModelConfig::smollm2_135m());
        let keep = UncompressedLayers::reference(30);
        let budget = CacheBudget::new(&shape, RankProfile::Balanced.target(), &keep).unwrap();
        assert_eq!(budget.full_elements_per_token, 11_520);
        // 85% of 11 520 kept.
        assert_eq!(budget.target_elements_per_token, 9792);
        assert_eq!(budget.uncompressed_elements_per_token, 3 * 384);
        assert_eq!(budget.compressed_elements_per_token, 9792 - 1152);

        // 1‰ of 11 520 is 11.52: the kept count rounds down to 11 508.
        let fine = BudgetTarget::removed_permille(1).unwrap();
        let none = UncompressedLayers::none();
        assert_eq!(
            CacheBudget::new(&shape, fine, &none)
                .unwrap()
                .target_elements_per_token,
            11_508
        );
    }

    #[test]
    fn impossible_budgets_are_refused() {
        let shape = KvShape::of(&ModelConfig::tiny_llama_for_tests());
        // Two layers, both uncompressed: nothing can be removed.
        let all = UncompressedLayers::reference(2);
        let err = CacheBudget::new(&shape, RankProfile::Conservative.target(), &all);
        assert!(matches!(err, Err(StarKvError::BudgetInfeasible(_))));
        // 999‰ leaves fewer elements than rank 1 per factor needs.
        let extreme = BudgetTarget::removed_permille(999).unwrap();
        let none = UncompressedLayers::none();
        assert!(CacheBudget::new(&shape, extreme, &none).is_err());
    }
}
