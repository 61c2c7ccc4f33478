//! Building a [`ModelConfig`] from GGUF metadata (llama.cpp's `{arch}.*` keys) and the tensor
//! directory (which says whether there is an LM head and Q/K/V biases).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::gguf_header::GgufTensorInfo;
use crate::{
    Architecture, ModelConfig, ModelError, RopeConfig, RopeScaling, RopeStyle, SlidingWindow,
};

/// llama.cpp's default when `{arch}.rope.freq_base` is absent.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;

/// Read-only typed access to GGUF metadata with key-naming errors.
pub(crate) struct Metadata<'a> {
    values: &'a HashMap<String, Value>,
}

impl<'a> Metadata<'a> {
    /// Wraps a metadata table.
    pub(crate) fn new(values: &'a HashMap<String, Value>) -> Self {
        Self { values }
    }

    fn wrong_type(key: &str, value: &Value, expected: &str) -> ModelError {
        ModelError::InvalidConfig(format!(
            "metadata `{key}` is a {:?}, expected {expected}",
            value.value_type()
        ))
    }

    /// A non-negative integer of any width, if present.
    pub(crate) fn usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        let number = match value {
            Value::U8(v) => Some(u64::from(*v)),
            Value::U16(v) => Some(u64::from(*v)),
            Value::U32(v) => Some(u64::from(*v)),
            Value::U64(v) => Some(*v),
            Value::I8(v) => u64::try_from(*v).ok(),
            Value::I16(v) => u64::try_from(*v).ok(),
            Value::I32(v) => u64::try_from(*v).ok(),
            Value::I64(v) => u64::try_from(*v).ok(),
            _ => None,
        };
        number
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Self::wrong_type(key, value, "a non-negative integer"))
    }

    /// A non-negative integer that must be present.
    pub(crate) fn required_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize(key)?.ok_or_else(|| missing(key))
    }

    /// A token id, if present.
    pub(crate) fn token_id(&self, key: &str) -> Result<Option<u32>, ModelError> {
        self.usize(key)?
            .map(|id| {
                u32::try_from(id)
                    .map_err(|_| ModelError::InvalidConfig(format!("`{key}` = {id} is too large")))
            })
            .transpose()
    }

    /// A float (f32 or f64), if present.
    pub(crate) fn f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(other) => Err(Self::wrong_type(key, other, "a float")),
        }
    }

    /// A string, if present.
    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(Self::wrong_type(key, other, "a string")),
        }
    }

    /// The length of an array, if present.
    pub(crate) fn array_len(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items.len())),
            Some(other) => Err(Self::wrong_type(key, other, "an array")),
        }
    }
}

fn missing(key: &str) -> ModelError {
    ModelError::MissingMetadata {
        key: key.to_owned(),
    }
}

/// The architecture `general.architecture` names.
pub(crate) fn architecture(metadata: &Metadata<'_>) -> Result<Architecture, ModelError> {
    let key = "general.architecture";
    match metadata.str(key)?.ok_or_else(|| missing(key))? {
        "llama" => Ok(Architecture::Llama),
        "qwen2" => Ok(Architecture::Qwen2),
        "qwen3" => Ok(Architecture::Qwen3),
        "gemma3" => Ok(Architecture::Gemma3),
        other => Err(ModelError::UnsupportedArchitecture(other.to_owned())),
    }
}

/// The config the metadata and tensor directory describe. Per-dimension RoPE factors (a
/// `rope_freqs` tensor) are filled in by the caller once tensor data is read.
pub(crate) fn config_from_gguf(
    metadata: &Metadata<'_>,
    tensors: &[GgufTensorInfo],
) -> Result<ModelConfig, ModelError> {
    let architecture = architecture(metadata)?;
    let arch = architecture.name();
    let key = |suffix: &str| format!("{arch}.{suffix}");

    let hidden_size = metadata.required_usize(&key("embedding_length"))?;
    let num_attention_heads = metadata.required_usize(&key("attention.head_count"))?;
    let num_kv_heads = metadata
        .usize(&key("attention.head_count_kv"))?
        .unwrap_or(num_attention_heads);
    let head_dim = match metadata.usize(&key("attention.key_length"))? {
        Some(dim) => dim,
        None if num_attention_heads > 0 => hidden_size / num_attention_heads,
        None => 0,
    };
    check_full_rotary(metadata, &key("rope.dimension_count"), head_dim)?;
    if let Some(value_dim) = metadata.usize(&key("attention.value_length"))? {
        if value_dim != head_dim {
            return Err(ModelError::InvalidConfig(format!(
                "value head width {value_dim} differs from key head width {head_dim}"
            )));
        }
    }

    let find = |name: &str| tensors.iter().find(|t| t.name == name);
    // The embedding rows are the logits width; the tokenizer's list only stands in when the
    // embedding is absent (which later fails as a missing tensor anyway).
    let vocab_size = match find("token_embd.weight").and_then(|t| t.shape.first()) {
        Some(&rows) => rows,
        None => metadata
            .array_len("tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?,
    };
    if let Some(tokens) = metadata.array_len("tokenizer.ggml.tokens")? {
        if tokens > vocab_size {
            tracing::warn!(
                tokens,
                vocab_size,
                "tokenizer has more tokens than embeddings"
            );
        }
    }

    let num_layers = metadata.required_usize(&key("block_count"))?;
    let (sliding_window, attention_scale) = match architecture {
        Architecture::Gemma3 => gemma3_parts(
            metadata,
            num_layers,
            hidden_size,
            num_attention_heads,
            head_dim,
        )?,
        _ => (None, None),
    };
    let config = ModelConfig {
        sliding_window,
        attention_scale,
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: metadata.required_usize(&key("feed_forward_length"))?,
        num_layers,
        num_attention_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: metadata
            .f32(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| missing(&key("attention.layer_norm_rms_epsilon")))?,
        rope: RopeConfig {
            theta: metadata
                .f32(&key("rope.freq_base"))?
                .unwrap_or(DEFAULT_ROPE_THETA),
            style: match architecture {
                // llama.cpp permutes llama Q/K rows at conversion, making HF's half-split
                // rotation an adjacent-pair rotation on the stored weights; qwen2 and qwen3 are
                // not permuted. (GGUF has no `mistral` architecture: such files say `llama`.)
                Architecture::Llama | Architecture::Mistral => RopeStyle::Interleaved,
                Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Gemma3 => RopeStyle::Neox,
            },
            scaling: rope_scaling(metadata, arch)?,
        },
        max_position_embeddings: metadata.required_usize(&key("context_length"))?,
        tie_word_embeddings: find("output.weight").is_none(),
        attention_bias: find("blk.0.attn_q.bias").is_some(),
        bos_token_id: metadata.token_id("tokenizer.ggml.bos_token_id")?,
        eos_token_ids: eos_token_ids(metadata)?,
    };
    Ok(config)
}

/// Gemma-3's RoPE base of the sliding-window layers: llama.cpp does not store it (its loader
/// hard-codes the same value), the model card documents 10,000.
const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;
/// Every sixth Gemma-3 layer attends over the whole context (llama.cpp's `set_swa_pattern(6)`,
/// used when the file has no `gemma3.attention.sliding_window_pattern`).
const GEMMA3_SLIDING_WINDOW_PATTERN: usize = 6;
/// Gemma-3-27B's layer count: its softmax scale is `(hidden / heads)^-0.5` (HF's
/// `query_pre_attn_scalar` 168), every other size's `head_dim^-0.5` (256).
const GEMMA3_27B_LAYERS: usize = 62;

/// Gemma-3's window (layers `i` with `(i + 1) % 6 != 0`, local RoPE without scaling) and
/// softmax scale, as llama.cpp's loader derives them.
fn gemma3_parts(
    metadata: &Metadata<'_>,
    num_layers: usize,
    hidden_size: usize,
    num_heads: usize,
    head_dim: usize,
) -> Result<(Option<SlidingWindow>, Option<f32>), ModelError> {
    let window_key = "gemma3.attention.sliding_window";
    let tokens = metadata
        .usize(window_key)?
        .ok_or_else(|| missing(window_key))?;
    if tokens == 0 {
        return Err(ModelError::InvalidConfig(format!("{window_key} is 0")));
    }
    let pattern = metadata
        .usize("gemma3.attention.sliding_window_pattern")?
        .unwrap_or(GEMMA3_SLIDING_WINDOW_PATTERN)
        .max(1);
    let window = SlidingWindow {
        tokens,
        layers: (0..num_layers).map(|i| (i + 1) % pattern != 0).collect(),
        rope: Some(RopeConfig {
            theta: GEMMA3_LOCAL_ROPE_THETA,
            style: RopeStyle::Neox,
            scaling: None,
        }),
    };
    let scalar = if num_layers == GEMMA3_27B_LAYERS && num_heads > 0 {
        hidden_size / num_heads
    } else {
        head_dim
    };
    Ok((Some(window), Some((scalar as f32).powf(-0.5))))
}

/// Starling rotates whole heads; partial rotary models would be silently wrong.
fn check_full_rotary(
    metadata: &Metadata<'_>,
    key: &str,
    head_dim: usize,
) -> Result<(), ModelError> {
    match metadata.usize(key)? {
        Some(rotary_dim) if rotary_dim != head_dim => Err(ModelError::InvalidConfig(format!(
            "partial rotary embeddings ({key} = {rotary_dim}, head width {head_dim}) are not \
             supported"
        ))),
        _ => Ok(()),
    }
}

fn rope_scaling(metadata: &Metadata<'_>, arch: &str) -> Result<Option<RopeScaling>, ModelError> {
    let factor_key = format!("{arch}.rope.scaling.factor");
    let kind = metadata.str(&format!("{arch}.rope.scaling.type"))?;
    // Older converters wrote only `rope.scale_linear`.
    let legacy_linear = metadata.f32(&format!("{arch}.rope.scale_linear"))?;
    match (kind, legacy_linear) {
        (None | Some("none"), None) => Ok(None),
        (None | Some("none"), Some(factor)) => Ok(Some(RopeScaling::Linear { factor })),
        (Some("linear"), _) => {
            let factor = metadata
                .f32(&factor_key)?
                .or(legacy_linear)
                .ok_or_else(|| missing(&factor_key))?;
            Ok(Some(RopeScaling::Linear { factor }))
        }
        (Some(other), _) => Err(ModelError::InvalidConfig(format!(
            "rope scaling type `{other}` is not supported (supported: linear, llama3)"
        ))),
    }
}

/// The end-of-sequence id plus the end-of-turn/message ids some chat models add.
fn eos_token_ids(metadata: &Metadata<'_>) -> Result<Vec<u32>, ModelError> {
    let mut ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = metadata.token_id(key)? {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}
