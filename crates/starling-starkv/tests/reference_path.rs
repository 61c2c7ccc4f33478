//! The reference execution path end to end on the CPU backend: a checkpoint applied to a
//! random-weight model changes its logits exactly as the ranks say (not at all at full rank),
//! and checkpoints for other weights or profiles are refused.

use starling_backend::cpu::CpuBackend;
use starling_kv::CacheDtype;
use starling_models::llama::LlamaModel;
use starling_models::{synthetic_weights, Architecture, ModelConfig, WeightMap};
use starling_starkv::checkpoint::{
    weights_identity, CalibrationInfo, CheckpointSettings, ProjectionDtype, StarKvCheckpoint,
};
use starling_starkv::{
    apply_projection_sides, apply_projections, load_and_apply, svd_checkpoint, AppliedSides,
    CalibrationPlan, LayerRanks, ModelFactors, ModelProjections, ProfileRef, RankAllocation,
    RankProfile, RankStrategy, StarKvError, UncompressedLayers,
};

/// A 4-layer Qwen2-style model (K/V biases, so the "biases unchanged" rule is exercised).
fn model(seed: u64) -> (ModelConfig, WeightMap) {
    let mut config = ModelConfig::tiny_llama_for_tests();
    config.architecture = Architecture::Qwen2;
    config.attention_bias = true;
    config.num_layers = 4;
    let weights = synthetic_weights(&config, seed);
    (config, weights)
}

fn keep_first() -> UncompressedLayers {
    UncompressedLayers::from_list(&[0], 4).unwrap()
}

fn logits(config: &ModelConfig, weights: WeightMap) -> Vec<Vec<f32>> {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights).unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 128).collect();
    model.sequence_logits(&backend, &ids).unwrap()
}

/// Mean over positions of KL(p ‖ q) between the softmaxes of two logit rows.
fn mean_kl(p: &[Vec<f32>], q: &[Vec<f32>]) -> f64 {
    let log_softmax = |row: &[f32]| {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        row.iter()
            .map(|&x| x as f64 - max - sum.ln())
            .collect::<Vec<_>>()
    };
    let total: f64 = p
        .iter()
        .zip(q)
        .map(|(a, b)| {
            let (la, lb) = (log_softmax(a), log_softmax(b));
            la.iter()
                .zip(&lb)
                .map(|(x, y)| x.exp() * (x - y))
                .sum::<f64>()
        })
        .sum();
    total / p.len() as f64
}

#[test]
fn a_full_rank_checkpoint_reproduces_the_logits() {
    let (config, weights) = model(5);
    let factors = ModelFactors::compute(&config, &weights, &keep_first(), None).unwrap();
    let shape = factors.shape();
    let full = LayerRanks {
        key_ranks: vec![shape.max_key_rank(); shape.num_kv_heads],
        value_rank: shape.max_value_rank(),
    };
    let ranks = (0..4).map(|l| (l > 0).then(|| full.clone())).collect();
    let allocation = RankAllocation::new(shape, ranks).unwrap();
    let projections = ModelProjections::from_factors(&factors, &allocation).unwrap();
    let settings = CheckpointSettings {
        profile: None,
        target: starling_starkv::BudgetTarget::removed_permille(1).unwrap(),
        rank_strategy: "full".to_owned(),
        projection_dtype: ProjectionDtype::F32,
        cache_dtype: CacheDtype::BF16,
        calibration: CalibrationInfo::default(),
        thresholds: None,
        seed: 0,
    };
    let identity = weights_identity(&weights);
    let checkpoint =
        StarKvCheckpoint::new(&config, identity.clone(), projections, settings).unwrap();
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    let loaded = StarKvCheckpoint::load(dir.path(), &config, &identity).unwrap();

    let mut applied = weights.clone();
    let layers = apply_projections(&config, &mut applied, &loaded.projections).unwrap();
    assert_eq!(layers, 3);
    let k1 = "model.layers.1.self_attn.k_proj.weight";
    assert_ne!(
        applied.get(k1).unwrap().data(),
        weights.get(k1).unwrap().data(),
        "reconstruction rounds differently from the original"
    );

    let want = logits(&config, weights);
    let got = logits(&config, applied);
    let scale = want
        .iter()
        .flatten()
        .fold(0f32, |m, &x| m.max(x.abs()))
        .max(1e-6);
    let worst = want
        .iter()
        .flatten()
        .zip(got.iter().flatten())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-4 * scale,
        "max |Δlogit| {worst} vs scale {scale}"
    );
}

fn write_profile(
    dir: &std::path::Path,
    config: &ModelConfig,
    weights: &WeightMap,
    profile: RankProfile,
) {
    let factors = ModelFactors::compute(config, weights, &keep_first(), None).unwrap();
    let plan = CalibrationPlan::for_profile(profile, RankStrategy::GreedyEnergy, 3);
    svd_checkpoint(config, &weights_identity(weights), &factors, &plan)
        .unwrap()
        .save(dir.join(profile.name()))
        .unwrap();
}

#[test]
fn a_balanced_checkpoint_changes_the_logits_but_not_catastrophically() {
    let (config, weights) = model(6);
    let dir = tempfile::tempdir().unwrap();
    write_profile(dir.path(), &config, &weights, RankProfile::Balanced);
    let mut applied = weights.clone();
    let checkpoint = load_and_apply(
        dir.path(),
        RankProfile::Balanced,
        AppliedSides::Both,
        &config,
        &mut applied,
    )
    .unwrap();
    assert_eq!(checkpoint.manifest.profile, Some(RankProfile::Balanced));
    let bias = "model.layers.2.self_attn.k_proj.bias";
    assert_eq!(
        applied.get(bias).unwrap().data(),
        weights.get(bias).unwrap().data()
    );
    let layer0 = "model.layers.0.self_attn.v_proj.weight";
    assert_eq!(
        applied.get(layer0).unwrap().data(),
        weights.get(layer0).unwrap().data()
    );

    let want = logits(&config, weights);
    let got = logits(&config, applied);
    assert!(got.iter().flatten().all(|x| x.is_finite()));
    let kl = mean_kl(&want, &got);
    assert!(kl > 1e-6 && kl < 1.0, "mean KL {kl}");
}

#[test]
fn one_side_alone_replaces_only_its_projection() {
    let (config, weights) = model(9);
    let factors = ModelFactors::compute(&config, &weights, &keep_first(), None).unwrap();
    let plan = CalibrationPlan::for_profile(RankProfile::Balanced, RankStrategy::GreedyEnergy, 3);
    let checkpoint = svd_checkpoint(&config, &weights_identity(&weights), &factors, &plan).unwrap();
    let (k2, v2) = (
        "model.layers.2.self_attn.k_proj.weight",
        "model.layers.2.self_attn.v_proj.weight",
    );
    let mut both = weights.clone();
    apply_projections(&config, &mut both, &checkpoint.projections).unwrap();
    for (sides, changed, kept) in [
        (AppliedSides::KeysOnly, k2, v2),
        (AppliedSides::ValuesOnly, v2, k2),
    ] {
        let mut applied = weights.clone();
        let layers =
            apply_projection_sides(&config, &mut applied, &checkpoint.projections, sides).unwrap();
        assert_eq!(layers, 3, "{sides:?}");
        assert_eq!(
            applied.get(changed).unwrap().data(),
            both.get(changed).unwrap().data(),
            "{sides:?}: the applied side is the full method's"
        );
        assert_ne!(
            applied.get(changed).unwrap().data(),
            weights.get(changed).unwrap().data()
        );
        assert_eq!(
            applied.get(kept).unwrap().data(),
            weights.get(kept).unwrap().data(),
            "{sides:?}: the other side stays whole"
        );
    }
}

#[test]
fn checkpoints_for_other_weights_or_profiles_are_refused_and_change_nothing() {
    let (config, weights) = model(7);
    let dir = tempfile::tempdir().unwrap();
    write_profile(dir.path(), &config, &weights, RankProfile::Balanced);

    let (_, mut other) = model(8);
    let before = other.clone();
    let err = load_and_apply(
        dir.path(),
        RankProfile::Balanced,
        AppliedSides::Both,
        &config,
        &mut other,
    );
    assert!(
        matches!(err, Err(StarKvError::ModelMismatch { .. })),
        "{err:?}"
    );
    assert_eq!(weights_identity(&other), weights_identity(&before));

    // A profile that was not calibrated: no such directory.
    let mut same = weights.clone();
    let err = load_and_apply(
        dir.path(),
        RankProfile::Conservative,
        AppliedSides::Both,
        &config,
        &mut same,
    )
    .unwrap_err();
    assert!(err.to_string().contains("conservative"), "{err}");

    // A single-profile directory given directly, asked for under another profile's name.
    let single = dir.path().join("balanced");
    let err = load_and_apply(
        &single,
        RankProfile::Aggressive,
        AppliedSides::Both,
        &config,
        &mut same,
    )
    .unwrap_err();
    assert!(err.to_string().contains("aggressive"), "{err}");
    assert_eq!(weights_identity(&same), weights_identity(&weights));
}

#[test]
fn a_share_without_a_name_loads_by_its_folder_name_and_only_as_that_share() {
    let (config, weights) = model(9);
    let dir = tempfile::tempdir().unwrap();
    let factors = ModelFactors::compute(&config, &weights, &keep_first(), None).unwrap();
    let half: ProfileRef = "50%".parse().unwrap();
    let mut plan =
        CalibrationPlan::for_profile(RankProfile::Balanced, RankStrategy::GreedyEnergy, 3);
    plan.profile = half.profile();
    plan.target = half.target();
    svd_checkpoint(&config, &weights_identity(&weights), &factors, &plan)
        .unwrap()
        .save(dir.path().join(half.dir_name()))
        .unwrap();

    let by_folder: ProfileRef = "removed-50pct".parse().unwrap();
    let mut applied = weights.clone();
    let checkpoint = load_and_apply(
        dir.path(),
        by_folder,
        AppliedSides::Both,
        &config,
        &mut applied,
    )
    .unwrap();
    assert_eq!(checkpoint.manifest.removed_permille, 500);
    assert_eq!(checkpoint.manifest.profile, None);
    assert_ne!(weights_identity(&applied), weights_identity(&weights));

    // The folder given directly but asked for as another share, or as a named profile.
    let single = dir.path().join("removed-50pct");
    let mut same = weights.clone();
    for asked in ["60%", "balanced"] {
        let asked: ProfileRef = asked.parse().unwrap();
        let err = load_and_apply(&single, asked, AppliedSides::Both, &config, &mut same);
        assert!(err.unwrap_err().to_string().contains("500‰ removed"));
    }
    assert_eq!(weights_identity(&same), weights_identity(&weights));
}
