use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_models::ModelConfig;

use super::*;
use crate::threshold::ThresholdInit;
use crate::{CompressionReport, FactorSpectrum, RankProfile};

/// Random non-increasing spectra for every factor of `shape`: each factor gets its own scale
/// and decay rate (some nearly flat, some steep), like real K/V projections.
fn random_spectra(shape: KvShape, uncompressed: &UncompressedLayers, seed: u64) -> ModelSpectra {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let factors = canonical_ids(&shape, uncompressed)
        .into_iter()
        .map(|id| {
            let n = crate::spectra::max_rank(&shape, id.kind);
            let scale: f64 = rng.gen_range(0.1..10.0);
            let decay: f64 = rng.gen_range(0.001..0.2);
            let mut values: Vec<f64> = (0..n)
                .map(|i| scale * (-decay * i as f64).exp() * rng.gen_range(0.8..1.0))
                .collect();
            values.sort_by(|a, b| b.total_cmp(a));
            FactorSpectrum {
                id,
                singular_values: values,
            }
        })
        .collect();
    ModelSpectra::new(shape, uncompressed.clone(), factors).unwrap()
}

fn strategies() -> [RankStrategy; 3] {
    [
        RankStrategy::Uniform,
        RankStrategy::GreedyEnergy,
        RankStrategy::LearnedThresholds(ThresholdConfig::default()),
    ]
}

/// `Σ_f w_f · tail energy`: the weighted weight-reconstruction error of an allocation.
fn reconstruction_loss(spectra: &ModelSpectra, allocation: &RankAllocation) -> f64 {
    let ids = canonical_ids(spectra.shape(), spectra.uncompressed());
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let Some(ranks) = allocation.layer(id.layer) else {
                unreachable!("canonical ids name compressed layers only")
            };
            let rank = match id.kind {
                FactorKind::Key { head } => ranks.key_ranks[head],
                FactorKind::Value => ranks.value_rank,
            };
            (rank..spectra.max_rank(i))
                .map(|c| spectra.component_value(i, c))
                .sum::<f64>()
        })
        .sum()
}

#[test]
fn every_profile_and_strategy_meets_the_budget_exactly_on_random_spectra() {
    let shapes = [
        ModelConfig::smollm2_135m(),
        ModelConfig::qwen2_5_coder_1_5b(),
        ModelConfig::qwen2_5_coder_0_5b(),
    ];
    for (seed, config) in shapes.iter().enumerate() {
        let shape = KvShape::of(config);
        let keep = UncompressedLayers::reference(shape.num_layers);
        let spectra = random_spectra(shape, &keep, seed as u64);
        for profile in RankProfile::ALL {
            let budget = CacheBudget::new(&shape, profile.target(), &keep).unwrap();
            for strategy in strategies() {
                let outcome = allocate_ranks(&spectra, &budget, &strategy).unwrap();
                let allocation = &outcome.allocation;
                let label = format!("{:?} {profile} {}", config.architecture, strategy.name());
                assert_eq!(
                    allocation.elements_per_token(),
                    budget.target_elements_per_token,
                    "{label}"
                );
                assert_eq!(allocation.uncompressed(), keep.to_vec(), "{label}");
                let report = CompressionReport::of(allocation, CacheDtype::BF16);
                let share = f64::from(profile.removed_permille()) / 1000.0;
                let one_element = 1.0 / budget.full_elements_per_token as f64;
                assert!(
                    report.kv_removed_share >= share
                        && report.kv_removed_share < share + one_element,
                    "{label}: removed {}",
                    report.kv_removed_share
                );
                assert_eq!(
                    outcome.thresholds.is_some(),
                    matches!(strategy, RankStrategy::LearnedThresholds(_))
                );
            }
        }
    }
}

#[test]
fn uniform_ranks_keep_the_same_share_of_every_factor() {
    let shape = KvShape::of(&ModelConfig::smollm2_135m());
    let keep = UncompressedLayers::reference(shape.num_layers);
    let spectra = random_spectra(shape, &keep, 7);
    let budget = CacheBudget::new(&shape, RankProfile::Balanced.target(), &keep).unwrap();
    let outcome = allocate_ranks(&spectra, &budget, &RankStrategy::Uniform).unwrap();
    let (max_k, max_v) = (shape.max_key_rank() as f64, shape.max_value_rank() as f64);
    let shares: Vec<f64> = outcome
        .allocation
        .layers()
        .iter()
        .flatten()
        .flat_map(|r| {
            let keys = r.key_ranks.iter().map(move |&k| k as f64 / max_k);
            keys.chain(std::iter::once(r.value_rank as f64 / max_v))
        })
        .collect();
    let lo = shares.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = shares.iter().copied().fold(0.0, f64::max);
    // Shares differ by at most one component of the smallest factor.
    assert!(hi - lo <= 1.0 / max_k + 1e-12, "shares {lo}..{hi}");
}

#[test]
fn greedy_is_optimal_and_learned_thresholds_beat_uniform_at_equal_budget() {
    let shape = KvShape::of(&ModelConfig::smollm2_135m());
    let keep = UncompressedLayers::reference(shape.num_layers);
    for seed in [11, 12] {
        let spectra = random_spectra(shape, &keep, seed);
        for profile in [RankProfile::Aggressive, RankProfile::Conservative] {
            let budget = CacheBudget::new(&shape, profile.target(), &keep).unwrap();
            let losses: Vec<f64> = strategies()
                .iter()
                .map(|s| {
                    let outcome = allocate_ranks(&spectra, &budget, s).unwrap();
                    reconstruction_loss(&spectra, &outcome.allocation)
                })
                .collect();
            let [uniform, greedy, from_greedy] = losses[..] else {
                unreachable!("three strategies")
            };
            let from_uniform = {
                let config = ThresholdConfig {
                    init: ThresholdInit::Uniform,
                    ..ThresholdConfig::default()
                };
                let strategy = RankStrategy::LearnedThresholds(config);
                let outcome = allocate_ranks(&spectra, &budget, &strategy).unwrap();
                reconstruction_loss(&spectra, &outcome.allocation)
            };
            let label = format!("{seed} {profile}: {losses:?} {from_uniform}");
            // Greedy maximises the kept value of a separable concave objective: nothing
            // beats it. Learning from uniform must find most of greedy's gain by itself; from
            // greedy it drifts to the soft relaxation's own equilibrium, which is not the hard
            // optimum. Measured on these spectra: 80–100% of greedy's gain either way.
            assert!(
                greedy <= from_uniform.min(from_greedy) * (1.0 + 1e-12),
                "{label}"
            );
            assert!(
                from_uniform - greedy <= 0.35 * (uniform - greedy),
                "{label}"
            );
            assert!(from_greedy - greedy <= 0.35 * (uniform - greedy), "{label}");
        }
    }
}

#[test]
fn allocation_is_deterministic() {
    let shape = KvShape::of(&ModelConfig::qwen2_5_coder_1_5b());
    let keep = UncompressedLayers::reference(shape.num_layers);
    let spectra = random_spectra(shape, &keep, 3);
    let budget = CacheBudget::new(&shape, RankProfile::Balanced.target(), &keep).unwrap();
    let strategy = RankStrategy::LearnedThresholds(ThresholdConfig::default());
    let a = allocate_ranks(&spectra, &budget, &strategy).unwrap();
    let b = allocate_ranks(&spectra, &budget, &strategy).unwrap();
    assert_eq!(a.allocation, b.allocation);
    assert_eq!(a.thresholds, b.thresholds);
}

#[test]
fn allocations_are_validated_against_the_shape() {
    let shape = KvShape {
        hidden_size: 8,
        num_layers: 2,
        num_kv_heads: 2,
        head_dim: 4,
    };
    let ranks = |keys: Vec<usize>, value| {
        Some(LayerRanks {
            key_ranks: keys,
            value_rank: value,
        })
    };
    assert!(RankAllocation::new(shape, vec![None, ranks(vec![1, 4], 8)]).is_ok());
    assert!(RankAllocation::new(shape, vec![None]).is_err());
    assert!(RankAllocation::new(shape, vec![None, ranks(vec![1], 8)]).is_err());
    assert!(RankAllocation::new(shape, vec![None, ranks(vec![0, 4], 8)]).is_err());
    assert!(RankAllocation::new(shape, vec![None, ranks(vec![1, 5], 8)]).is_err());
    assert!(RankAllocation::new(shape, vec![None, ranks(vec![1, 4], 9)]).is_err());
}
