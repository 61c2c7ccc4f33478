//! Refinement on tiny random models: a zero step size changes nothing, a few steps lower the
//! KL at the same ranks, and the refined checkpoint loads through the reference path.

use candle_core::{Device, Tensor};
use starling_models::ModelConfig;

use super::*;
use crate::checkpoint::{read_manifest, weights_identity, StarKvCheckpoint, MANIFEST_FILE};
use crate::distill::loss::{log_softmax, mean_kl};
use crate::distill::tests::{configs, ids, reference_logits, weights};
use crate::{
    load_and_apply, svd_checkpoint, AppliedSides, CalibrationPlan, ModelFactors, RankProfile,
    RankStrategy, UncompressedLayers,
};

/// A model, its greedy conservative checkpoint (layer 0 kept whole, so the student runs on the
/// teacher's shared prefix) and a distiller over two 24-token windows.
struct Setup {
    config: ModelConfig,
    weights: starling_models::WeightMap,
    text: Vec<u32>,
    checkpoint: StarKvCheckpoint,
    distiller: Distiller,
}

fn setup(config_index: usize, seed: u64) -> Setup {
    let config = configs()[config_index].clone();
    let weights = weights(&config, seed, 5.0);
    let keep = UncompressedLayers::from_list(&[0], config.num_layers).unwrap();
    let factors = ModelFactors::compute(&config, &weights, &keep, None).unwrap();
    let plan =
        CalibrationPlan::for_profile(RankProfile::Conservative, RankStrategy::GreedyEnergy, 0);
    let checkpoint = svd_checkpoint(&config, &weights_identity(&weights), &factors, &plan).unwrap();
    let text = ids(&config, 48, seed + 1);
    let distiller = Distiller::new(&config, &weights, &factors, &text, 24).unwrap();
    Setup {
        config,
        weights,
        text,
        checkpoint,
        distiller,
    }
}

fn refine(s: &mut Setup, steps: usize, learning_rate: f64) -> (ModelProjections, RefineReport) {
    let config = RefineConfig {
        steps,
        learning_rate,
    };
    let mut seen = Vec::new();
    let out = refine_with(
        &mut s.distiller,
        &s.checkpoint.projections,
        &config,
        &mut |step| seen.push(step.step),
    )
    .unwrap();
    assert_eq!(
        seen,
        (0..steps).collect::<Vec<_>>(),
        "every step reported once"
    );
    out
}

#[test]
fn a_zero_step_size_or_no_steps_leave_the_svd_factors_unchanged() {
    let mut s = setup(0, 60);
    let (refined, report) = refine(&mut s, 3, 0.0);
    assert_eq!(refined, s.checkpoint.projections);
    assert_eq!(report.steps.len(), 3);
    assert_eq!(
        report.steps.iter().map(|r| r.window).collect::<Vec<_>>(),
        [0, 1, 0]
    );
    // The truncation costs something, and with nothing moving window 0 scores the same twice.
    assert!(report.steps[0].kl > 1e-4, "{:?}", report.steps[0]);
    assert_eq!(report.steps[0].kl, report.steps[2].kl);
    assert_eq!(report.tokens_seen, 72);

    let (refined, report) = refine(&mut s, 0, RefineConfig::DEFAULT_LEARNING_RATE);
    assert_eq!(refined, s.checkpoint.projections);
    assert!(report.steps.is_empty());
    // Nothing refined is nothing to record.
    assert!(refined_checkpoint(s.checkpoint.clone(), refined, &report).is_err());
    let bad = RefineConfig {
        steps: 1,
        learning_rate: -1.0,
    };
    let projections = s.checkpoint.projections.clone();
    assert!(refine_with(&mut s.distiller, &projections, &bad, &mut |_| {}).is_err());
}

#[test]
fn refinement_lowers_the_kl_at_the_same_ranks() {
    let mut s = setup(0, 70);
    let before = s
        .distiller
        .projections_kl(&s.checkpoint.projections, 0..2)
        .unwrap();
    let (refined, report) = refine(&mut s, 8, RefineConfig::DEFAULT_LEARNING_RATE);
    let after = s.distiller.projections_kl(&refined, 0..2).unwrap();
    assert!(after < 0.9 * before, "KL {before} → {after}");
    assert_eq!(
        refined.allocation().unwrap(),
        s.checkpoint.projections.allocation().unwrap()
    );
    assert_ne!(refined, s.checkpoint.projections);
    // Step 0 scored the unrefined projections on window 0.
    let unrefined_first = s
        .distiller
        .projections_kl(&s.checkpoint.projections, 0..1)
        .unwrap();
    assert!((report.steps[0].kl - unrefined_first).abs() < 1e-5 * unrefined_first.max(1.0));
    // Deterministic: the same run again gives the same matrices.
    let (again, _) = refine(&mut s, 8, RefineConfig::DEFAULT_LEARNING_RATE);
    assert_eq!(again, refined);
}

#[test]
fn refined_checkpoints_round_trip_and_run_on_the_reference_path() {
    // Qwen2-style: K/V biases stay the model's own through refinement and the reference path.
    let mut s = setup(1, 80);
    let (refined, report) = refine(&mut s, 4, RefineConfig::DEFAULT_LEARNING_RATE);
    let refined_kl = s.distiller.projections_kl(&refined, 0..1).unwrap();
    let unrefined = s.checkpoint.clone();
    let checkpoint = refined_checkpoint(unrefined.clone(), refined.clone(), &report).unwrap();
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();

    let mut applied = s.weights.clone();
    let loaded = load_and_apply(
        dir.path(),
        RankProfile::Conservative,
        AppliedSides::Both,
        &s.config,
        &mut applied,
    )
    .unwrap();
    assert_eq!(loaded, checkpoint);
    assert_eq!(loaded.projections, refined);
    let manifest = &loaded.manifest;
    let original = &unrefined.manifest;
    assert_eq!(manifest.layers, original.layers);
    assert_eq!(manifest.compression, original.compression);
    assert_eq!(manifest.rank_strategy, original.rank_strategy);
    assert_eq!(manifest.calibration.refinement_steps, 4);
    assert_eq!(manifest.calibration.steps, original.calibration.steps + 4);
    assert_eq!(manifest.calibration.tokens, 96);
    let record = manifest.refinement.as_ref().unwrap();
    assert_eq!(record.last_step_kl, report.steps[3].kl);
    assert_eq!((record.windows, record.window_tokens), (2, 24));

    // The engine's CPU backend on the applied weights is the refined student.
    let window = &s.text[..24];
    let got = reference_logits(&s.config, &applied, window);
    let vocab = s.config.vocab_size;
    let student = Tensor::from_vec(got, (24, vocab), &Device::Cpu).unwrap();
    let teacher = reference_logits(&s.config, &s.weights, window);
    let teacher = Tensor::from_vec(teacher, (24, vocab), &Device::Cpu).unwrap();
    let kl = mean_kl(
        &log_softmax(&teacher).unwrap(),
        &log_softmax(&student).unwrap(),
    )
    .unwrap()
    .to_scalar::<f32>()
    .unwrap();
    let diff = (f64::from(kl) - refined_kl).abs();
    assert!(diff < 1e-4 * refined_kl.max(1.0), "{kl} vs {refined_kl}");

    // A manifest from before refinement existed loads as unrefined.
    let path = dir.path().join(MANIFEST_FILE);
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(json.as_object_mut().unwrap().remove("refinement").is_some());
    let calibration = json["calibration"].as_object_mut().unwrap();
    assert!(calibration.remove("refinement_steps").is_some());
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let old = read_manifest(dir.path()).unwrap();
    assert_eq!(old.refinement, None);
    assert_eq!(old.calibration.refinement_steps, 0);
}
