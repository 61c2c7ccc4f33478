//! Gemma-3's parts of a `config.json` (`Gemma3TextConfig`): which layers attend over the sliding
//! window and with which RoPE, and the softmax scale. Both spellings `transformers` has written
//! parse: the newer `layer_types` + per-layer-type `rope_parameters`, and the older
//! `sliding_window_pattern` + `rope_theta` / `rope_local_base_freq` + `rope_scaling` (the long
//! context scaling of the larger models applies to the full layers only).

use super::{rope_scaling, HfConfig, HfRopeParameters};
use crate::{ModelError, RopeConfig, RopeStyle, SlidingWindow};

/// `Gemma3TextConfig`'s RoPE base of the full-attention layers.
pub(super) const DEFAULT_GLOBAL_ROPE_THETA: f32 = 1_000_000.0;
/// `Gemma3TextConfig`'s RoPE base of the sliding-window layers.
const DEFAULT_LOCAL_ROPE_THETA: f32 = 10_000.0;
/// `Gemma3TextConfig`'s window and layer pattern (every sixth layer full).
const DEFAULT_SLIDING_WINDOW: usize = 4096;
const DEFAULT_SLIDING_WINDOW_PATTERN: usize = 6;
/// `Gemma3TextConfig`'s `query_pre_attn_scalar`.
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f32 = 256.0;

/// `rope_parameters`: one set for every layer, or one per layer type.
#[derive(Debug, Default)]
pub(super) struct RopeSets {
    /// The full-attention layers' set (or the only one).
    pub(super) full: Option<HfRopeParameters>,
    /// The sliding-window layers' set, when given per layer type.
    pub(super) sliding: Option<HfRopeParameters>,
}

impl RopeSets {
    /// Reads `rope_parameters` in either shape.
    pub(super) fn parse(value: Option<&serde_json::Value>) -> Result<Self, ModelError> {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(Self::default());
        };
        let set = |v: &serde_json::Value| {
            serde_json::from_value::<HfRopeParameters>(v.clone())
                .map_err(|e| ModelError::InvalidConfig(format!("rope_parameters: {e}")))
        };
        let per_type = value.as_object().is_some_and(|o| {
            o.contains_key("full_attention") || o.contains_key("sliding_attention")
        });
        if per_type {
            Ok(Self {
                full: value.get("full_attention").map(set).transpose()?,
                sliding: value.get("sliding_attention").map(set).transpose()?,
            })
        } else {
            Ok(Self {
                full: Some(set(value)?),
                sliding: None,
            })
        }
    }
}

/// What Gemma-3 adds to the common fields.
pub(super) struct Gemma3Parts {
    pub(super) sliding_window: Option<SlidingWindow>,
    pub(super) attention_scale: Option<f32>,
}

/// Gemma-3's window, layer kinds, local RoPE and softmax scale; refuses what is not built
/// (soft-capping, bidirectional attention, another activation, unknown layer kinds).
pub(super) fn parts(
    hf: &HfConfig,
    rope_sets: &RopeSets,
    max_position_embeddings: usize,
) -> Result<Gemma3Parts, ModelError> {
    let invalid = |m: String| Err(ModelError::InvalidConfig(format!("gemma3_text: {m}")));
    if let Some(cap) = hf.final_logit_softcapping.or(hf.attn_logit_softcapping) {
        return invalid(format!(
            "soft-capping ({cap}) is not supported (Gemma-3 configs set it to null)"
        ));
    }
    if hf.use_bidirectional_attention == Some(true) {
        return invalid("bidirectional attention (EmbeddingGemma) is not supported".into());
    }
    match hf.hidden_activation.as_deref() {
        None | Some("gelu_pytorch_tanh") => {}
        Some(other) => {
            return invalid(format!(
                "hidden_activation `{other}` is not supported (gelu_pytorch_tanh is)"
            ))
        }
    }
    let layers = hf.num_hidden_layers;
    let windowed: Vec<bool> = match &hf.layer_types {
        Some(kinds) => {
            if kinds.len() != layers {
                return invalid(format!(
                    "layer_types names {} of {layers} layers",
                    kinds.len()
                ));
            }
            kinds
                .iter()
                .map(|kind| match kind.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(ModelError::InvalidConfig(format!(
                        "gemma3_text: unknown layer type `{other}` (sliding_attention or \
                         full_attention)"
                    ))),
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let pattern = hf
                .sliding_window_pattern
                .unwrap_or(DEFAULT_SLIDING_WINDOW_PATTERN);
            if pattern == 0 {
                return invalid("sliding_window_pattern must be at least 1".into());
            }
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let window_tokens = hf.sliding_window.unwrap_or(DEFAULT_SLIDING_WINDOW);
    if window_tokens == 0 {
        return invalid("sliding_window must be at least 1".into());
    }
    let local = rope_sets.sliding.clone().unwrap_or_default();
    let local_rope = RopeConfig {
        theta: local
            .rope_theta
            .or(hf.rope_local_base_freq)
            .unwrap_or(DEFAULT_LOCAL_ROPE_THETA),
        style: RopeStyle::Neox,
        // The older spelling's `rope_scaling` is the full layers' alone.
        scaling: rope_scaling(&local)?,
    };
    // A window at least as long as the context limits nothing.
    let sliding_window = (windowed.iter().any(|w| *w) && window_tokens < max_position_embeddings)
        .then_some(SlidingWindow {
            tokens: window_tokens,
            layers: windowed,
            rope: Some(local_rope),
        });
    let scalar = hf
        .query_pre_attn_scalar
        .unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR);
    if !(scalar.is_finite() && scalar > 0.0) {
        return invalid(format!("query_pre_attn_scalar {scalar} must be positive"));
    }
    Ok(Gemma3Parts {
        sliding_window,
        attention_scale: Some(scalar.powf(-0.5)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse_hf_config;
    use crate::{Architecture, ModelConfig, RopeScaling};

    /// Gemma-3-270M's config.json as the Hub has it (older spelling).
    const GEMMA3_270M: &str = r#"{"architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": null, "sliding_window": 512, "query_pre_attn_scalar": 256,
        "final_logit_softcapping": null, "attn_logit_softcapping": null,
        "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1,
        "pad_token_id": 0, "tie_word_embeddings": true}"#;

    #[test]
    fn gemma3_270m_reads_its_window_pattern_local_rope_and_scale() {
        let config = parse_hf_config(GEMMA3_270M).unwrap();
        assert_eq!(config.architecture, Architecture::Gemma3);
        assert_eq!((config.num_kv_heads, config.head_dim), (1, 256));
        assert!(config.tie_word_embeddings && !config.attention_bias);
        let window = config.sliding_window.clone().unwrap();
        assert_eq!(window.tokens, 512);
        // Layers 5 and 11 and 17 are full: 5 of every 6 windowed.
        let full: Vec<usize> = (0..18).filter(|&i| !window.layers[i]).collect();
        assert_eq!(full, vec![5, 11, 17]);
        assert_eq!(config.layer_rope(0).theta, 10_000.0);
        assert_eq!(config.layer_rope(5).theta, 1_000_000.0);
        assert_eq!(config.attention_softmax_scale(), 1.0 / 16.0);
        assert_eq!(
            (config.bos_token_id, config.eos_token_ids.clone()),
            (Some(2), vec![1])
        );
        config.validate().unwrap();
        // The preset is this config (its end-of-turn token 106 comes from
        // generation_config.json), with the documented 268M parameters.
        let preset = ModelConfig::gemma3_270m();
        assert_eq!(
            ModelConfig {
                eos_token_ids: preset.eos_token_ids.clone(),
                ..config
            },
            preset
        );
        assert_eq!(preset.num_params() / 1_000_000, 268);
    }

    #[test]
    fn gemma3_newer_spelling_and_full_layer_scaling() {
        // Gemma-3-4B's linear scaling, per layer type as transformers 5 writes it.
        let newer = GEMMA3_270M
            .replace(
                r#""rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,"#,
                "",
            )
            .replace(
                r#""rope_scaling": null"#,
                r#""rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                    "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default",
                    "rope_theta": 10000.0}}, "layer_types": ["sliding_attention",
                    "full_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "full_attention"]"#,
            );
        let config = parse_hf_config(&newer).unwrap();
        assert_eq!(
            config.layer_rope(1).scaling,
            Some(RopeScaling::Linear { factor: 8.0 })
        );
        assert_eq!(config.layer_rope(0).scaling, None);
        assert_eq!(config.layer_rope(0).theta, 10_000.0);
        assert_eq!(config.layer_window_tokens(1), None);
        assert_eq!(config.layer_window_tokens(2), Some(512));
    }

    #[test]
    fn gemma3_refuses_what_is_not_built() {
        for (from, to, what) in [
            (
                r#""final_logit_softcapping": null"#,
                r#""final_logit_softcapping": 30.0"#,
                "soft-capping",
            ),
            (
                r#""hidden_activation": "gelu_pytorch_tanh""#,
                r#""hidden_activation": "relu""#,
                "hidden_activation",
            ),
            (
                r#""sliding_window": 512"#,
                r#""sliding_window": 512, "layer_types": ["chunked_attention"]"#,
                "layer_types",
            ),
            (
                r#""model_type": "gemma3_text""#,
                r#""model_type": "gemma3""#,
                "gemma3_text",
            ),
        ] {
            let err = parse_hf_config(&GEMMA3_270M.replace(from, to)).unwrap_err();
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
    }
}
