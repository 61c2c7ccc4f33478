//! Reading a Hugging Face `config.json` (plus `generation_config.json`'s stop tokens) into a
//! [`ModelConfig`], with `transformers`' defaults for `LlamaConfig`, `Qwen2Config`,
//! `Qwen3Config`, `MistralConfig` and `Gemma3TextConfig` (Gemma-3's parts: [`gemma3`]).

mod gemma3;

use std::path::Path;

use serde::Deserialize;

use crate::{
    Architecture, ModelConfig, ModelError, RopeConfig, RopeScaling, RopeStyle, SlidingWindow,
};

/// The subset of `config.json` Starling reads. Older and newer `transformers` spell RoPE
/// settings differently (`rope_theta` + `rope_scaling` vs one `rope_parameters`); both parse.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeParameters>,
    /// One parameter set (newer Llama / Qwen), or one per layer type (Gemma-3:
    /// `full_attention`, `sliding_attention`).
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    /// Qwen2/Qwen3 configs carry a sliding-window switch (off in every released model).
    use_sliding_window: Option<bool>,
    /// The attention window (Mistral applies it whenever it is set; Qwen only under
    /// `use_sliding_window`).
    sliding_window: Option<usize>,
    /// Gemma-3: each layer's kind, `sliding_attention` or `full_attention`.
    layer_types: Option<Vec<String>>,
    /// Gemma-3's older spelling of the layer kinds: every n-th layer is full.
    sliding_window_pattern: Option<usize>,
    /// Gemma-3's older spelling of the windowed layers' RoPE base.
    rope_local_base_freq: Option<f32>,
    /// Gemma-3: the softmax scale is `query_pre_attn_scalar^-0.5`.
    query_pre_attn_scalar: Option<f32>,
    /// Soft-capping of the logits (Gemma-2; null in Gemma-3): refused when set.
    final_logit_softcapping: Option<f32>,
    /// Soft-capping of the attention scores (Gemma-2; null in Gemma-3): refused when set.
    attn_logit_softcapping: Option<f32>,
    /// The MLP activation's HF name (Gemma: `gelu_pytorch_tanh`).
    hidden_activation: Option<String>,
    /// EmbeddingGemma's bidirectional attention: refused.
    use_bidirectional_attention: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
}

/// `rope_scaling` / `rope_parameters`.
#[derive(Debug, Default, Clone, Deserialize)]
struct HfRopeParameters {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f32>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
}

/// Token ids are written either as one number or as a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Self::One(id) => vec![id],
            Self::Many(ids) => ids,
        }
    }
}

/// Only the stop tokens of `generation_config.json` matter here.
#[derive(Debug, Deserialize)]
struct HfGenerationConfig {
    eos_token_id: Option<OneOrMany>,
}

/// Reads `dir/config.json` (and `dir/generation_config.json` when present).
pub(crate) fn read_hf_config(dir: &Path) -> Result<ModelConfig, ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let mut config = parse_hf_config(&text)
        .map_err(|e| ModelError::InvalidConfig(format!("{}: {e}", path.display())))?;

    let generation_path = dir.join("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&generation_path) {
        let generation: HfGenerationConfig = serde_json::from_str(&text).map_err(|e| {
            ModelError::InvalidConfig(format!("{}: {e}", generation_path.display()))
        })?;
        for id in generation
            .eos_token_id
            .map(OneOrMany::into_vec)
            .unwrap_or_default()
        {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
    }
    Ok(config)
}

/// Parses the text of a `config.json`.
pub(crate) fn parse_hf_config(text: &str) -> Result<ModelConfig, ModelError> {
    let hf: HfConfig =
        serde_json::from_str(text).map_err(|e| ModelError::InvalidConfig(e.to_string()))?;
    let architecture = match hf.model_type.as_str() {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "mistral" => Architecture::Mistral,
        // `gemma3` is the multimodal wrapper: its text model's config sits under
        // `text_config`, with the tensors under other names.
        "gemma3_text" => Architecture::Gemma3,
        "gemma3" => {
            return Err(ModelError::UnsupportedArchitecture(
                "gemma3 (the multimodal Gemma3ForConditionalGeneration; its text model, \
                 model_type gemma3_text, is supported)"
                    .into(),
            ))
        }
        other => return Err(ModelError::UnsupportedArchitecture(other.to_owned())),
    };
    if hf.use_sliding_window == Some(true) {
        return Err(ModelError::InvalidConfig(format!(
            "{}: `use_sliding_window: true` is not supported (sliding-window attention)",
            hf.model_type
        )));
    }
    let head_dim = match hf.head_dim {
        Some(dim) => dim,
        // `Qwen3Config` defaults `head_dim` to 128 whatever the hidden size, Gemma-3 to 256.
        None if architecture == Architecture::Qwen3 => 128,
        None if architecture == Architecture::Gemma3 => 256,
        None => hf
            .hidden_size
            .checked_div(hf.num_attention_heads)
            .unwrap_or(0),
    };
    // `rope_parameters` (newer) carries theta and scaling together; `rope_scaling` (older)
    // only the scaling, with theta at the top level. Gemma-3's has one set per layer type.
    let rope_sets = gemma3::RopeSets::parse(hf.rope_parameters.as_ref())?;
    let rope_parameters = rope_sets
        .full
        .clone()
        .or_else(|| hf.rope_scaling.clone())
        .unwrap_or_default();
    let default_theta = match architecture {
        Architecture::Gemma3 => gemma3::DEFAULT_GLOBAL_ROPE_THETA,
        _ => 10_000.0,
    };
    let theta = rope_parameters
        .rope_theta
        .or(hf.rope_theta)
        .unwrap_or(default_theta);
    // HF checkpoints keep the original Q/K layout, rotated by `rotate_half`.
    let rope = RopeConfig {
        theta,
        style: RopeStyle::Neox,
        scaling: rope_scaling(&rope_parameters)?,
    };
    let default_context = match architecture {
        Architecture::Llama => 2048,
        // MistralConfig's default: 4096 * 32; Gemma3TextConfig's 131,072.
        Architecture::Mistral | Architecture::Gemma3 => 131_072,
        Architecture::Qwen2 | Architecture::Qwen3 => 32_768,
    };
    let max_position_embeddings = hf.max_position_embeddings.unwrap_or(default_context);
    // Gemma3TextConfig's defaults: tied embeddings, BOS 2, EOS 1.
    let gemma = architecture == Architecture::Gemma3;
    let (sliding_window, attention_scale) = if gemma {
        let parts = gemma3::parts(&hf, &rope_sets, max_position_embeddings)?;
        (parts.sliding_window, parts.attention_scale)
    } else {
        (
            mistral_window(&hf, architecture, max_position_embeddings)?,
            None,
        )
    };
    Ok(ModelConfig {
        sliding_window,
        attention_scale,
        architecture,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: hf.num_hidden_layers,
        num_attention_heads: hf.num_attention_heads,
        num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim,
        rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
        rope,
        max_position_embeddings,
        tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(gemma),
        // Qwen2 always has Q/K/V biases and has no flag for them.
        attention_bias: architecture == Architecture::Qwen2 || hf.attention_bias.unwrap_or(false),
        bos_token_id: hf.bos_token_id.or(gemma.then_some(2)),
        eos_token_ids: hf.eos_token_id.map(OneOrMany::into_vec).unwrap_or_else(|| {
            if gemma {
                vec![1]
            } else {
                Vec::new()
            }
        }),
    })
}

/// Mistral's window: on every layer when it is shorter than the context (a window as long as
/// the context is full attention); `None` for the other Llama-layout models.
fn mistral_window(
    hf: &HfConfig,
    architecture: Architecture,
    max_position_embeddings: usize,
) -> Result<Option<SlidingWindow>, ModelError> {
    match (architecture, hf.sliding_window) {
        (Architecture::Mistral, Some(0)) => Err(ModelError::InvalidConfig(
            "mistral: `sliding_window` must be at least 1 (or null)".into(),
        )),
        (Architecture::Mistral, Some(window)) if window < max_position_embeddings => Ok(Some(
            SlidingWindow::every_layer(window, hf.num_hidden_layers),
        )),
        _ => Ok(None),
    }
}

fn rope_scaling(parameters: &HfRopeParameters) -> Result<Option<RopeScaling>, ModelError> {
    let kind = parameters
        .rope_type
        .as_deref()
        .or(parameters.legacy_type.as_deref());
    let field = |name: &str, value: Option<f32>| {
        value.ok_or_else(|| ModelError::InvalidConfig(format!("rope scaling needs `{name}`")))
    };
    match kind {
        None | Some("default") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear {
            factor: field("factor", parameters.factor)?,
        })),
        Some("llama3") => Ok(Some(RopeScaling::Llama3 {
            factor: field("factor", parameters.factor)?,
            low_freq_factor: field("low_freq_factor", parameters.low_freq_factor)?,
            high_freq_factor: field("high_freq_factor", parameters.high_freq_factor)?,
            original_max_position_embeddings: parameters
                .original_max_position_embeddings
                .ok_or_else(|| {
                    ModelError::InvalidConfig(
                        "rope scaling needs `original_max_position_embeddings`".to_owned(),
                    )
                })?,
        })),
        Some(other) => Err(ModelError::InvalidConfig(format!(
            "rope scaling type `{other}` is not supported (supported: linear, llama3)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA31_8B: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"
    }"#;

    #[test]
    fn llama31_config_reads_llama3_scaling() {
        let config = parse_hf_config(LLAMA31_8B).unwrap();
        assert_eq!(config.architecture, Architecture::Llama);
        assert_eq!(config.head_dim, 128);
        assert_eq!(config.num_kv_heads, 8);
        assert_eq!(config.rope.theta, 500_000.0);
        assert_eq!(config.rope.style, RopeStyle::Neox);
        assert_eq!(
            config.rope.scaling,
            Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            })
        );
        assert!(!config.attention_bias);
        assert_eq!(config.bos_token_id, Some(128_000));
        assert_eq!(config.eos_token_ids, vec![128_001, 128_008, 128_009]);
        config.validate().unwrap();
    }

    #[test]
    fn qwen2_defaults_biases_and_kv_heads() {
        let text = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "rope_theta": 1000000.0, "tie_word_embeddings": true,
            "eos_token_id": 151645, "rope_scaling": null}"#;
        let config = parse_hf_config(text).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen2);
        assert!(config.attention_bias);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.head_dim, 64);
        assert_eq!(config.max_position_embeddings, 32_768);
        assert_eq!(config.rope.scaling, None);
        assert_eq!(config.eos_token_ids, vec![151_645]);
    }

    /// Qwen3-8B's `config.json` (abridged): explicit head_dim, no biases, q/k norm implied.
    const QWEN3_8B: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
        "rope_scaling": null, "max_position_embeddings": 40960, "attention_bias": false,
        "tie_word_embeddings": false, "use_sliding_window": false, "sliding_window": null,
        "bos_token_id": 151643, "eos_token_id": 151645}"#;

    #[test]
    fn qwen3_config_matches_the_preset() {
        let config = parse_hf_config(QWEN3_8B).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen3);
        assert!(config.architecture.has_qk_norm());
        let mut preset = ModelConfig::qwen3_8b();
        // The preset also stops at <|endoftext|> (generation_config.json's list).
        preset.eos_token_ids = vec![151_645];
        assert_eq!(config, preset);
    }

    #[test]
    fn qwen3_defaults_head_dim_to_128_and_refuses_sliding_windows() {
        let no_head_dim = QWEN3_8B.replace("\"head_dim\": 128,", "");
        assert_eq!(parse_hf_config(&no_head_dim).unwrap().head_dim, 128);
        let windowed = QWEN3_8B.replace(
            "\"use_sliding_window\": false",
            "\"use_sliding_window\": true",
        );
        let err = parse_hf_config(&windowed).unwrap_err();
        assert!(err.to_string().contains("use_sliding_window"), "{err}");
    }

    /// Mistral-7B-v0.1's config.json (window 4096, 32k positions).
    const MISTRAL_7B_V01: &str = r#"{"architectures": ["MistralForCausalLM"],
        "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": false,
        "bos_token_id": 1, "eos_token_id": 2}"#;

    #[test]
    fn mistral_loads_as_the_llama_layout_with_every_layer_windowed() {
        let config = parse_hf_config(MISTRAL_7B_V01).unwrap();
        assert_eq!(config.architecture, Architecture::Mistral);
        assert_eq!((config.head_dim, config.num_kv_heads), (128, 8));
        assert!(!config.attention_bias && !config.architecture.has_qk_norm());
        assert_eq!(config.rope.style, RopeStyle::Neox);
        assert_eq!(config.max_position_embeddings, 32_768);
        assert_eq!(
            config.sliding_window,
            Some(SlidingWindow::every_layer(4096, 32))
        );
        assert_eq!(config.layer_window_tokens(31), Some(4096));
        assert!(config.every_layer_windowed());
        assert_eq!(config, ModelConfig::mistral_7b());
        // v0.3 has no window: the whole context.
        let v03 = MISTRAL_7B_V01.replace("\"sliding_window\": 4096", "\"sliding_window\": null");
        assert_eq!(parse_hf_config(&v03).unwrap().sliding_window, None);
        // A window at least as long as the context limits nothing.
        let wide = MISTRAL_7B_V01.replace("\"sliding_window\": 4096", "\"sliding_window\": 65536");
        let wide = parse_hf_config(&wide).unwrap();
        assert_eq!(
            (wide.sliding_window, wide.max_position_embeddings),
            (None, 32_768)
        );
        let zero = MISTRAL_7B_V01.replace("\"sliding_window\": 4096", "\"sliding_window\": 0");
        let err = parse_hf_config(&zero).unwrap_err();
        assert!(err.to_string().contains("sliding_window"), "{err}");
    }

    #[test]
    fn linear_legacy_type_and_rope_parameters_both_parse() {
        let legacy = r#"{"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "rope_scaling": {"type": "linear", "factor": 8.0}}"#;
        let config = parse_hf_config(legacy).unwrap();
        assert_eq!(config.num_kv_heads, 32);
        assert_eq!(
            config.rope.scaling,
            Some(RopeScaling::Linear { factor: 8.0 })
        );

        let newer = r#"{"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}}"#;
        let config = parse_hf_config(newer).unwrap();
        assert_eq!(config.rope.theta, 250_000.0);
        assert_eq!(config.rope.scaling, None);
    }

    #[test]
    fn unsupported_models_and_scalings_are_named() {
        let mistral = r#"{"model_type": "mixtral", "vocab_size": 1, "hidden_size": 1,
            "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1}"#;
        assert!(matches!(
            parse_hf_config(mistral),
            Err(ModelError::UnsupportedArchitecture(name)) if name == "mixtral"
        ));
        let yarn = LLAMA31_8B.replace("\"llama3\"", "\"yarn\"");
        let err = parse_hf_config(&yarn).unwrap_err();
        assert!(err.to_string().contains("yarn"), "{err}");
        let missing = LLAMA31_8B.replace("\"hidden_size\": 4096,", "");
        let err = parse_hf_config(&missing).unwrap_err();
        assert!(err.to_string().contains("hidden_size"), "{err}");
    }
}
