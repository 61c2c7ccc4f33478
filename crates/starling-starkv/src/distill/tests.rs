//! Parity with the engine's CPU backend, gradients, training and the exact budget, on tiny
//! random models.

use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_models::llama::LlamaModel;
use starling_models::{
    expected_weight_shapes, synthetic_weights, Architecture, LayerTensor, ModelConfig, RopeStyle,
    WeightMap,
};

use super::student::Values;
use super::*;
use crate::threshold::{soft_threshold, ThresholdInit};
use crate::{
    apply_projections, CacheBudget, ModelProjections, RankProfile, RankStrategy, UncompressedLayers,
};

/// Synthetic weights scaled by `gain` (norm scales stay 1): the library's std 0.02 gives
/// near-uniform next-token distributions, where every KL is tiny.
pub(crate) fn weights(config: &ModelConfig, seed: u64, gain: f32) -> WeightMap {
    let mut weights = synthetic_weights(config, seed);
    for (name, shape) in expected_weight_shapes(config) {
        if name.contains("norm") {
            continue;
        }
        let mut tensor = weights.take(&name, &shape).unwrap();
        tensor.data_mut().iter_mut().for_each(|x| *x *= gain);
        weights.insert(name, tensor);
    }
    weights
}

/// The three decoder variants the student must reproduce: Llama (NeoX, untied), Qwen2
/// (QKV bias, tied head) and a GGUF-style Llama (interleaved RoPE), 3 layers each.
pub(crate) fn configs() -> Vec<ModelConfig> {
    let mut llama = ModelConfig::tiny_llama_for_tests();
    llama.num_layers = 3;
    let mut qwen = llama.clone();
    qwen.architecture = Architecture::Qwen2;
    qwen.attention_bias = true;
    qwen.tie_word_embeddings = true;
    let mut interleaved = llama.clone();
    interleaved.rope.style = RopeStyle::Interleaved;
    vec![llama, qwen, interleaved]
}

pub(crate) fn ids(config: &ModelConfig, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.gen_range(0..config.vocab_size as u32))
        .collect()
}

pub(crate) fn reference_logits(config: &ModelConfig, weights: &WeightMap, ids: &[u32]) -> Vec<f32> {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights.clone()).unwrap();
    model.sequence_logits(&backend, ids).unwrap().concat()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn full_rank_student_matches_the_cpu_backend() {
    for (index, config) in configs().into_iter().enumerate() {
        let w = weights(&config, 10 + index as u64, 5.0);
        // Layer 0 stays whole, so the student also runs on the teacher's shared prefix.
        let keep = UncompressedLayers::from_list(&[0], 3).unwrap();
        let factors = ModelFactors::compute(&config, &w, &keep, None).unwrap();
        let text = ids(&config, 24, 1);
        let mut distiller = Distiller::new(&config, &w, &factors, &text, 12).unwrap();
        for window in 0..2 {
            let got = flat(&distiller.student_logits(window, &Values::Exact).unwrap());
            let want = reference_logits(&config, &w, &text[window * 12..(window + 1) * 12]);
            let spread = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                spread > 1.0,
                "config {index}: logits too flat to test ({spread})"
            );
            let diff = max_abs_diff(&got, &want);
            assert!(diff < 1e-4, "config {index} window {window}: {diff}");
            // The teacher (original weights) is the same model.
            let teacher = distiller.teacher_log_probs(window).unwrap();
            let student = distiller.student_log_probs(window, &Values::Exact).unwrap();
            let kl = loss::mean_kl(&teacher, &student).unwrap();
            assert!(
                kl.to_scalar::<f32>().unwrap().abs() < 1e-6,
                "config {index}"
            );
        }
    }
}

/// The soft-thresholded student equals the CPU backend running on weights whose K/V rows are
/// `U diag(σ_max f(σ̂; α)) R`, built on the host from the threshold module's own `f`.
#[test]
fn thresholded_student_matches_host_reconstructed_weights() {
    let config = &configs()[1];
    let w = weights(config, 20, 5.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    let text = ids(config, 16, 2);
    let mut distiller = Distiller::new(config, &w, &factors, &text, 16).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let alphas: Vec<f64> = factors
        .factors()
        .iter()
        .map(|_| rng.gen_range(0.05..0.6))
        .collect();
    let (s, tensor) = (50.0, Tensor::new(to_f32(&alphas), &Device::Cpu).unwrap());
    let values = Values::Soft {
        alphas: &tensor,
        sharpness: s,
    };
    let got = flat(&distiller.student_logits(0, &values).unwrap());

    let mut host = w.clone();
    for (layer, lf) in (0..config.num_layers).filter_map(|l| factors.layer(l).map(|f| (l, f))) {
        let base = layer * (config.num_kv_heads + 1);
        let thresholded = |f: &crate::Factorization, alpha: f64| {
            let top = f.singular_values()[0];
            let v: Vec<f64> = f
                .singular_values()
                .iter()
                .map(|&x| top * soft_threshold(x / top, alpha, s))
                .collect();
            f.up_projection(f.max_rank())
                .unwrap()
                .matmul(&f.down_projection_with(&v).unwrap())
                .unwrap()
        };
        let keys: Vec<f32> = lf
            .keys
            .iter()
            .enumerate()
            .flat_map(|(h, f)| thresholded(f, alphas[base + h]).into_data())
            .collect();
        let value = thresholded(&lf.value, alphas[base + config.num_kv_heads]);
        for (tensor, data) in [
            (LayerTensor::KProj, keys),
            (LayerTensor::VProj, value.into_data()),
        ] {
            let mut t = host
                .take(&tensor.name(layer), &tensor.shape(config))
                .unwrap();
            t.data_mut().copy_from_slice(&data);
            host.insert(tensor.name(layer), t);
        }
    }
    let want = reference_logits(config, &host, &text);
    let diff = max_abs_diff(&got, &want);
    assert!(diff < 1e-4, "{diff}");
    // And the thresholds changed the model: the comparison is not between two originals.
    let original = reference_logits(config, &w, &text);
    assert!(max_abs_diff(&original, &want) > 1e-2);
}

fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

#[test]
fn threshold_gradient_is_finite_non_zero_and_matches_finite_differences() {
    let config = &configs()[0];
    let w = weights(config, 30, 5.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    let text = ids(config, 16, 4);
    let mut distiller = Distiller::new(config, &w, &factors, &text, 16).unwrap();
    let spectra = crate::ModelSpectra::of(&factors).unwrap();
    let budget = CacheBudget::new(
        &factors.shape(),
        RankProfile::Balanced.target(),
        factors.uncompressed(),
    )
    .unwrap();
    let scaled = distiller.student().scaled().to_vec();
    // Greedy thresholds at the budget cut components off, but sit midway in spectral gaps
    // where the tanh knee is already flat: move each 40% of the way towards the first cut
    // value so every factor's threshold bites.
    let start = train::initial_alphas(
        &spectra,
        &scaled,
        budget.compressed_elements_per_token,
        ThresholdInit::GreedyEnergy,
    )
    .unwrap();
    let alphas: Vec<f64> = start
        .iter()
        .zip(&scaled)
        .map(|(&a, s)| {
            let below = s.iter().copied().find(|&x| x <= a).unwrap_or(0.0);
            a - 0.4 * (a - below)
        })
        .collect();
    let kl_at = |distiller: &mut Distiller, alphas: &[f64]| {
        let t = Tensor::new(to_f32(alphas), &Device::Cpu).unwrap();
        let values = Values::Soft {
            alphas: &t,
            sharpness: 50.0,
        };
        f64::from(
            distiller
                .window_kl(0, &values)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
        )
    };
    let var = Var::new(to_f32(&alphas), &Device::Cpu).unwrap();
    let values = Values::Soft {
        alphas: var.as_tensor(),
        sharpness: 50.0,
    };
    let kl = distiller.window_kl(0, &values).unwrap();
    assert!(
        kl.to_scalar::<f32>().unwrap() > 1e-4,
        "the thresholds cut nothing"
    );
    let grads = kl.backward().unwrap();
    let grad: Vec<f32> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
    assert!(grad.iter().all(|g| g.is_finite()));
    // KL is not monotone in each threshold (a truncation can cancel another's error), so
    // only "reaches every factor" is asserted, then the value against finite differences.
    assert!(grad.iter().all(|g| g.abs() > 1e-5), "{grad:?}");
    // Central differences in f32 forward passes: a loose check of value and sign.
    let h = 2e-3;
    for f in 0..grad.len() {
        let (mut up, mut down) = (alphas.clone(), alphas.clone());
        up[f] += h;
        down[f] -= h;
        let fd = (kl_at(&mut distiller, &up) - kl_at(&mut distiller, &down)) / (2.0 * h);
        let g = f64::from(grad[f]);
        assert!(
            (fd - g).abs() < 0.1 * g.abs() + 1e-4,
            "factor {f}: fd {fd} vs {g}"
        );
    }
}

#[test]
fn projection_meets_the_budget_exactly_from_either_side() {
    let config = &configs()[0];
    let shape = crate::KvShape::of(config);
    let none = UncompressedLayers::none();
    let scaled: Vec<Vec<f64>> = (0..9)
        .map(|f| {
            let n = if f % 3 == 2 { 32 } else { 16 };
            (0..n)
                .map(|i| (1.0 - i as f64 / n as f64).powi(f % 3 + 1))
                .collect()
        })
        .collect();
    for (alpha, target) in [(0.9, 60), (0.05, 60), (0.5, 100), (0.3, 9)] {
        let alphas = vec![alpha; 9];
        let (learned, allocation) =
            project::project_to_budget(shape, &none, &scaled, &alphas, target).unwrap();
        let learned_total: usize = learned.iter().sum();
        let compressed = allocation.elements_per_token();
        assert_eq!(compressed, target, "α {alpha} (learned {learned_total})");
    }
    // A factor whose threshold sits far below its values keeps more than one far above.
    let mut alphas = vec![0.5; 9];
    alphas[0] = 0.01;
    alphas[1] = 0.99;
    let (_, allocation) = project::project_to_budget(shape, &none, &scaled, &alphas, 60).unwrap();
    let first = allocation.layer(0).unwrap();
    assert!(first.key_ranks[0] > first.key_ranks[1], "{first:?}");
    assert!(project::project_to_budget(shape, &none, &scaled, &alphas[..8], 60).is_err());
}

#[test]
fn distillation_lowers_the_kl_and_meets_the_budget() {
    let config = &configs()[0];
    let w = weights(config, 40, 5.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    let text = ids(config, 32, 5);
    let plan = crate::CalibrationPlan::for_profile(
        RankProfile::Conservative,
        RankStrategy::GreedyEnergy,
        0,
    );
    let distill = DistillConfig {
        steps: 12,
        window_tokens: 32,
        ..DistillConfig::default()
    };
    let mut distiller = Distiller::new(config, &w, &factors, &text, 32).unwrap();
    let (outcome, report) = distill_with(&mut distiller, &factors, &plan, &distill).unwrap();
    assert_eq!(report.steps.len(), 12);
    let (first, last) = (&report.steps[0], &report.steps[11]);
    assert!(last.kl < 0.9 * first.kl, "KL {} → {}", first.kl, last.kl);
    let budget = CacheBudget::new(&factors.shape(), plan.target, factors.uncompressed()).unwrap();
    assert_eq!(
        outcome.allocation.elements_per_token(),
        budget.target_elements_per_token
    );
    // The soft rank stays near the budget (the price holds it), and the distilled ranks beat
    // the greedy-energy ranks the run started from, at equal KV bytes.
    let target = report.target_elements as f64;
    assert!((last.soft_rank - target).abs() < 0.05 * target, "{last:?}");
    let spectra = crate::ModelSpectra::of(&factors).unwrap();
    let greedy = crate::allocate_ranks(&spectra, &budget, &RankStrategy::GreedyEnergy).unwrap();
    let greedy_kl = distiller.allocation_kl(&greedy.allocation, 0..1).unwrap();
    let distilled_kl = distiller.allocation_kl(&outcome.allocation, 0..1).unwrap();
    assert!(
        distilled_kl < 0.8 * greedy_kl,
        "{distilled_kl} vs {greedy_kl}"
    );
    let thresholds = outcome.thresholds.as_ref().unwrap();
    assert!(thresholds.alphas.iter().all(|a| (0.0..1.0).contains(a)));

    // The checkpoint records the distillation; the same run twice gives the same ranks.
    let checkpoint =
        distilled_checkpoint(config, "test", &factors, &plan, &outcome, &report).unwrap();
    assert_eq!(checkpoint.manifest.calibration.distillation_steps, 12);
    let again = distill_ranks(config, &w, &factors, &plan, &text, &distill).unwrap();
    assert_eq!(again.0.allocation, outcome.allocation);
    let projections = ModelProjections::from_factors(&factors, &outcome.allocation).unwrap();
    let mut applied = w.clone();
    assert_eq!(
        apply_projections(config, &mut applied, &projections).unwrap(),
        3
    );
}

#[test]
fn bad_inputs_are_errors() {
    let config = &configs()[0];
    let w = weights(config, 50, 1.0);
    let factors = ModelFactors::compute(config, &w, &UncompressedLayers::none(), None).unwrap();
    assert!(Distiller::new(config, &w, &factors, &[1, 2, 3], 8).is_err());
    let mut out_of_vocab = ids(config, 8, 6);
    out_of_vocab[3] = 10_000;
    let mut distiller = Distiller::new(config, &w, &factors, &out_of_vocab, 8).unwrap();
    assert!(distiller.teacher_log_probs(0).is_err());
    let bad = DistillConfig {
        learning_rate: 0.0,
        ..DistillConfig::default()
    };
    assert!(bad.validate().is_err());
}
