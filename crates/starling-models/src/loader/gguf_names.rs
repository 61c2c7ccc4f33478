//! llama.cpp tensor names → canonical HF names (see [`super::weight_names`]).

use super::weight_names::{LayerTensor, EMBED_TOKENS, FINAL_NORM, LM_HEAD};
use crate::Architecture;

/// The llama.cpp name of the per-dimension RoPE divisors (Llama 3.1 scaling), which becomes
/// part of the config rather than a weight.
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// The canonical name of GGUF tensor `name` in a file of `architecture`, or `None` when the name
/// is not one Starling knows. llama.cpp's `ffn_norm` is the MLP's input norm everywhere, which
/// HF calls `post_attention_layernorm` in Llama-style models and `pre_feedforward_layernorm` in
/// Gemma (whose `post_attention_layernorm` is llama.cpp's `post_attention_norm`).
pub(crate) fn canonical_name(name: &str, architecture: Architecture) -> Option<String> {
    let sandwich = architecture.has_sandwich_norms();
    match name {
        "token_embd.weight" => return Some(EMBED_TOKENS.to_owned()),
        "output_norm.weight" => return Some(FINAL_NORM.to_owned()),
        "output.weight" => return Some(LM_HEAD.to_owned()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let tensor = match suffix {
        "attn_norm.weight" => LayerTensor::InputNorm,
        "attn_q.weight" => LayerTensor::QProj,
        "attn_q.bias" => LayerTensor::QBias,
        "attn_k.weight" => LayerTensor::KProj,
        "attn_k.bias" => LayerTensor::KBias,
        "attn_v.weight" => LayerTensor::VProj,
        "attn_v.bias" => LayerTensor::VBias,
        "attn_q_norm.weight" => LayerTensor::QNorm,
        "attn_k_norm.weight" => LayerTensor::KNorm,
        "attn_output.weight" => LayerTensor::OProj,
        "ffn_norm.weight" if sandwich => LayerTensor::PreFeedforwardNorm,
        "ffn_norm.weight" => LayerTensor::PostAttentionNorm,
        "post_attention_norm.weight" if sandwich => LayerTensor::PostAttentionNorm,
        "post_ffw_norm.weight" if sandwich => LayerTensor::PostFeedforwardNorm,
        "ffn_gate.weight" => LayerTensor::GateProj,
        "ffn_up.weight" => LayerTensor::UpProj,
        "ffn_down.weight" => LayerTensor::DownProj,
        _ => return None,
    };
    Some(tensor.name(layer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_norms_map_to_hf_gemma_names() {
        let gemma = |n| canonical_name(n, Architecture::Gemma3);
        let layer = |t: &str| Some(format!("model.layers.4.{t}"));
        assert_eq!(
            gemma("blk.4.ffn_norm.weight"),
            layer("pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            gemma("blk.4.post_attention_norm.weight"),
            layer("post_attention_layernorm.weight")
        );
        assert_eq!(
            gemma("blk.4.post_ffw_norm.weight"),
            layer("post_feedforward_layernorm.weight")
        );
        // Not a Llama tensor.
        assert_eq!(
            canonical_name("blk.4.post_ffw_norm.weight", Architecture::Llama),
            None
        );
    }

    #[test]
    fn maps_global_and_layer_tensors() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_norm.weight",
                "model.layers.0.input_layernorm.weight",
            ),
            (
                "blk.12.attn_q.bias",
                "model.layers.12.self_attn.q_proj.bias",
            ),
            (
                "blk.3.attn_output.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            (
                "blk.3.ffn_norm.weight",
                "model.layers.3.post_attention_layernorm.weight",
            ),
            (
                "blk.0.attn_q_norm.weight",
                "model.layers.0.self_attn.q_norm.weight",
            ),
            (
                "blk.7.attn_k_norm.weight",
                "model.layers.7.self_attn.k_norm.weight",
            ),
            (
                "blk.29.ffn_down.weight",
                "model.layers.29.mlp.down_proj.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(
                canonical_name(gguf, Architecture::Qwen2).as_deref(),
                Some(hf),
                "{gguf}"
            );
        }
    }

    #[test]
    fn unknown_names_are_not_mapped() {
        for name in [
            "blk.x.attn_q.weight",
            "blk.0.attn_q_norm.bias",
            "rope_freqs.weight",
        ] {
            assert_eq!(canonical_name(name, Architecture::Llama), None, "{name}");
        }
    }
}
