use starling_backend::cpu::CpuBackend;
use starling_models::{synthetic_weights, LayerTensor, WeightMap};

use super::*;
use crate::{ModelFactors, UncompressedLayers, DEFAULT_RELATIVE_FLOOR};

/// The tiny test model with channel-dependent input-norm scales (0.25 … 4), so attention inputs
/// are anisotropic as in trained models (a few loud channels) and whitening has work to do.
fn anisotropic_model(seed: u64) -> (ModelConfig, WeightMap) {
    let config = ModelConfig::tiny_llama_for_tests();
    let mut weights = synthetic_weights(&config, seed);
    let d = config.hidden_size;
    for layer in 0..config.num_layers {
        let scales = (0..d).map(|j| 0.25 * ((j * 5) % 16 + 1) as f32).collect();
        let name = format!("model.layers.{layer}.input_layernorm.weight");
        weights.insert(name, HostTensor::new(vec![d], scales).unwrap());
    }
    (config, weights)
}

/// Two windows of different lengths, ids spread over the vocabulary.
fn windows() -> Vec<Vec<u32>> {
    vec![
        (0..40).map(|i| (i * 37 + 5) % 128).collect(),
        (0..57).map(|i| (i * 11 + 3) % 128).collect(),
    ]
}

/// Keeps every layer's attention-input rows, as the model hands them over.
#[derive(Default)]
struct Recorder {
    per_layer: Vec<Vec<Vec<f32>>>,
}

impl ActivationCapture for Recorder {
    fn attention_input(&mut self, layer: usize, rows: &HostTensor) -> Result<(), ModelError> {
        if self.per_layer.len() <= layer {
            self.per_layer.resize(layer + 1, Vec::new());
        }
        let width = rows.shape()[1];
        let layer_rows = &mut self.per_layer[layer];
        layer_rows.extend(rows.data().chunks_exact(width).map(<[f32]>::to_vec));
        Ok(())
    }
}

/// Statistics and recorded rows of `windows` through the model.
fn observe(
    config: &ModelConfig,
    weights: &WeightMap,
) -> (AttentionInputMoments, Vec<Vec<Vec<f32>>>) {
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, config, weights.clone()).unwrap();
    let mut moments = AttentionInputMoments::new(config);
    let mut recorder = Recorder::default();
    for ids in windows() {
        moments.observe(&backend, &model, &ids).unwrap();
        model
            .forward_sequence(
                &backend,
                &ids,
                Vec::new(),
                ForwardOptions::activations(&mut recorder),
            )
            .unwrap();
    }
    (moments, recorder.per_layer)
}

#[test]
fn captured_moments_equal_xtx_over_n_computed_directly() {
    let (config, weights) = anisotropic_model(7);
    let (moments, rows) = observe(&config, &weights);
    let d = config.hidden_size;
    let n = windows().iter().map(Vec::len).sum::<usize>();
    assert_eq!(moments.tokens_seen(), n as u64);
    assert_eq!(moments.windows_seen(), 2);

    // Layer 0's input, straight from the weights: RMSNorm(embedding) · norm scale.
    let embed = weights.get("model.embed_tokens.weight").unwrap().data();
    let scale = weights
        .get("model.layers.0.input_layernorm.weight")
        .unwrap()
        .data();
    let direct: Vec<Vec<f64>> = windows()
        .concat()
        .iter()
        .map(|&id| {
            let e = &embed[id as usize * d..(id as usize + 1) * d];
            let ms = e.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + f64::from(config.rms_norm_eps)).sqrt();
            e.iter()
                .zip(scale)
                .map(|(&x, &s)| f64::from(x) * inv * f64::from(s))
                .collect()
        })
        .collect();

    assert_eq!(rows.len(), config.num_layers);
    for (layer, (layer_rows, moment)) in rows.iter().zip(moments.moments()).enumerate() {
        let x: Vec<Vec<f64>> = if layer == 0 {
            direct.clone()
        } else {
            layer_rows
                .iter()
                .map(|r| r.iter().map(|&v| f64::from(v)).collect())
                .collect()
        };
        assert_eq!(x.len(), n);
        let got = moment.mean().unwrap();
        let mut scale_sq = 0.0_f64;
        let mut worst = 0.0_f64;
        for i in 0..d {
            for j in 0..d {
                let expected = x.iter().map(|r| r[i] * r[j]).sum::<f64>() / n as f64;
                scale_sq = scale_sq.max(expected.abs());
                worst = worst.max((got[i * d + j] - expected).abs());
            }
        }
        // Layer 0 compares the model's f32 RMSNorm with an f64 one; the rest are exact sums of
        // the same f32 rows in another order.
        assert!(
            worst <= 1e-5 * scale_sq,
            "layer {layer}: max |ΔC| {worst} (max |C| {scale_sq})"
        );
    }
}

/// `Σ_rows ‖(W − Ŵ) x‖²` over the recorded calibration rows.
fn output_error(w: &Matrix, approx: &Matrix, rows: &[Vec<f32>]) -> f64 {
    let mut total = 0.0;
    for x in rows {
        for out in 0..w.rows() {
            let diff: f64 = w
                .row(out)
                .iter()
                .zip(approx.row(out))
                .zip(x)
                .map(|((&a, &b), &v)| (f64::from(a) - f64::from(b)) * f64::from(v))
                .sum();
            total += diff * diff;
        }
    }
    total
}

#[test]
fn whitened_truncations_have_lower_output_error_on_the_calibration_rows() {
    let (config, weights) = anisotropic_model(11);
    let (moments, rows) = observe(&config, &weights);
    let whiteners = moments.whiteners(DEFAULT_RELATIVE_FLOOR).unwrap();
    let none = UncompressedLayers::none();
    let plain = ModelFactors::compute(&config, &weights, &none, None).unwrap();
    let white = ModelFactors::compute(&config, &weights, &none, Some(&whiteners)).unwrap();
    assert!(white.is_whitened() && !plain.is_whitened());

    let (mut plain_total, mut white_total) = (0.0, 0.0);
    for layer in 0..config.num_layers {
        let w_k = weight(&weights, LayerTensor::KProj, layer, &config);
        let w_v = weight(&weights, LayerTensor::VProj, layer, &config);
        let head_dim = config.head_dim;
        let (p, q) = (plain.layer(layer).unwrap(), white.layer(layer).unwrap());
        let mut cases: Vec<(Matrix, &crate::Factorization, &crate::Factorization)> = (0..config
            .num_kv_heads)
            .map(|h| {
                let rows = w_k.row_block(h * head_dim, (h + 1) * head_dim).unwrap();
                (rows, &p.keys[h], &q.keys[h])
            })
            .collect();
        cases.push((w_v, &p.value, &q.value));
        for (w, plain_f, white_f) in cases {
            for rank in [1, 2, 4, 8, plain_f.max_rank() - 1] {
                let e_plain = output_error(&w, &plain_f.reconstruct(rank).unwrap(), &rows[layer]);
                let e_white = output_error(&w, &white_f.reconstruct(rank).unwrap(), &rows[layer]);
                // Eckart–Young in the whitened metric: never worse (up to f32 rounding).
                assert!(
                    e_white <= e_plain * (1.0 + 1e-4) + 1e-9,
                    "layer {layer} rank {rank}: whitened {e_white} > plain {e_plain}"
                );
                plain_total += e_plain;
                white_total += e_white;
            }
        }
    }
    // And on anisotropic inputs it is clearly better, so the comparison is not vacuous.
    assert!(
        white_total < 0.9 * plain_total,
        "whitened {white_total} vs plain {plain_total}"
    );
}

fn weight(weights: &WeightMap, t: LayerTensor, layer: usize, config: &ModelConfig) -> Matrix {
    let shape = t.shape(config);
    let data = weights.get(&t.name(layer)).unwrap().data().to_vec();
    Matrix::new(shape[0], shape[1], data).unwrap()
}

#[test]
fn mismatched_models_and_malformed_rows_are_errors() {
    let (config, weights) = anisotropic_model(3);
    let backend = CpuBackend::new();
    let model = LlamaModel::load(&backend, &config, weights).unwrap();
    let mut other = config.clone();
    other.num_layers = 3;
    let mut moments = AttentionInputMoments::new(&other);
    assert!(moments.observe(&backend, &model, &[1, 2, 3]).is_err());

    let mut moments = AttentionInputMoments::new(&config);
    assert!(moments.observe(&backend, &model, &[]).is_err());
    let wrong_width = HostTensor::new(vec![2, 3], vec![0.0; 6]).unwrap();
    assert!(moments.attention_input(0, &wrong_width).is_err());
    let row = HostTensor::new(vec![1, 64], vec![1.0; 64]).unwrap();
    assert!(moments.attention_input(5, &row).is_err());
    assert!(moments.attention_input(1, &row).is_ok());
    // Statistics of zero rows cannot whiten.
    assert!(moments.whiteners(DEFAULT_RELATIVE_FLOOR).is_err());
}
