//! Model hyper-parameters: the shapes a checkpoint has and how positions are encoded, plus
//! presets of real model shapes (for synthetic-weight runs) and RoPE frequency tables.

use serde::{Deserialize, Serialize};

use crate::loader::weight_names::expected_num_params;
use crate::ModelError;

mod presets;
pub use presets::{preset, PRESET_NAMES};

/// The decoder families Starling implements. All are pre-norm RMSNorm + GQA + SwiGLU
/// decoders; they differ in Q/K/V biases, per-head Q/K norms and the RoPE layout of their GGUF
/// exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, LongChat and other `LlamaForCausalLM` models.
    Llama,
    /// Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): Q/K/V projections carry biases.
    Qwen2,
    /// Qwen3 (`Qwen3ForCausalLM`): no Q/K/V biases; an RMSNorm over each query and key head
    /// (`q_norm`, `k_norm`, one `[head_dim]` weight each per layer) before RoPE.
    Qwen3,
    /// Mistral (`MistralForCausalLM`, HF directories): the Llama layout, whose attention may be
    /// limited on every layer to a sliding window of the most recent `sliding_window` tokens
    /// ([`SlidingWindow`]). (Mistral GGUF files say `llama` and load as Llama.)
    Mistral,
    /// Gemma-3 (`Gemma3ForCausalLM`, the text model; GGUF `gemma3`): per-head q/k norms, a
    /// sliding window on most layers with its own RoPE base, embeddings scaled by
    /// `sqrt(hidden_size)`, four RMSNorms a layer (after attention and after the MLP too), a
    /// GeGLU MLP (tanh-approximated GELU), RMSNorms that scale by `1 + weight` (HF stores the
    /// offset; loaders add the one, GGUF files already hold it).
    Gemma3,
}

/// The MLP's gating activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpActivation {
    /// SiLU (SwiGLU): Llama, Qwen, Mistral.
    Silu,
    /// GELU, tanh approximation (GeGLU, HF `gelu_pytorch_tanh`): Gemma.
    GeluTanh,
}

impl Architecture {
    /// The name used by GGUF `general.architecture` and HF `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Mistral => "mistral",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The MLP's gating activation.
    pub fn mlp_activation(self) -> MlpActivation {
        match self {
            Self::Gemma3 => MlpActivation::GeluTanh,
            _ => MlpActivation::Silu,
        }
    }

    /// Whether each layer also normalises the attention output and the MLP output before adding
    /// them to the residual stream (Gemma's "sandwich" norms: `post_attention_layernorm`,
    /// `post_feedforward_layernorm`; the MLP's input norm is then `pre_feedforward_layernorm`).
    pub fn has_sandwich_norms(self) -> bool {
        matches!(self, Self::Gemma3)
    }

    /// The factor the token embeddings are multiplied by on the way in (`sqrt(hidden)` for
    /// Gemma; the tied LM head uses the unscaled matrix).
    pub fn embedding_scale(self, hidden_size: usize) -> Option<f32> {
        matches!(self, Self::Gemma3).then(|| (hidden_size as f32).sqrt())
    }

    /// Whether HF checkpoints store RMSNorm weights as offsets from one (`x * (1 + w)`): the
    /// HF loader adds the one, so every backend scales by the stored weight alone.
    pub fn hf_norm_weights_are_offsets(self) -> bool {
        matches!(self, Self::Gemma3)
    }

    /// Whether every layer normalises each query and key head (RMSNorm over `head_dim`) before
    /// RoPE.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Gemma3)
    }
}

/// Which pairs of a head's dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1), GPT-J / original Llama layout. GGUF `llama` weights need this:
    /// llama.cpp's converter permuted the Q/K rows so that this rotation on the stored weights
    /// equals HF's `rotate_half` on the original ones.
    Interleaved,
    /// Halves (i, i + head_dim/2), HF `rotate_half` / GPT-NeoX layout.
    Neox,
}

/// How RoPE frequencies are stretched beyond the training context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Position interpolation: every inverse frequency divided by `factor`.
    Linear {
        /// The stretch factor.
        factor: f32,
    },
    /// Llama 3.1 scaling (HF `rope_type = "llama3"`): low frequencies divided by `factor`,
    /// high frequencies kept, a smooth blend in between.
    Llama3 {
        /// Divisor applied to the low frequencies.
        factor: f32,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f32,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// One divisor per rotated pair, as llama.cpp stores Llama 3.1 scaling in a `rope_freqs`
    /// tensor: `inv_freq[i] / factors[i]`.
    PerDimFactors(Vec<f32>),
}

/// Rotary position embedding parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    /// The base of the geometric frequency series (`rope_theta`).
    pub theta: f32,
    /// Which dimensions are rotated together.
    pub style: RopeStyle,
    /// Optional context-extension scaling.
    pub scaling: Option<RopeScaling>,
}

/// The hyper-parameters of a decoder-only transformer, as the forward pass needs them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Decoder family.
    pub architecture: Architecture,
    /// Rows of the embedding matrix (and width of the logits).
    pub vocab_size: usize,
    /// Model (residual stream) width.
    pub hidden_size: usize,
    /// Width of the MLP's gate/up projections.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (GQA groups).
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Rotary embedding parameters.
    pub rope: RopeConfig,
    /// The longest context the model supports.
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the embedding matrix (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// Whether the Q/K/V projections have biases.
    pub attention_bias: bool,
    /// The beginning-of-sequence token the checkpoint declares. Whether prompts start with it
    /// is the tokenizer's decision (GGUF `tokenizer.ggml.add_bos_token`), not implied here.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Layers whose attention sees only the most recent keys (Mistral, Gemma-3); `None`: every
    /// layer attends over the whole context.
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// The softmax scale when it is not `1 / sqrt(head_dim)` (Gemma-3:
    /// `query_pre_attn_scalar^-0.5`).
    #[serde(default)]
    pub attention_scale: Option<f32>,
}

/// Sliding-window attention: which layers use it, how far back they see, and their RoPE.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlidingWindow {
    /// Keys a windowed layer's query attends to: its own and the `tokens - 1` before it
    /// (HF's `sliding_window`).
    pub tokens: usize,
    /// Whether each layer (in order, one entry per layer) is windowed.
    pub layers: Vec<bool>,
    /// The windowed layers' own RoPE when it differs from the model's (Gemma-3's local base
    /// 10,000 against 1,000,000, and no long-context scaling); `None`: the model's.
    #[serde(default)]
    pub rope: Option<RopeConfig>,
}

impl SlidingWindow {
    /// Every one of `num_layers` layers windowed at `tokens` (Mistral).
    pub fn every_layer(tokens: usize, num_layers: usize) -> Self {
        Self {
            tokens,
            layers: vec![true; num_layers],
            rope: None,
        }
    }
}

impl ModelConfig {
    /// Width of the concatenated query heads.
    pub fn q_size(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// How many query heads share one key/value head.
    pub fn num_queries_per_kv(&self) -> usize {
        self.num_attention_heads / self.num_kv_heads.max(1)
    }

    /// The window layer `index` attends over, `None` for a full-attention layer.
    pub fn layer_window_tokens(&self, index: usize) -> Option<usize> {
        let window = self.sliding_window.as_ref()?;
        window
            .layers
            .get(index)
            .copied()
            .unwrap_or(false)
            .then_some(window.tokens)
    }

    /// The softmax scale of every layer's attention.
    pub fn attention_softmax_scale(&self) -> f32 {
        self.attention_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// The RoPE layer `index` rotates with: a windowed layer's own when the window has one.
    pub fn layer_rope(&self, index: usize) -> &RopeConfig {
        match (&self.sliding_window, self.layer_window_tokens(index)) {
            (
                Some(SlidingWindow {
                    rope: Some(rope), ..
                }),
                Some(_),
            ) => rope,
            _ => &self.rope,
        }
    }

    /// Whether every layer is windowed (then a sequence's blocks that fall out of the window
    /// can be released: no layer reads them again).
    pub fn every_layer_windowed(&self) -> bool {
        (0..self.num_layers).all(|i| self.layer_window_tokens(i).is_some())
    }

    /// Number of parameters implied by the shapes (every tensor the config implies).
    pub fn num_params(&self) -> u64 {
        expected_num_params(self)
    }

    /// Bytes of uncompressed K and V one token occupies in one layer's cache.
    pub fn kv_bytes_per_token_per_layer(&self, dtype_bytes: usize) -> usize {
        2 * self.kv_size() * dtype_bytes
    }

    /// Bytes of uncompressed K and V one token occupies across all layers.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        self.kv_bytes_per_token_per_layer(dtype_bytes) * self.num_layers
    }

    /// Checks the config is internally consistent (sizes positive, heads divide, RoPE sane).
    pub fn validate(&self) -> Result<(), ModelError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in sizes {
            if value == 0 {
                return Err(invalid(format!("{field} must be positive")));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads) {
            return Err(invalid(format!(
                "num_attention_heads {} is not a multiple of num_kv_heads {}",
                self.num_attention_heads, self.num_kv_heads
            )));
        }
        // RoPE rotates dimension pairs.
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(format!("head_dim {} must be even", self.head_dim)));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(format!(
                "rms_norm_eps {} must be positive",
                self.rms_norm_eps
            )));
        }
        if let Some(scale) = self.attention_scale {
            if !is_positive(scale) {
                return Err(invalid(format!("attention scale {scale} must be positive")));
            }
        }
        if let Some(window) = &self.sliding_window {
            if let Some(rope) = &window.rope {
                validate_rope(rope, self.head_dim)?;
            }
            if window.tokens == 0 {
                return Err(invalid("sliding window of 0 tokens".into()));
            }
            if window.layers.len() != self.num_layers {
                return Err(invalid(format!(
                    "sliding window names {} layers of {}",
                    window.layers.len(),
                    self.num_layers
                )));
            }
        }
        validate_rope(&self.rope, self.head_dim)
    }
}

fn invalid(message: String) -> ModelError {
    ModelError::InvalidConfig(message)
}

fn is_positive(value: f32) -> bool {
    value.is_finite() && value > 0.0
}

fn validate_rope(rope: &RopeConfig, head_dim: usize) -> Result<(), ModelError> {
    if !is_positive(rope.theta) {
        return Err(invalid(format!(
            "rope theta {} must be positive",
            rope.theta
        )));
    }
    match &rope.scaling {
        None => Ok(()),
        Some(RopeScaling::Linear { factor }) if is_positive(*factor) => Ok(()),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) if is_positive(*factor)
            && is_positive(*low_freq_factor)
            && high_freq_factor > low_freq_factor
            && high_freq_factor.is_finite()
            && *original_max_position_embeddings > 0 =>
        {
            Ok(())
        }
        Some(RopeScaling::PerDimFactors(factors))
            if factors.len() == head_dim / 2 && factors.iter().all(|&f| is_positive(f)) =>
        {
            Ok(())
        }
        Some(scaling) => Err(invalid(format!(
            "rope scaling {scaling:?} is inconsistent (factors must be positive, \
             high_freq_factor > low_freq_factor, one per-dim factor per rotated pair)"
        ))),
    }
}

/// The inverse frequencies `1 / theta^(2i / head_dim)` for `i in 0..head_dim/2`, with the
/// config's scaling applied exactly as HF `transformers` does (`_compute_llama3_parameters`
/// for Llama 3, division by the factor for linear scaling).
pub fn rope_inv_freqs(rope: &RopeConfig, head_dim: usize) -> Vec<f32> {
    let base = f64::from(rope.theta);
    let unscaled = (0..head_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f64 / head_dim as f64));
    match &rope.scaling {
        None => unscaled.map(|f| f as f32).collect(),
        Some(RopeScaling::Linear { factor }) => {
            unscaled.map(|f| (f / f64::from(*factor)) as f32).collect()
        }
        Some(RopeScaling::PerDimFactors(factors)) => unscaled
            .zip(factors)
            .map(|(f, &factor)| (f / f64::from(factor)) as f32)
            .collect(),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let factor = f64::from(*factor);
            let low = f64::from(*low_freq_factor);
            let high = f64::from(*high_freq_factor);
            let old_context = *original_max_position_embeddings as f64;
            let low_freq_wavelen = old_context / low;
            let high_freq_wavelen = old_context / high;
            unscaled
                .map(|inv_freq| {
                    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
                    let scaled = if wavelen < high_freq_wavelen {
                        inv_freq
                    } else if wavelen > low_freq_wavelen {
                        inv_freq / factor
                    } else {
                        let smooth = (old_context / wavelen - low) / (high - low);
                        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                    };
                    scaled as f32
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::presets::neox_rope;
    use super::*;

    #[test]
    fn every_preset_is_valid_and_reachable_by_name() {
        for name in PRESET_NAMES {
            let config = preset(name).unwrap();
            config.validate().unwrap();
        }
        assert!(preset("gpt-5").is_err());
    }

    #[test]
    fn derived_sizes_follow_the_shapes() {
        let config = ModelConfig::llama3_8b();
        assert_eq!(config.q_size(), 4096);
        assert_eq!(config.kv_size(), 1024);
        assert_eq!(config.num_queries_per_kv(), 4);
        // K and V, 8 heads × 128, 2 bytes each.
        assert_eq!(config.kv_bytes_per_token_per_layer(2), 4096);
        assert_eq!(config.kv_bytes_per_token(2), 4096 * 32);
    }

    #[test]
    fn parameter_counts_match_published_sizes() {
        // Published: Llama-2-7B 6.74B, Llama-3-8B 8.03B, Qwen2.5-7B 7.62B, SmolLM2 134.5M,
        // Qwen3-8B 8.19B (q/k norms included).
        let cases = [
            (ModelConfig::llama2_7b(), 6_738_415_616_u64),
            (ModelConfig::llama3_8b(), 8_030_261_248),
            (ModelConfig::qwen2_5_7b(), 7_615_616_512),
            (ModelConfig::smollm2_135m(), 134_515_008),
            (ModelConfig::qwen3_8b(), 8_190_735_360),
        ];
        for (config, expected) in cases {
            assert_eq!(config.num_params(), expected, "{config:?}");
        }
    }

    #[test]
    fn validate_rejects_inconsistent_heads_and_rope() {
        let mut config = ModelConfig::tiny_llama_for_tests();
        config.num_kv_heads = 3;
        assert!(matches!(
            config.validate(),
            Err(ModelError::InvalidConfig(m)) if m.contains("num_kv_heads")
        ));

        let mut config = ModelConfig::tiny_llama_for_tests();
        config.head_dim = 15;
        assert!(config.validate().is_err());

        let mut config = ModelConfig::tiny_llama_for_tests();
        config.rope.scaling = Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        assert!(config.validate().is_err());

        let mut config = ModelConfig::tiny_llama_for_tests();
        config.rope.scaling = Some(RopeScaling::PerDimFactors(vec![1.0; 3]));
        assert!(config.validate().is_err());
    }

    #[test]
    fn unscaled_inv_freqs_are_a_geometric_series() {
        let rope = neox_rope(10_000.0);
        let freqs = rope_inv_freqs(&rope, 8);
        let expected = [1.0, 0.1, 0.01, 0.001];
        assert_eq!(freqs.len(), 4);
        for (got, want) in freqs.iter().zip(expected) {
            assert!((got - want).abs() < 1e-7 * want.max(1.0), "{got} vs {want}");
        }
    }

    #[test]
    fn linear_and_per_dim_scaling_divide_the_frequencies() {
        let mut rope = neox_rope(10_000.0);
        rope.scaling = Some(RopeScaling::Linear { factor: 4.0 });
        assert_eq!(rope_inv_freqs(&rope, 4), vec![0.25, 0.0025]);
        rope.scaling = Some(RopeScaling::PerDimFactors(vec![2.0, 10.0]));
        assert_eq!(rope_inv_freqs(&rope, 4), vec![0.5, 0.001]);
    }

    /// Llama 3.1 scaling (factor 8, low 1, high 4, original context 8192; so wavelengths below
    /// 2048 are kept, above 8192 divided by 8) on a head_dim-8 table with theta 500000:
    /// inv_freq = [1, 500000^-0.25, 500000^-0.5, 500000^-0.75]
    ///          = [1, 0.037606030, 0.0014142136, 0.0000531830],
    /// wavelength 2π/f = [6.28, 167.08, 4442.88, 118142.8].
    /// Pairs 0 and 1 are high-frequency (kept), pair 3 is low-frequency (÷8), and pair 2 is in
    /// between: smooth = (8192/4442.883 - 1) / 3 = 0.2812826, so
    /// f = (1 - smooth) · f/8 + smooth · f = 0.0014142136 · (0.7187174/8 + 0.2812826)
    ///   = 0.00052484616.
    #[test]
    fn llama3_scaling_matches_a_hand_computed_table() {
        let rope = RopeConfig {
            theta: 500_000.0,
            style: RopeStyle::Neox,
            scaling: Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
        };
        let freqs = rope_inv_freqs(&rope, 8);
        let expected = [1.0, 0.037_606_03, 0.000_524_846_2, 0.000_053_183 / 8.0];
        for (i, (got, want)) in freqs.iter().zip(expected).enumerate() {
            let relative_error = ((got - want) / want).abs();
            assert!(relative_error < 1e-5, "pair {i}: {got} vs {want}");
        }
    }
}
