//! GGUF loading: a tiny model round trip, and every broken-file case giving the right error.

mod common;

use std::path::Path;

use common::{gguf_bytes, tiny_metadata, tiny_tensors, write_tiny_gguf, RawGguf, TinyOptions};
use starling_models::{
    load_model, Architecture, GgufValue, ModelConfig, ModelError, ModelSource, RopeScaling,
    RopeStyle,
};

fn load_bytes(dir: &Path, bytes: &[u8]) -> Result<starling_models::LoadedModel, ModelError> {
    let path = dir.join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    load_model(&path)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tiny_llama_round_trips_config_names_shapes_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let written = write_tiny_gguf(&path, TinyOptions::llama());
    let model = load_model(&path).unwrap();

    let mut expected = ModelConfig::tiny_llama_for_tests();
    expected.rope.style = RopeStyle::Interleaved;
    expected.tie_word_embeddings = true;
    assert_eq!(model.config, expected);
    assert_eq!(model.source, ModelSource::Gguf(path.clone()));
    let metadata = model.gguf_metadata.as_ref().unwrap();
    assert!(matches!(
        metadata.get("tokenizer.ggml.tokens"),
        Some(GgufValue::Array(tokens)) if tokens.len() == 128
    ));

    let mut weights = model.weights;
    weights.check_complete(&model.config).unwrap();
    assert_eq!(weights.num_params(), model.config.num_params());
    assert!(!weights.contains("lm_head.weight"));

    let find = |name: &str| written.iter().find(|t| t.name == name).unwrap();
    // F32 exact, F16 to half precision, Q8_0 to within one step of max|x|/127 ≈ 0.004.
    let norm = weights
        .take("model.layers.1.post_attention_layernorm.weight", &[64])
        .unwrap();
    assert_eq!(norm.data(), find("blk.1.ffn_norm.weight").values.as_slice());
    let embed = weights
        .take("model.embed_tokens.weight", &[128, 64])
        .unwrap();
    assert!(max_abs_diff(embed.data(), &find("token_embd.weight").values) < 1e-3);
    let k_proj = weights
        .take("model.layers.0.self_attn.k_proj.weight", &[32, 64])
        .unwrap();
    assert!(max_abs_diff(k_proj.data(), &find("blk.0.attn_k.weight").values) < 4e-3);
    let down = weights
        .take("model.layers.1.mlp.down_proj.weight", &[64, 128])
        .unwrap();
    assert!(max_abs_diff(down.data(), &find("blk.1.ffn_down.weight").values) < 4e-3);
}

#[test]
fn qwen2_reads_biases_untied_head_and_neox_rope() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-qwen.gguf");
    let written = write_tiny_gguf(&path, TinyOptions::qwen2());
    let model = load_model(&path).unwrap();
    assert_eq!(model.config.architecture, Architecture::Qwen2);
    assert_eq!(model.config.rope.style, RopeStyle::Neox);
    assert!(model.config.attention_bias);
    assert!(!model.config.tie_word_embeddings);
    let bias = model
        .weights
        .get("model.layers.1.self_attn.v_proj.bias")
        .unwrap();
    let written_bias = written
        .iter()
        .find(|t| t.name == "blk.1.attn_v.bias")
        .unwrap();
    assert_eq!(bias.shape(), &[32]);
    assert_eq!(bias.data(), written_bias.values.as_slice());
    assert_eq!(
        model.weights.get("lm_head.weight").unwrap().shape(),
        &[128, 64]
    );
}

/// llama.cpp stores Llama 3.1 RoPE scaling as per-pair divisors in a `rope_freqs` tensor.
#[test]
fn rope_freqs_tensor_becomes_per_dim_scaling() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = tiny_tensors(TinyOptions::llama());
    let factors = vec![1.0, 1.0, 1.5, 2.0, 4.0, 8.0, 8.0, 8.0];
    tensors.push(common::TensorSpec {
        name: "rope_freqs.weight".into(),
        shape: vec![8],
        values: factors.clone(),
        dtype: candle_core::quantized::GgmlDType::F32,
    });
    let model = load_bytes(dir.path(), &gguf_bytes(&tiny_metadata("llama"), &tensors)).unwrap();
    assert_eq!(
        model.config.rope.scaling,
        Some(RopeScaling::PerDimFactors(factors))
    );
    assert!(!model.weights.names().iter().any(|n| n.contains("rope")));
}

#[test]
fn wrong_magic_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    bytes[..4].copy_from_slice(b"GGML");
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        matches!(err, ModelError::BadMagic { found, .. } if &found == b"GGML"),
        "{err}"
    );
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
}

#[test]
fn unsupported_version_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = RawGguf::new(1, 0, 0).with_data(0);
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedVersion { version: 1, .. }),
        "{err}"
    );
}

#[test]
fn truncated_data_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    let err = load_bytes(dir.path(), &bytes[..bytes.len() - 100]).unwrap_err();
    match &err {
        ModelError::Truncated { what, .. } => assert!(what.contains("tensor `"), "{err}"),
        other => panic!("expected Truncated, got {other}"),
    }
}

#[test]
fn truncated_header_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    for cut in [0, 3, 10, 30, 200] {
        let err = load_bytes(dir.path(), &bytes[..cut]).unwrap_err();
        assert!(
            matches!(err, ModelError::Truncated { .. }),
            "cut {cut}: {err}"
        );
    }
}

#[test]
fn unknown_and_unsupported_quant_types_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    for (type_id, type_text) in [(99, "unknown ggml type 99"), (16, "IQ2_XXS")] {
        let bytes = RawGguf::new(3, 1, 1)
            .string_entry("general.architecture", "llama")
            .tensor_entry("blk.0.attn_q.weight", &[256, 4], type_id, 0)
            .with_data(4096);
        let err = load_bytes(dir.path(), &bytes).unwrap_err();
        match &err {
            ModelError::UnsupportedQuantType { tensor, type_name } => {
                assert_eq!(tensor, "blk.0.attn_q.weight");
                assert!(type_name.contains(type_text), "{type_name}");
            }
            other => panic!("expected UnsupportedQuantType, got {other}"),
        }
        assert!(err.to_string().contains("blk.0.attn_q.weight"));
    }
}

#[test]
fn missing_tensor_is_named_canonically() {
    let dir = tempfile::tempdir().unwrap();
    let tensors: Vec<_> = tiny_tensors(TinyOptions::llama())
        .into_iter()
        .filter(|t| t.name != "blk.1.ffn_up.weight")
        .collect();
    let err = load_bytes(dir.path(), &gguf_bytes(&tiny_metadata("llama"), &tensors)).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
}

#[test]
fn wrongly_shaped_tensor_reports_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = tiny_tensors(TinyOptions::llama());
    let gate = tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_gate.weight")
        .unwrap();
    gate.shape = vec![96, 64];
    gate.values.truncate(96 * 64);
    let err = load_bytes(dir.path(), &gguf_bytes(&tiny_metadata("llama"), &tensors)).unwrap_err();
    assert!(
        matches!(&err, ModelError::ShapeMismatch { name, expected, found }
            if name == "model.layers.0.mlp.gate_proj.weight"
                && expected == &[128, 64] && found == &[96, 64]),
        "{err}"
    );
}

#[test]
fn unknown_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, text) in [("mamba", "mamba"), ("gemma2", "gemma2")] {
        let bytes = gguf_bytes(&tiny_metadata(arch), &tiny_tensors(TinyOptions::llama()));
        let err = load_bytes(dir.path(), &bytes).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnsupportedArchitecture(name) if name.contains(text)),
            "{err}"
        );
    }
}

#[test]
fn missing_metadata_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let metadata: Vec<_> = tiny_metadata("llama")
        .into_iter()
        .filter(|(key, _)| key != "llama.block_count")
        .collect();
    let bytes = gguf_bytes(&metadata, &tiny_tensors(TinyOptions::llama()));
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingMetadata { key } if key == "llama.block_count"),
        "{err}"
    );
    assert!(err.to_string().contains("llama.block_count"));
}

/// A corrupt layer count must fail on the first absent layer, not list millions of names.
#[test]
fn absurd_layer_count_fails_fast_on_the_first_missing_layer() {
    let dir = tempfile::tempdir().unwrap();
    let metadata: Vec<_> = tiny_metadata("llama")
        .into_iter()
        .map(|(key, value)| match key.as_str() {
            "llama.block_count" => (key, GgufValue::U32(u32::MAX)),
            _ => (key, value),
        })
        .collect();
    let bytes = gguf_bytes(&metadata, &tiny_tensors(TinyOptions::llama()));
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name.starts_with("model.layers.2.")),
        "{err}"
    );
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.gguf");
    let err = load_model(&path).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
    assert!(err.to_string().contains("absent.gguf"));
}

/// Every prefix of the header, and the header with any one byte set to 0xFF, loads or fails
/// with an error; none panics or allocates without bound.
#[test]
fn corrupted_headers_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    // The metadata and directory take about 3.5 KB; the rest is tensor data.
    let header_len = 4096.min(bytes.len());
    for cut in (0..header_len).step_by(7) {
        assert!(load_bytes(dir.path(), &bytes[..cut]).is_err(), "cut {cut}");
    }
    for position in (0..header_len).step_by(5) {
        let mut corrupted = bytes.clone();
        corrupted[position] = 0xFF;
        let _ = load_bytes(dir.path(), &corrupted);
    }
}

/// Where the data offset of tensor `name` sits in the directory of a GGUF file: after the name,
/// the dimension count, the dimensions and the type id.
fn offset_field(bytes: &[u8], name: &str) -> usize {
    let mut entry = (name.len() as u64).to_le_bytes().to_vec();
    entry.extend_from_slice(name.as_bytes());
    let start = bytes
        .windows(entry.len())
        .position(|w| w == entry.as_slice())
        .unwrap_or_else(|| panic!("{name} not in the directory"));
    let dims_at = start + entry.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    dims_at + 4 + 8 * n_dims + 4
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// A tensor whose data offset is off the file's alignment loaded before and read shifted bytes
/// (NaN and garbage); it must be refused, naming the tensor.
#[test]
fn a_misaligned_tensor_offset_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    let at = offset_field(&bytes, "blk.0.attn_q.weight");
    let shifted = read_u64(&bytes, at) + 4;
    bytes[at..at + 8].copy_from_slice(&shifted.to_le_bytes());
    let err = load_bytes(dir.path(), &bytes).expect_err("refused");
    let text = err.to_string();
    assert!(matches!(err, ModelError::Malformed { .. }), "{text}");
    assert!(text.contains("blk.0.attn_q.weight"), "{text}");
    assert!(text.contains("alignment"), "{text}");

    // The same in a hand-written file with a custom alignment of 64 bytes.
    let raw = RawGguf::new(3, 1, 1)
        .string("general.alignment")
        .u32(4)
        .u32(64)
        .tensor_entry("token_embd.weight", &[8, 4], 0, 32)
        .with_data(1024);
    let err = load_bytes(dir.path(), &raw).expect_err("refused");
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
    assert!(err.to_string().contains("64"), "{err}");
}

/// Two tensors whose data overlap would alias each other's weights.
#[test]
fn overlapping_tensor_data_names_both_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = gguf_bytes(&tiny_metadata("llama"), &tiny_tensors(TinyOptions::llama()));
    let q = offset_field(&bytes, "blk.0.attn_q.weight");
    let k = offset_field(&bytes, "blk.0.attn_k.weight");
    let q_offset = read_u64(&bytes, q);
    bytes[k..k + 8].copy_from_slice(&q_offset.to_le_bytes());
    let err = load_bytes(dir.path(), &bytes).expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("blk.0.attn_q.weight"), "{text}");
    assert!(text.contains("blk.0.attn_k.weight"), "{text}");
    assert!(text.contains("overlap"), "{text}");
}

/// The tiny model as llama.cpp writes a `qwen3` file: no biases, `attn_q_norm`/`attn_k_norm`
/// (`[head_dim]`, F32) in every layer, minus the tensors named in `without`.
fn tiny_qwen3_tensors(without: &[&str]) -> Vec<common::TensorSpec> {
    let config = ModelConfig::tiny_llama_for_tests();
    let mut tensors = tiny_tensors(TinyOptions {
        architecture: "qwen3",
        with_output: true,
        with_bias: false,
    });
    for layer in 0..config.num_layers {
        for (salt, norm) in ["attn_q_norm", "attn_k_norm"].into_iter().enumerate() {
            tensors.push(common::TensorSpec {
                name: format!("blk.{layer}.{norm}.weight"),
                shape: vec![config.head_dim],
                values: common::pattern(config.head_dim, 100 + 2 * layer + salt),
                dtype: candle_core::quantized::GgmlDType::F32,
            });
        }
    }
    tensors.retain(|t| !without.contains(&t.name.as_str()));
    tensors
}

#[test]
fn qwen3_reads_head_norms_and_neox_rope() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tiny_qwen3_tensors(&[]);
    let model = load_bytes(dir.path(), &gguf_bytes(&tiny_metadata("qwen3"), &tensors)).unwrap();
    assert_eq!(model.config.architecture, Architecture::Qwen3);
    assert_eq!(model.config.rope.style, RopeStyle::Neox);
    assert!(!model.config.attention_bias);
    let k_norm = model
        .weights
        .get("model.layers.1.self_attn.k_norm.weight")
        .unwrap();
    let written = tensors
        .iter()
        .find(|t| t.name == "blk.1.attn_k_norm.weight")
        .unwrap();
    assert_eq!(k_norm.data(), written.values.as_slice());
    let backend = starling_backend::cpu::CpuBackend::new();
    let llama = starling_models::llama::LlamaModel::load(&backend, &model.config, model.weights);
    assert!(llama.is_ok());
}

#[test]
fn qwen3_without_a_head_norm_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tiny_qwen3_tensors(&["blk.1.attn_k_norm.weight"]);
    let bytes = gguf_bytes(&tiny_metadata("qwen3"), &tensors);
    // The loader or the model build refuses it, naming the tensor either way.
    let err = match load_bytes(dir.path(), &bytes) {
        Err(e) => e,
        Ok(model) => {
            let backend = starling_backend::cpu::CpuBackend::new();
            starling_models::llama::LlamaModel::load(&backend, &model.config, model.weights)
                .err()
                .unwrap()
        }
    };
    assert!(
        matches!(&err, ModelError::MissingTensor { name }
            if name == "model.layers.1.self_attn.k_norm.weight"),
        "{err}"
    );
}

/// The tiny model as llama.cpp writes a `gemma3` file: q/k norms, `post_attention_norm`,
/// `ffn_norm` (the MLP's input norm) and `post_ffw_norm` in every layer, tied embeddings, and
/// the window in `gemma3.attention.sliding_window`.
fn tiny_gemma3_bytes(without: &[&str], window: Option<u32>) -> (Vec<u8>, Vec<common::TensorSpec>) {
    let config = ModelConfig::tiny_llama_for_tests();
    let mut tensors = tiny_tensors(TinyOptions {
        architecture: "gemma3",
        with_output: false,
        with_bias: false,
    });
    let hidden = config.hidden_size;
    for layer in 0..config.num_layers {
        for (salt, (norm, width)) in [
            ("attn_q_norm", config.head_dim),
            ("attn_k_norm", config.head_dim),
            ("post_attention_norm", hidden),
            ("post_ffw_norm", hidden),
        ]
        .into_iter()
        .enumerate()
        {
            tensors.push(common::TensorSpec {
                name: format!("blk.{layer}.{norm}.weight"),
                shape: vec![width],
                values: common::pattern(width, 200 + 4 * layer + salt),
                dtype: candle_core::quantized::GgmlDType::F32,
            });
        }
    }
    tensors.retain(|t| !without.contains(&t.name.as_str()));
    let mut metadata = tiny_metadata("gemma3");
    if let Some(tokens) = window {
        metadata.push((
            "gemma3.attention.sliding_window".to_owned(),
            candle_core::quantized::gguf_file::Value::U32(tokens),
        ));
    }
    (gguf_bytes(&metadata, &tensors), tensors)
}

#[test]
fn gemma3_reads_its_window_norms_and_neox_rope() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, tensors) = tiny_gemma3_bytes(&[], Some(8));
    let model = load_bytes(dir.path(), &bytes).unwrap();
    let config = &model.config;
    assert_eq!(config.architecture, Architecture::Gemma3);
    assert_eq!(config.rope.style, RopeStyle::Neox);
    assert!(config.tie_word_embeddings);
    // Two layers, both before the sixth: both windowed, at the local RoPE base.
    assert_eq!(config.layer_window_tokens(1), Some(8));
    assert_eq!(config.layer_rope(0).theta, 10_000.0);
    assert_eq!(
        config.attention_softmax_scale(),
        1.0 / (config.head_dim as f32).sqrt()
    );
    // llama.cpp's `ffn_norm` is the MLP's input norm; the norms keep their stored values
    // (the converter already added Gemma's one).
    let pre = model
        .weights
        .get("model.layers.1.pre_feedforward_layernorm.weight")
        .unwrap();
    let written = tensors
        .iter()
        .find(|t| t.name == "blk.1.ffn_norm.weight")
        .unwrap();
    assert_eq!(pre.data(), written.values.as_slice());
    assert!(model
        .weights
        .contains("model.layers.0.post_feedforward_layernorm.weight"));
    let backend = starling_backend::cpu::CpuBackend::new();
    let gemma = starling_models::llama::LlamaModel::load(&backend, &model.config, model.weights);
    assert!(gemma.is_ok());
}

#[test]
fn gemma3_without_its_window_or_a_sandwich_norm_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = tiny_gemma3_bytes(&[], None);
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        err.to_string().contains("gemma3.attention.sliding_window"),
        "{err}"
    );
    let (bytes, _) = tiny_gemma3_bytes(&["blk.0.post_ffw_norm.weight"], Some(8));
    let err = load_bytes(dir.path(), &bytes).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name }
            if name == "model.layers.0.post_feedforward_layernorm.weight"),
        "{err}"
    );
}
