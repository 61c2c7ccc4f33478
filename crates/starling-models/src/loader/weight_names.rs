//! The canonical (Hugging Face `LlamaForCausalLM` / `Qwen2ForCausalLM`) tensor names and the
//! shapes a [`ModelConfig`] implies for them. Every loader produces these names, so the
//! forward pass is written once against them. Matrices are `[out_features, in_features]`.

use crate::ModelConfig;

/// Token embedding matrix, `[vocab_size, hidden_size]`.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// Final RMSNorm weight, `[hidden_size]`.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Output projection, `[vocab_size, hidden_size]`; absent when embeddings are tied.
pub const LM_HEAD: &str = "lm_head.weight";

/// One tensor of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerTensor {
    /// RMSNorm before attention, `[hidden]`.
    InputNorm,
    /// Query projection, `[q_size, hidden]`.
    QProj,
    /// Query bias, `[q_size]` (only with `attention_bias`).
    QBias,
    /// Key projection, `[kv_size, hidden]`.
    KProj,
    /// Key bias, `[kv_size]` (only with `attention_bias`).
    KBias,
    /// Value projection, `[kv_size, hidden]`.
    VProj,
    /// Value bias, `[kv_size]` (only with `attention_bias`).
    VBias,
    /// RMSNorm weight of every query head, `[head_dim]` (only with q/k norm: Qwen3).
    QNorm,
    /// RMSNorm weight of every key head, `[head_dim]` (only with q/k norm: Qwen3).
    KNorm,
    /// Attention output projection, `[hidden, q_size]`.
    OProj,
    /// RMSNorm before the MLP, `[hidden]`; with sandwich norms (Gemma) the norm of the
    /// attention output instead (HF names them alike).
    PostAttentionNorm,
    /// RMSNorm before the MLP, `[hidden]` (only with sandwich norms: Gemma).
    PreFeedforwardNorm,
    /// RMSNorm of the MLP output, `[hidden]` (only with sandwich norms: Gemma).
    PostFeedforwardNorm,
    /// MLP gate projection, `[intermediate, hidden]`.
    GateProj,
    /// MLP up projection, `[intermediate, hidden]`.
    UpProj,
    /// MLP down projection, `[hidden, intermediate]`.
    DownProj,
}

impl LayerTensor {
    /// Every layer tensor, in checkpoint order.
    pub const ALL: [LayerTensor; 16] = [
        Self::InputNorm,
        Self::QProj,
        Self::QBias,
        Self::KProj,
        Self::KBias,
        Self::VProj,
        Self::VBias,
        Self::QNorm,
        Self::KNorm,
        Self::OProj,
        Self::PostAttentionNorm,
        Self::PreFeedforwardNorm,
        Self::GateProj,
        Self::UpProj,
        Self::DownProj,
        Self::PostFeedforwardNorm,
    ];

    /// The name's part after `model.layers.{layer}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::InputNorm => "input_layernorm.weight",
            Self::QProj => "self_attn.q_proj.weight",
            Self::QBias => "self_attn.q_proj.bias",
            Self::KProj => "self_attn.k_proj.weight",
            Self::KBias => "self_attn.k_proj.bias",
            Self::VProj => "self_attn.v_proj.weight",
            Self::VBias => "self_attn.v_proj.bias",
            Self::QNorm => "self_attn.q_norm.weight",
            Self::KNorm => "self_attn.k_norm.weight",
            Self::OProj => "self_attn.o_proj.weight",
            Self::PostAttentionNorm => "post_attention_layernorm.weight",
            Self::PreFeedforwardNorm => "pre_feedforward_layernorm.weight",
            Self::PostFeedforwardNorm => "post_feedforward_layernorm.weight",
            Self::GateProj => "mlp.gate_proj.weight",
            Self::UpProj => "mlp.up_proj.weight",
            Self::DownProj => "mlp.down_proj.weight",
        }
    }

    /// The full canonical name of this tensor in `layer`.
    pub fn name(self, layer: usize) -> String {
        format!("model.layers.{layer}.{}", self.suffix())
    }

    /// Whether a model with `config` has this tensor.
    pub fn is_present(self, config: &ModelConfig) -> bool {
        match self {
            Self::QBias | Self::KBias | Self::VBias => config.attention_bias,
            Self::QNorm | Self::KNorm => config.architecture.has_qk_norm(),
            Self::PreFeedforwardNorm | Self::PostFeedforwardNorm => {
                config.architecture.has_sandwich_norms()
            }
            _ => true,
        }
    }

    /// The shape `config` implies for this tensor.
    pub fn shape(self, config: &ModelConfig) -> Vec<usize> {
        let hidden = config.hidden_size;
        let ffn = config.intermediate_size;
        match self {
            Self::InputNorm
            | Self::PostAttentionNorm
            | Self::PreFeedforwardNorm
            | Self::PostFeedforwardNorm => vec![hidden],
            Self::QProj => vec![config.q_size(), hidden],
            Self::QBias => vec![config.q_size()],
            Self::KProj | Self::VProj => vec![config.kv_size(), hidden],
            Self::KBias | Self::VBias => vec![config.kv_size()],
            Self::QNorm | Self::KNorm => vec![config.head_dim],
            Self::OProj => vec![hidden, config.q_size()],
            Self::GateProj | Self::UpProj => vec![ffn, hidden],
            Self::DownProj => vec![hidden, ffn],
        }
    }

    /// Whether this tensor is an RMSNorm weight (initialised to ones, not noise).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Self::InputNorm
                | Self::PostAttentionNorm
                | Self::PreFeedforwardNorm
                | Self::PostFeedforwardNorm
                | Self::QNorm
                | Self::KNorm
        )
    }
}

/// Every tensor `config` implies, with its shape, in checkpoint order.
pub fn expected_weight_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    expected_weights(config).collect()
}

/// [`expected_weight_shapes`], lazily: checks stop at the first problem instead of first
/// listing every layer a (possibly corrupt) config claims.
pub(crate) fn expected_weights(
    config: &ModelConfig,
) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
    let vocab_by_hidden = vec![config.vocab_size, config.hidden_size];
    let embed = (EMBED_TOKENS.to_owned(), vocab_by_hidden.clone());
    let layers = (0..config.num_layers).flat_map(move |layer| {
        LayerTensor::ALL
            .into_iter()
            .filter(move |tensor| tensor.is_present(config))
            .map(move |tensor| (tensor.name(layer), tensor.shape(config)))
    });
    let norm = (FINAL_NORM.to_owned(), vec![config.hidden_size]);
    let lm_head = (!config.tie_word_embeddings).then(|| (LM_HEAD.to_owned(), vocab_by_hidden));
    std::iter::once(embed)
        .chain(layers)
        .chain(std::iter::once(norm))
        .chain(lm_head)
}

/// Number of parameters `config` implies, computed from shapes without naming every tensor.
pub(crate) fn expected_num_params(config: &ModelConfig) -> u64 {
    let numel = |shape: Vec<usize>| shape.iter().map(|&d| d as u64).product::<u64>();
    let per_layer: u64 = LayerTensor::ALL
        .into_iter()
        .filter(|tensor| tensor.is_present(config))
        .map(|tensor| numel(tensor.shape(config)))
        .sum();
    let embedding = config.vocab_size as u64 * config.hidden_size as u64;
    let lm_head = if config.tie_word_embeddings {
        0
    } else {
        embedding
    };
    embedding + per_layer * config.num_layers as u64 + config.hidden_size as u64 + lm_head
}

/// Whether the canonical tensor `name` is an RMSNorm weight.
pub fn is_norm_weight(name: &str) -> bool {
    name == FINAL_NORM
        || name.ends_with("layernorm.weight")
        || name.ends_with("self_attn.q_norm.weight")
        || name.ends_with("self_attn.k_norm.weight")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn biases_and_lm_head_follow_the_config() {
        let mut config = ModelConfig::tiny_llama_for_tests();
        let names: Vec<String> = expected_weight_shapes(&config)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.len(), 1 + 2 * 9 + 2);
        assert!(names.contains(&LM_HEAD.to_owned()));
        assert!(!names.iter().any(|n| n.ends_with(".bias")));

        config.attention_bias = true;
        config.tie_word_embeddings = true;
        let shapes = expected_weight_shapes(&config);
        assert_eq!(shapes.len(), 1 + 2 * 12 + 1);
        assert!(!shapes.iter().any(|(n, _)| n == LM_HEAD));
        let k_bias = shapes
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.k_proj.bias")
            .unwrap();
        assert_eq!(k_bias.1, vec![32]);
    }

    #[test]
    fn parameter_count_agrees_with_the_listed_shapes() {
        let mut config = ModelConfig::tiny_llama_for_tests();
        for (bias, tie) in [(false, false), (true, true), (true, false)] {
            config.attention_bias = bias;
            config.tie_word_embeddings = tie;
            let listed: u64 = expected_weight_shapes(&config)
                .iter()
                .map(|(_, shape)| shape.iter().product::<usize>() as u64)
                .sum();
            assert_eq!(
                expected_num_params(&config),
                listed,
                "bias {bias} tie {tie}"
            );
        }
    }

    #[test]
    fn matrices_are_out_by_in() {
        let config = ModelConfig::tiny_llama_for_tests();
        assert_eq!(LayerTensor::KProj.shape(&config), vec![32, 64]);
        assert_eq!(LayerTensor::OProj.shape(&config), vec![64, 64]);
        assert_eq!(LayerTensor::DownProj.shape(&config), vec![64, 128]);
        assert!(is_norm_weight(&LayerTensor::PostAttentionNorm.name(0)));
        assert!(!is_norm_weight(&LayerTensor::QProj.name(0)));
        assert!(is_norm_weight(&LayerTensor::KNorm.name(3)));
    }

    #[test]
    fn qwen3_layers_have_head_norms_and_no_biases() {
        let mut config = ModelConfig::tiny_llama_for_tests();
        config.architecture = crate::Architecture::Qwen3;
        let shapes = expected_weight_shapes(&config);
        assert_eq!(shapes.len(), 1 + 2 * 11 + 2);
        let q_norm = shapes
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.q_norm.weight")
            .unwrap();
        assert_eq!(q_norm.1, vec![16]);
        assert!(!shapes.iter().any(|(n, _)| n.ends_with(".bias")));
    }
}
