//! Hugging Face directory loading: config.json + sharded safetensors in bf16 and f32.

use std::collections::HashMap;
use std::path::Path;

use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use starling_models::{
    expected_weight_shapes, load_model, synthetic_weights, Architecture, ModelConfig, ModelError,
    ModelSource, RopeStyle, WeightMap,
};

const TINY_LLAMA_CONFIG: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 256,
    "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16"
}"#;

/// Stored tensor bytes plus their dtype and shape.
struct Stored {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn stored(dtype: Dtype, shape: &[usize], values: &[f32]) -> Stored {
    let bytes = match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F64 => values
            .iter()
            .flat_map(|&v| f64::from(v).to_le_bytes())
            .collect(),
        other => panic!("test helper does not write {other}"),
    };
    Stored {
        dtype,
        shape: shape.to_vec(),
        bytes,
    }
}

fn write_shard(path: &Path, tensors: &HashMap<String, Stored>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, t)| {
            let view = TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Writes `weights` as a two-shard HF directory; the embedding in bf16, the rest in f32.
fn write_hf_dir(dir: &Path, config_json: &str, weights: &WeightMap) {
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    let mut shards = [HashMap::new(), HashMap::new()];
    for (index, name) in weights.names().into_iter().enumerate() {
        let tensor = weights.get(name).unwrap();
        let dtype = if name == "model.embed_tokens.weight" {
            Dtype::BF16
        } else {
            Dtype::F32
        };
        shards[index % 2].insert(
            name.to_owned(),
            stored(dtype, tensor.shape(), tensor.data()),
        );
    }
    write_shard(&dir.join("model-00001-of-00002.safetensors"), &shards[0]);
    write_shard(&dir.join("model-00002-of-00002.safetensors"), &shards[1]);
}

#[test]
fn tiny_llama_dir_loads_config_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let expected_config = ModelConfig::tiny_llama_for_tests();
    let original = synthetic_weights(&expected_config, 3);
    write_hf_dir(dir.path(), TINY_LLAMA_CONFIG, &original);

    let model = load_model(dir.path()).unwrap();
    assert_eq!(model.config, expected_config);
    assert_eq!(model.config.rope.style, RopeStyle::Neox);
    assert_eq!(model.source, ModelSource::HfDir(dir.path().to_owned()));
    assert!(model.gguf_metadata.is_none());
    assert_eq!(model.weights.len(), original.len());

    // f32 tensors come back exactly; bf16 keeps 8 mantissa bits (relative error < 2^-8).
    let q = "model.layers.1.self_attn.q_proj.weight";
    assert_eq!(model.weights.get(q), original.get(q));
    let embed = "model.embed_tokens.weight";
    let loaded = model.weights.get(embed).unwrap().data();
    for (got, want) in loaded.iter().zip(original.get(embed).unwrap().data()) {
        assert!((got - want).abs() <= want.abs() / 256.0, "{got} vs {want}");
    }
}

#[test]
fn qwen2_dir_has_biases_tied_head_and_generation_stop_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let config_json = r#"{"model_type": "qwen2", "vocab_size": 128, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "max_position_embeddings": 512, "tie_word_embeddings": true,
        "bos_token_id": 151643, "eos_token_id": 7}"#;
    let mut config = ModelConfig::tiny_llama_for_tests();
    config.architecture = Architecture::Qwen2;
    config.attention_bias = true;
    config.tie_word_embeddings = true;
    write_hf_dir(dir.path(), config_json, &synthetic_weights(&config, 5));
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [7, 8]}"#,
    )
    .unwrap();

    let model = load_model(dir.path()).unwrap();
    assert_eq!(model.config.architecture, Architecture::Qwen2);
    assert!(model.config.attention_bias);
    assert!(model.config.tie_word_embeddings);
    assert_eq!(model.config.eos_token_ids, vec![7, 8]);
    assert_eq!(model.config.rope.theta, 1_000_000.0);
    assert_eq!(
        model
            .weights
            .get("model.layers.0.self_attn.k_proj.bias")
            .unwrap()
            .shape(),
        &[32]
    );
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), TINY_LLAMA_CONFIG).unwrap();
    let config = ModelConfig::tiny_llama_for_tests();
    let mut tensors = HashMap::new();
    for (name, shape) in expected_weight_shapes(&config) {
        let numel = shape.iter().product();
        let dtype = if name == "model.norm.weight" {
            Dtype::F64
        } else {
            Dtype::F32
        };
        tensors.insert(name, stored(dtype, &shape, &vec![0.5; numel]));
    }
    write_shard(&dir.path().join("model.safetensors"), &tensors);
    let err = load_model(dir.path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::UnsupportedQuantType { tensor, type_name }
            if tensor == "model.norm.weight" && type_name.contains("F64")),
        "{err}"
    );
}

#[test]
fn missing_lm_head_of_an_untied_model_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut weights = synthetic_weights(&ModelConfig::tiny_llama_for_tests(), 1);
    weights.take("lm_head.weight", &[128, 64]).unwrap();
    write_hf_dir(dir.path(), TINY_LLAMA_CONFIG, &weights);
    let err = load_model(dir.path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name == "lm_head.weight"),
        "{err}"
    );
}

#[test]
fn directory_without_weights_or_config_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_model(dir.path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::Io { path, .. } if path.ends_with("config.json")),
        "{err}"
    );
    std::fs::write(dir.path().join("config.json"), TINY_LLAMA_CONFIG).unwrap();
    let err = load_model(dir.path()).unwrap_err();
    assert!(err.to_string().contains("no *.safetensors"), "{err}");
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let err = load_model(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::Malformed { .. }), "{err}");
}
