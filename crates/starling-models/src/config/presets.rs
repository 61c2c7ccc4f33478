//! Real model shapes by name (`--load-format synthetic` builds them with random weights: speed
//! does not depend on weight values), and the tiny test model.

use super::{
    invalid, Architecture, ModelConfig, RopeConfig, RopeScaling, RopeStyle, SlidingWindow,
};
use crate::ModelError;

/// Names accepted by [`preset`], in a stable order.
pub const PRESET_NAMES: &[&str] = &[
    "tiny-llama",
    "smollm2-135m",
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b",
    "llama2-7b",
    "longchat-7b-32k",
    "llama3-8b",
    "qwen2.5-7b",
    "qwen3-8b",
    "gemma-3-270m",
    "gemma-3-4b",
    "mistral-7b",
];

/// Looks up a preset of real (or test) model shapes by name (case-insensitive, see
/// [`PRESET_NAMES`]).
pub fn preset(name: &str) -> Result<ModelConfig, ModelError> {
    match name.to_ascii_lowercase().as_str() {
        "tiny-llama" => Ok(ModelConfig::tiny_llama_for_tests()),
        "smollm2-135m" => Ok(ModelConfig::smollm2_135m()),
        "qwen2.5-coder-0.5b" => Ok(ModelConfig::qwen2_5_coder_0_5b()),
        "qwen2.5-coder-1.5b" => Ok(ModelConfig::qwen2_5_coder_1_5b()),
        "llama2-7b" => Ok(ModelConfig::llama2_7b()),
        "longchat-7b-32k" => Ok(ModelConfig::longchat_7b_32k()),
        "llama3-8b" => Ok(ModelConfig::llama3_8b()),
        "qwen2.5-7b" => Ok(ModelConfig::qwen2_5_7b()),
        "qwen3-8b" => Ok(ModelConfig::qwen3_8b()),
        "gemma-3-270m" => Ok(ModelConfig::gemma3_270m()),
        "gemma-3-4b" => Ok(ModelConfig::gemma3_4b()),
        "mistral-7b" => Ok(ModelConfig::mistral_7b()),
        _ => Err(invalid(format!(
            "unknown model preset `{name}` (known: {})",
            PRESET_NAMES.join(", ")
        ))),
    }
}

/// Presets use the HF tensor layout, hence [`RopeStyle::Neox`]; configs read from GGUF `llama`
/// files say [`RopeStyle::Interleaved`] instead.
impl ModelConfig {
    /// A 2-layer random-weight model small enough for unit tests (d 64, 4 q / 2 kv heads × 16).
    pub fn tiny_llama_for_tests() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 128,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_attention_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-5,
            rope: neox_rope(10_000.0),
            max_position_embeddings: 256,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            attention_scale: None,
        }
    }

    /// SmolLM2-135M-Instruct: 30 layers, d 576, 9 q / 3 kv heads × 64, tied embeddings.
    pub fn smollm2_135m() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 49_152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_attention_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope: neox_rope(100_000.0),
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            attention_scale: None,
        }
    }

    /// Qwen2.5-Coder-0.5B-Instruct: 24 layers, d 896, 14 q / 2 kv heads × 64.
    pub fn qwen2_5_coder_0_5b() -> Self {
        Self {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_layers: 24,
            num_attention_heads: 14,
            num_kv_heads: 2,
            head_dim: 64,
            tie_word_embeddings: true,
            ..Self::qwen2_base()
        }
    }

    /// Qwen2.5-Coder-1.5B-Instruct: 28 layers, d 1536, 12 q / 2 kv heads × 128.
    pub fn qwen2_5_coder_1_5b() -> Self {
        Self {
            vocab_size: 151_936,
            hidden_size: 1536,
            intermediate_size: 8960,
            num_layers: 28,
            num_attention_heads: 12,
            num_kv_heads: 2,
            head_dim: 128,
            tie_word_embeddings: true,
            ..Self::qwen2_base()
        }
    }

    /// Qwen2.5-7B: 28 layers, d 3584, 28 q / 4 kv heads × 128, untied.
    pub fn qwen2_5_7b() -> Self {
        Self {
            vocab_size: 152_064,
            hidden_size: 3584,
            intermediate_size: 18_944,
            num_layers: 28,
            num_attention_heads: 28,
            num_kv_heads: 4,
            head_dim: 128,
            tie_word_embeddings: false,
            ..Self::qwen2_base()
        }
    }

    /// Qwen3-8B: 36 layers, d 4096, 32 q / 8 kv heads × 128, q/k norm, untied, vocab 151936
    /// (its `config.json`).
    pub fn qwen3_8b() -> Self {
        Self {
            architecture: Architecture::Qwen3,
            vocab_size: 151_936,
            hidden_size: 4096,
            intermediate_size: 12_288,
            num_layers: 36,
            num_attention_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            max_position_embeddings: 40_960,
            tie_word_embeddings: false,
            attention_bias: false,
            ..Self::qwen2_base()
        }
    }

    /// Mistral-7B-v0.1: 32 layers, d 4096, 32 q / 8 kv heads × 128, every layer attending over
    /// a 4096-token window, 32k positions, vocab 32,000, untied (its `config.json`).
    pub fn mistral_7b() -> Self {
        Self {
            architecture: Architecture::Mistral,
            vocab_size: 32_000,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_attention_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope: neox_rope(10_000.0),
            max_position_embeddings: 32_768,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: Some(SlidingWindow::every_layer(4096, 32)),
            attention_scale: None,
        }
    }

    /// Gemma-3-270M: 18 layers, d 640, 4 q / 1 kv head × 256, a 512-token window on 5 of 6
    /// layers, vocab 262,144, 32k context, tied (its `config.json`).
    pub fn gemma3_270m() -> Self {
        Self::gemma3(262_144, 640, 2048, 18, (4, 1), 512, 32_768, None)
    }

    /// Gemma-3-4B's text model: 34 layers, d 2560, 8 q / 4 kv heads × 256, a 1024-token window
    /// on 5 of 6 layers, linear RoPE scaling ×8 on the full layers, vocab 262,208, 128k
    /// context, tied (its `config.json`).
    pub fn gemma3_4b() -> Self {
        let scaling = Some(RopeScaling::Linear { factor: 8.0 });
        Self::gemma3(262_208, 2560, 10_240, 34, (8, 4), 1024, 131_072, scaling)
    }

    /// A Gemma-3 text model of the given shape (head width 256, `query_pre_attn_scalar` 256,
    /// local RoPE base 1e4 without scaling, global 1e6 with `scaling`, every sixth layer full).
    #[allow(clippy::too_many_arguments)]
    fn gemma3(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_layers: usize,
        (num_attention_heads, num_kv_heads): (usize, usize),
        window_tokens: usize,
        max_position_embeddings: usize,
        scaling: Option<RopeScaling>,
    ) -> Self {
        Self {
            architecture: Architecture::Gemma3,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_attention_heads,
            num_kv_heads,
            head_dim: 256,
            rms_norm_eps: 1e-6,
            rope: RopeConfig {
                scaling,
                ..neox_rope(1_000_000.0)
            },
            max_position_embeddings,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: Some(2),
            eos_token_ids: vec![1, 106],
            sliding_window: Some(SlidingWindow {
                tokens: window_tokens,
                layers: (0..num_layers).map(|i| (i + 1) % 6 != 0).collect(),
                rope: Some(neox_rope(10_000.0)),
            }),
            attention_scale: Some(1.0 / 16.0),
        }
    }

    /// Llama-2-7B: 32 layers, d 4096, 32 heads × 128 (MHA), 4k context.
    pub fn llama2_7b() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 32_000,
            hidden_size: 4096,
            intermediate_size: 11_008,
            num_layers: 32,
            num_attention_heads: 32,
            num_kv_heads: 32,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope: neox_rope(10_000.0),
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            attention_scale: None,
        }
    }

    /// LongChat-7B-v1.5-32k: Llama-2-7B shapes with linear RoPE scaling ×8 to 32k context.
    pub fn longchat_7b_32k() -> Self {
        let mut config = Self::llama2_7b();
        config.rope.scaling = Some(RopeScaling::Linear { factor: 8.0 });
        config.max_position_embeddings = 32_768;
        config
    }

    /// Llama-3-8B: 32 layers, d 4096, 32 q / 8 kv heads × 128, vocab 128256.
    pub fn llama3_8b() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_attention_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope: neox_rope(500_000.0),
            max_position_embeddings: 8192,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: Some(128_000),
            // <|end_of_text|> and the instruct models' <|eot_id|>.
            eos_token_ids: vec![128_001, 128_009],
            sliding_window: None,
            attention_scale: None,
        }
    }

    /// Fields shared by the Qwen2.5 and Qwen3 presets; shapes are filled in by each preset.
    fn qwen2_base() -> Self {
        Self {
            architecture: Architecture::Qwen2,
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_layers: 0,
            num_attention_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            rms_norm_eps: 1e-6,
            rope: neox_rope(1_000_000.0),
            max_position_embeddings: 32_768,
            tie_word_embeddings: false,
            attention_bias: true,
            // <|endoftext|>, declared as BOS though Qwen prompts do not start with it; it and
            // <|im_end|> both end generation.
            bos_token_id: Some(151_643),
            eos_token_ids: vec![151_645, 151_643],
            sliding_window: None,
            attention_scale: None,
        }
    }
}

pub(super) fn neox_rope(theta: f32) -> RopeConfig {
    RopeConfig {
        theta,
        style: RopeStyle::Neox,
        scaling: None,
    }
}
