use starling_models::{synthetic_weights, Architecture, ModelConfig, WeightMap};

use super::*;
use crate::{svd_checkpoint, CalibrationPlan, ModelFactors, RankStrategy, ThresholdConfig};

/// A 6-layer Qwen2-style model (K/V biases) small enough to factor in milliseconds.
fn small_model(seed: u64) -> (ModelConfig, WeightMap) {
    let mut config = ModelConfig::tiny_llama_for_tests();
    config.architecture = Architecture::Qwen2;
    config.attention_bias = true;
    config.num_layers = 6;
    let weights = synthetic_weights(&config, seed);
    (config, weights)
}

/// A conservative checkpoint with layer 0 kept whole (the reference's three whole layers
/// would exceed a 6-layer model's budget on their own).
fn build(
    config: &ModelConfig,
    weights: &WeightMap,
    strategy: RankStrategy,
    dtype: ProjectionDtype,
) -> StarKvCheckpoint {
    let keep = UncompressedLayers::from_list(&[0], config.num_layers).unwrap();
    let factors = ModelFactors::compute(config, weights, &keep, None).unwrap();
    let mut plan = CalibrationPlan::for_profile(RankProfile::Conservative, strategy, 42);
    plan.projection_dtype = dtype;
    svd_checkpoint(config, &weights_identity(weights), &factors, &plan).unwrap()
}

fn learned() -> RankStrategy {
    RankStrategy::LearnedThresholds(ThresholdConfig::default())
}

fn read_all(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    (read(PROJECTIONS_FILE), read(MANIFEST_FILE))
}

#[test]
fn f32_checkpoints_round_trip_exactly_and_record_their_figures() {
    let (config, weights) = small_model(1);
    let checkpoint = build(&config, &weights, learned(), ProjectionDtype::F32);
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    let identity = weights_identity(&weights);
    let loaded = StarKvCheckpoint::load(dir.path(), &config, &identity).unwrap();
    assert_eq!(loaded, checkpoint);
    assert!(!dir.path().join("manifest.json.partial").exists());

    let manifest = &loaded.manifest;
    assert_eq!(manifest.method, "star_kv");
    assert_eq!(manifest.format_version, FORMAT_VERSION);
    assert_eq!(manifest.profile, Some(RankProfile::Conservative));
    assert_eq!(manifest.removed_permille, 80);
    assert_eq!(manifest.rank_strategy, "learned_thresholds");
    assert_eq!(manifest.seed, 42);
    assert_eq!(manifest.uncompressed_layers, vec![0]);
    assert_eq!(manifest.layers.len(), 5);
    assert!(manifest.model.attention_bias);
    assert_eq!(manifest.model.weights_sha256, identity);
    // 6 layers × 2 · 32 = 384 elements per token; conservative keeps ⌊0.92 · 384⌋ = 353,
    // bf16 → 706 bytes.
    let figures = &manifest.compression;
    assert_eq!(figures.kv_elements_per_token_original, 384);
    assert_eq!(figures.kv_elements_per_token_compressed, 353);
    assert_eq!(figures.kv_bytes_per_token_original, 768);
    assert_eq!(figures.kv_bytes_per_token_compressed, 706);
    let thresholds = manifest.thresholds.as_ref().unwrap();
    assert_eq!(thresholds.layers.len(), 5);
    assert_eq!(thresholds.layers[0].layer, 1);
    assert_eq!(thresholds.layers[0].keys.len(), 2);
    assert!(manifest.calibration.steps > 0 && !manifest.calibration.whitened);
}

#[test]
fn bf16_checkpoints_round_trip_to_bf16_precision() {
    let (config, weights) = small_model(2);
    let checkpoint = build(
        &config,
        &weights,
        RankStrategy::GreedyEnergy,
        ProjectionDtype::Bf16,
    );
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    let identity = weights_identity(&weights);
    let loaded = StarKvCheckpoint::load(dir.path(), &config, &identity).unwrap();
    assert_eq!(loaded.manifest, checkpoint.manifest);
    for (a, b) in loaded
        .projections
        .layers()
        .iter()
        .zip(checkpoint.projections.layers())
    {
        let (Some(a), Some(b)) = (a, b) else {
            assert_eq!(a.is_none(), b.is_none());
            continue;
        };
        for (x, y) in a.value_down.data().iter().zip(b.value_down.data()) {
            // bf16 keeps 8 significant bits: relative rounding error at most 2⁻⁸.
            assert!((x - y).abs() <= y.abs() / 256.0, "{x} vs {y}");
        }
    }
    // Once rounded, saving again is lossless.
    let again = tempfile::tempdir().unwrap();
    loaded.save(again.path()).unwrap();
    assert_eq!(read_all(dir.path()), read_all(again.path()));
}

#[test]
fn checkpoints_are_deterministic_for_a_seed() {
    let (config, weights) = small_model(3);
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    build(&config, &weights, learned(), ProjectionDtype::F32)
        .save(first.path())
        .unwrap();
    build(&config, &weights, learned(), ProjectionDtype::F32)
        .save(second.path())
        .unwrap();
    assert_eq!(read_all(first.path()), read_all(second.path()));
}

#[test]
fn a_checkpoint_for_another_model_is_refused() {
    let (config, weights) = small_model(4);
    let checkpoint = build(
        &config,
        &weights,
        RankStrategy::Uniform,
        ProjectionDtype::F32,
    );
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    let identity = weights_identity(&weights);

    let (_, other_weights) = small_model(5);
    let err =
        StarKvCheckpoint::load(dir.path(), &config, &weights_identity(&other_weights)).unwrap_err();
    assert!(
        matches!(&err, StarKvError::ModelMismatch { reason, .. } if reason.starts_with("weights")),
        "{err}"
    );

    let mut wider = config.clone();
    wider.num_kv_heads = 4;
    wider.num_attention_heads = 8;
    let err = StarKvCheckpoint::load(dir.path(), &wider, &identity).unwrap_err();
    assert!(
        matches!(&err, StarKvError::ModelMismatch { reason, .. } if reason.starts_with("shape")),
        "{err}"
    );

    let mut llama = config.clone();
    llama.architecture = Architecture::Llama;
    let err = StarKvCheckpoint::load(dir.path(), &llama, &identity).unwrap_err();
    assert!(err.to_string().contains("architecture"), "{err}");
}

#[test]
fn damaged_checkpoints_are_errors_not_panics() {
    let (config, weights) = small_model(6);
    let checkpoint = build(
        &config,
        &weights,
        RankStrategy::GreedyEnergy,
        ProjectionDtype::F32,
    );
    let identity = weights_identity(&weights);
    // Saves the checkpoint, then overwrites its manifest with an edited copy.
    let corrupt = |edit: &dyn Fn(&mut Manifest)| {
        let dir = tempfile::tempdir().unwrap();
        checkpoint.save(dir.path()).unwrap();
        let mut manifest = checkpoint.manifest.clone();
        edit(&mut manifest);
        let json = serde_json::to_vec(&manifest).unwrap();
        std::fs::write(dir.path().join(MANIFEST_FILE), json).unwrap();
        match StarKvCheckpoint::load(dir.path(), &config, &identity) {
            Ok(_) => panic!("a damaged checkpoint loaded"),
            Err(err) => err,
        }
    };

    let err = corrupt(&|m| m.method = "svd".to_owned());
    assert!(err.to_string().contains("method"), "{err}");
    let err = corrupt(&|m| m.format_version = 99);
    assert!(err.to_string().contains("format version"), "{err}");
    // A rank the tensors do not have.
    let err = corrupt(&|m| m.layers[0].key_ranks[0] += 1);
    assert!(
        matches!(err, StarKvError::CorruptCheckpoint { .. }),
        "{err}"
    );
    // Figures that disagree with the ranks.
    let err = corrupt(&|m| m.compression.kv_bytes_per_token_compressed += 2);
    assert!(err.to_string().contains("disagree"), "{err}");
    // A layer missing from the manifest leaves tensors unaccounted for.
    let err = corrupt(&|m| {
        m.layers.pop();
    });
    assert!(err.to_string().contains("tensors"), "{err}");
    // Projections stored as f32 but announced as bf16.
    let err = corrupt(&|m| m.projection_dtype = ProjectionDtype::Bf16);
    assert!(err.to_string().contains("manifest says"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    std::fs::write(dir.path().join(PROJECTIONS_FILE), b"not safetensors").unwrap();
    let err = StarKvCheckpoint::load(dir.path(), &config, &identity).unwrap_err();
    assert!(
        matches!(err, StarKvError::CorruptCheckpoint { .. }),
        "{err}"
    );
    std::fs::write(dir.path().join(MANIFEST_FILE), b"{").unwrap();
    assert!(read_manifest(dir.path()).is_err());
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        StarKvCheckpoint::load(empty.path(), &config, &identity),
        Err(StarKvError::Io { .. })
    ));
}

#[test]
fn whitened_calibration_fields_round_trip_and_older_manifests_still_load() {
    let (config, weights) = small_model(7);
    // Statistics of fixed anisotropic rows (channel j scaled by j % 5 + 1), one per layer.
    let rows: Vec<f32> = (0..96 * 64)
        .map(|i| ((i * 7919 % 101) as f32 / 101.0 - 0.5) * ((i % 64) % 5 + 1) as f32)
        .collect();
    let rows = crate::Matrix::new(96, 64, rows).unwrap();
    let whiteners: Vec<crate::Whitener> = (0..config.num_layers)
        .map(|_| {
            let mut moment = crate::SecondMoment::new(64);
            moment.add_rows(&rows).unwrap();
            crate::Whitener::new(&moment, crate::DEFAULT_RELATIVE_FLOOR).unwrap()
        })
        .collect();
    let keep = UncompressedLayers::from_list(&[0], config.num_layers).unwrap();
    let factors = ModelFactors::compute(&config, &weights, &keep, Some(&whiteners)).unwrap();
    let mut plan = CalibrationPlan::for_profile(RankProfile::Balanced, learned(), 5);
    plan.calibration = CalibrationInfo {
        data: vec!["addiction.txt".to_owned(), "aord.txt".to_owned()],
        tokens: 96,
        dataset_sha256: Some("ab".repeat(32)),
        windows: 2,
        window_tokens: 48,
        ..CalibrationInfo::default()
    };
    let identity = weights_identity(&weights);
    let checkpoint = svd_checkpoint(&config, &identity, &factors, &plan).unwrap();
    let dir = tempfile::tempdir().unwrap();
    checkpoint.save(dir.path()).unwrap();
    let loaded = StarKvCheckpoint::load(dir.path(), &config, &identity).unwrap();
    assert_eq!(loaded.manifest, checkpoint.manifest);
    assert_eq!(loaded.projections, checkpoint.projections);
    let calibration = &loaded.manifest.calibration;
    // `whitened` comes from the factors, not from the plan.
    assert!(calibration.whitened);
    assert_eq!(calibration.data, ["addiction.txt", "aord.txt"]);
    assert_eq!((calibration.tokens, calibration.windows), (96, 2));
    assert_eq!(calibration.window_tokens, 48);
    assert_eq!(
        calibration.dataset_sha256.as_deref(),
        Some(&*"ab".repeat(32))
    );
    assert!(calibration.steps > 0, "learned thresholds count as steps");
    assert_eq!(calibration.distillation_steps, 0);

    // A manifest written before these fields existed reads them as absent / zero.
    let path = dir.path().join(MANIFEST_FILE);
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let object = json["calibration"].as_object_mut().unwrap();
    for key in ["dataset_sha256", "windows", "window_tokens"] {
        assert!(object.remove(key).is_some(), "{key} was not written");
    }
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let old = read_manifest(dir.path()).unwrap().calibration;
    assert_eq!(old.dataset_sha256, None);
    assert_eq!((old.windows, old.window_tokens, old.tokens), (0, 0, 96));
}
