//! The job directory and the results of an external trainer, on tiny random models (the
//! trainer itself, PyTorch, runs in `scripts/device/distill_torch.sh`).

use std::collections::HashMap;

use safetensors::SafeTensors;
use starling_models::LayerTensor;

use super::super::tests::{configs, ids, weights};
use super::super::{distill_with, distilled_checkpoint, DistillConfig, Distiller};
use super::job::JobSettings;
use super::*;
use crate::checkpoint::ProjectionDtype;
use crate::threshold::ThresholdInit;
use crate::{
    allocate_ranks, svd_checkpoint, CacheBudget, CalibrationPlan, LayerProjections, Matrix,
    ModelFactors, ModelProjections, ModelSpectra, RankProfile, RankStrategy, UncompressedLayers,
};

fn settings() -> JobSettings {
    JobSettings {
        window_tokens: 16,
        batch_windows: 2,
        shuffle: true,
        seed: 3,
        thresholds: JobThresholds {
            tokens: 1000,
            learning_rate: 0.05,
            sharpness: 50.0,
            dual_rate: 2.0,
            initial_multiplier: 0.0,
            budget: BudgetControl::Projected,
        },
        refine: JobRefine {
            tokens: 0,
            learning_rate: 2e-3,
        },
        init: ThresholdInit::GreedyEnergy,
    }
}

fn model() -> JobModel {
    JobModel {
        path: "tiny.gguf".to_owned(),
        weights_sha256: "test".to_owned(),
        key_rows_interleaved: false,
    }
}

fn profiles() -> Vec<(String, crate::BudgetTarget)> {
    [RankProfile::Aggressive, RankProfile::Conservative]
        .iter()
        .map(|p| (p.name().to_owned(), p.target()))
        .collect()
}

fn f32s(file: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
    let view = file.tensor(name).unwrap();
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (view.shape().to_vec(), data)
}

#[test]
fn the_job_holds_factors_that_rebuild_the_weights_and_resumes_only_when_unchanged() {
    let config = &configs()[1];
    let w = weights(config, 70, 5.0);
    let keep = UncompressedLayers::from_list(&[0], config.num_layers).unwrap();
    let factors = ModelFactors::compute(config, &w, &keep, None).unwrap();
    let text = ids(config, 100, 1);
    let (job, files) =
        ExternalJob::new(model(), &factors, &text, &profiles(), &settings()).unwrap();
    assert_eq!(job.compressed_layers, vec![1, 2]);
    assert_eq!(job.tokens, 100);
    let count = factors.factors().len();
    for p in &job.profiles {
        assert_eq!(p.initial_alphas.len(), count);
        let budget =
            CacheBudget::new(&factors.shape(), p.removed_permille_target(), &keep).unwrap();
        assert_eq!(p.target_elements, budget.compressed_elements_per_token);
    }

    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join("job");
    assert!(!job.write(&job_dir, &files).unwrap());
    let read: ExternalJob =
        serde_json::from_str(&std::fs::read_to_string(job_dir.join(JOB_FILE)).unwrap()).unwrap();
    assert_eq!(read, job);
    let tokens = std::fs::read(job_dir.join(TOKENS_FILE)).unwrap();
    assert_eq!(tokens.len(), 400);
    assert_eq!(
        u32::from_le_bytes([tokens[4], tokens[5], tokens[6], tokens[7]]),
        text[1]
    );

    // U diag(σ) R of every key head and of the value reproduces the layer's weights.
    let bytes = std::fs::read(job_dir.join(FACTORS_FILE)).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (hd, hidden) = (config.head_dim, config.hidden_size);
    for layer in [1usize, 2] {
        let wk = w.get(&LayerTensor::KProj.name(layer)).unwrap();
        for head in 0..config.num_kv_heads {
            let (us, u) = f32s(&file, &format!("layers.{layer}.k_u.{head}"));
            let (_, s) = f32s(&file, &format!("layers.{layer}.k_sigma.{head}"));
            let (rs, r) = f32s(&file, &format!("layers.{layer}.k_r.{head}"));
            let k = s.len();
            assert_eq!((us, rs), (vec![hd, k], vec![k, hidden]));
            for row in 0..hd {
                for col in (0..hidden).step_by(7) {
                    let got: f32 = (0..k)
                        .map(|c| u[row * k + c] * s[c] * r[c * hidden + col])
                        .sum();
                    let want = wk.data()[(head * hd + row) * hidden + col];
                    assert!(
                        (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                        "{got} vs {want}"
                    );
                }
            }
        }
        assert!(file.tensor(&format!("layers.{layer}.v_u")).is_ok());
    }
    assert!(
        file.tensor("layers.0.v_u").is_err(),
        "layer 0 is kept whole"
    );

    // The same job again keeps what the trainer saved; a changed one starts afresh.
    std::fs::create_dir_all(job_dir.join("aggressive")).unwrap();
    std::fs::write(job_dir.join("aggressive/thresholds.state.pt"), b"state").unwrap();
    assert!(job.write(&job_dir, &files).unwrap());
    assert!(job_dir.join("aggressive/thresholds.state.pt").exists());
    let mut other = settings();
    other.seed = 4;
    let (changed, files) = ExternalJob::new(model(), &factors, &text, &profiles(), &other).unwrap();
    assert!(!changed.write(&job_dir, &files).unwrap());
    assert!(!job_dir.join("aggressive").exists());
}

impl JobProfile {
    fn removed_permille_target(&self) -> crate::BudgetTarget {
        crate::BudgetTarget::removed_permille(self.removed_permille).unwrap()
    }
}

fn result_of(alphas: Vec<f64>, steps: Vec<super::super::DistillStep>) -> ThresholdsResult {
    ThresholdsResult {
        alphas,
        multiplier: 0.5,
        tokens_seen: 32 * steps.len() as u64,
        steps,
        windows: 6,
        window_tokens: 16,
        batch_windows: 2,
    }
}

#[test]
fn returned_thresholds_give_the_in_process_allocation_and_the_starting_ones_the_greedy_one() {
    let config = &configs()[0];
    let w = weights(config, 71, 5.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    let text = ids(config, 64, 2);
    let plan = CalibrationPlan::for_profile(RankProfile::Aggressive, RankStrategy::GreedyEnergy, 0);
    let (job, _) = ExternalJob::new(model(), &factors, &text, &profiles(), &settings()).unwrap();

    // Thresholds trained in this process, handed back as a trainer would: the same ranks.
    let distill = DistillConfig {
        steps: 6,
        window_tokens: 16,
        ..DistillConfig::default()
    };
    let mut distiller = Distiller::new(config, &w, &factors, &text, 16).unwrap();
    let (outcome, report) = distill_with(&mut distiller, &factors, &plan, &distill).unwrap();
    let trained = outcome.thresholds.clone().unwrap();
    let external = result_of(trained.alphas.clone(), report.steps.clone());
    let (got, got_report) = external.outcome(&job, "aggressive", &factors).unwrap();
    assert_eq!(got.allocation, outcome.allocation);
    assert_eq!(got_report.target_elements, report.target_elements);
    assert_eq!(got_report.tokens_seen, 6 * 32);

    // The starting thresholds are the greedy allocation.
    let start = job.profile("aggressive").unwrap().initial_alphas.clone();
    let (from_start, _) = result_of(start, report.steps.clone())
        .outcome(&job, "aggressive", &factors)
        .unwrap();
    let budget = CacheBudget::new(&factors.shape(), plan.target, factors.uncompressed()).unwrap();
    let spectra = ModelSpectra::of(&factors).unwrap();
    let greedy = allocate_ranks(&spectra, &budget, &RankStrategy::GreedyEnergy).unwrap();
    assert_eq!(from_start.allocation, greedy.allocation);

    // The checkpoint records the curve of the run.
    let checkpoint =
        distilled_checkpoint(config, "test", &factors, &plan, &got, &got_report).unwrap();
    let curve = &checkpoint.manifest.loss_curve;
    assert_eq!(curve.len(), 6);
    assert_eq!(curve[5].tokens_seen, 6 * 32);
    assert_eq!(curve[0].kl, report.steps[0].kl);

    // What a trainer must not return.
    let n = trained.alphas.len();
    let bad = [
        result_of(vec![0.5; n - 1], report.steps.clone()),
        result_of(vec![1.5; n], report.steps.clone()),
        result_of(vec![f64::NAN; n], report.steps.clone()),
        result_of(trained.alphas.clone(), vec![]),
    ];
    for result in bad {
        assert!(result.outcome(&job, "aggressive", &factors).is_err());
    }
    assert!(external.outcome(&job, "balanced", &factors).is_err());
}

#[test]
fn refined_projections_replace_the_checkpoints_and_must_match_its_ranks() {
    let config = &configs()[0];
    let w = weights(config, 72, 5.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    let plan = CalibrationPlan::for_profile(RankProfile::Aggressive, RankStrategy::GreedyEnergy, 0);
    let checkpoint = svd_checkpoint(config, "test", &factors, &plan).unwrap();
    let dir = tempfile::tempdir().unwrap();

    // The trainer's file: the checkpoint's own tensors, doubled.
    let double = |m: &Matrix| {
        Matrix::new(
            m.rows(),
            m.cols(),
            m.data().iter().map(|x| 2.0 * x).collect(),
        )
        .unwrap()
    };
    let layers = checkpoint
        .projections
        .layers()
        .iter()
        .map(|p| {
            p.as_ref().map(|p| LayerProjections {
                key_down: p.key_down.iter().map(double).collect(),
                key_up: p.key_up.iter().map(double).collect(),
                value_down: double(&p.value_down),
                value_up: double(&p.value_up),
            })
        })
        .collect();
    let doubled = ModelProjections::new(*checkpoint.projections.shape(), layers).unwrap();
    crate::checkpoint::write_projections(
        &dir.path().join(REFINED_PROJECTIONS),
        &doubled,
        ProjectionDtype::F32,
    )
    .unwrap();
    let steps = (0..3)
        .map(|step| super::super::RefineStep {
            step,
            window: step,
            kl: 1.0 / (step + 1) as f64,
            elapsed_ms: 1,
        })
        .collect();
    let result = RefineResult {
        steps,
        windows: 4,
        window_tokens: 16,
        batch_windows: 2,
        tokens_seen: 96,
        learning_rate: 2e-3,
    };
    let refined = result.apply(dir.path(), checkpoint.clone()).unwrap();
    assert_eq!(refined.projections, doubled);
    let record = refined.manifest.refinement.as_ref().unwrap();
    assert_eq!(
        (record.first_step_kl, record.last_step_kl),
        (1.0, 1.0 / 3.0)
    );
    assert_eq!(refined.manifest.calibration.refinement_steps, 3);
    assert_eq!(refined.manifest.loss_curve.len(), 3);
    assert_eq!(refined.manifest.loss_curve[2].tokens_seen, 96);

    // A file with a tensor missing (or of another shape) is refused.
    let bytes = std::fs::read(dir.path().join(REFINED_PROJECTIONS)).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let kept: HashMap<String, safetensors::tensor::TensorView<'_>> = file
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "layers.1.v_up")
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.path().join(REFINED_PROJECTIONS)).unwrap();
    assert!(result.apply(dir.path(), checkpoint).is_err());
}

#[test]
fn long_runs_are_averaged_into_a_bounded_curve() {
    let kls: Vec<f64> = (0..200).map(f64::from).collect();
    let curve = crate::checkpoint::loss_curve("thresholds", &kls, 10);
    assert!(curve.len() <= crate::checkpoint::CURVE_POINTS);
    assert_eq!(curve.len(), 50);
    assert_eq!(curve[0].kl, 1.5);
    assert_eq!(curve[0].tokens_seen, 40);
    assert_eq!(curve.last().unwrap().tokens_seen, 2000);
    assert!(crate::checkpoint::loss_curve("refine", &[], 10).is_empty());
}

#[test]
fn the_budget_control_is_named_as_the_trainer_reads_it_and_defaults_to_dual() {
    assert_eq!(
        serde_json::to_string(&BudgetControl::Projected).unwrap(),
        "\"projected\""
    );
    assert_eq!(
        serde_json::to_string(&BudgetControl::Dual).unwrap(),
        "\"dual\""
    );
    // A job written before the field existed reads as the dual ascent it ran.
    let old: JobThresholds = serde_json::from_str(
        r#"{"tokens":1,"learning_rate":0.05,"sharpness":50.0,"dual_rate":2.0,"initial_multiplier":0.0}"#,
    )
    .unwrap();
    assert_eq!(old.budget, BudgetControl::Dual);
}
